"""Loads a folder `extrap export --format hf` wrote with transformers' own class and checks it:
its per-token log-probabilities for REFERENCE's tokens equal REFERENCE's (1e-5, relative, of at
least 1), and generate() runs. tests/hub/test_import.cpp runs it.

usage: check_hf_export.py DIR REFERENCE.safetensors

REFERENCE holds `tokens` (int64, T) and `logprobs` (float32, T - 1): log p(tokens[i+1] | tokens[:i+1]).
Prints "ok DIR (FAMILY): ..." or "FAILED: ..." (exit 1).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(folder, reference):
    ref = load_file(reference)
    tokens, expected = ref["tokens"].long().unsqueeze(0), ref["logprobs"].double()
    family = json.load(open(os.path.join(folder, "config.json")))["model_type"]
    # transformers' eager Falcon adds the ALiBi bias twice (tests/import/make_checkpoints.py): SDPA is right.
    attn = "sdpa" if family == "falcon" else "eager"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn).eval()
    with torch.inference_mode():
        logits = model(tokens).logits[0].double()
    got = logits.log_softmax(-1)[:-1].gather(1, tokens[0, 1:, None]).squeeze(1)
    error = ((got - expected).abs() / expected.abs().clamp(min=1.0)).max().item()
    if not error <= 1e-5:
        print(f"FAILED: {folder} ({family}): log-probabilities differ by {error:.2e} (allowed 1e-5)")
        return 1
    with torch.inference_mode():
        out = model.generate(tokens[:, :8], max_new_tokens=4, do_sample=False)
    if out.shape != (1, 12):
        print(f"FAILED: {folder}: generate() gave shape {tuple(out.shape)}")
        return 1
    tokenizer = ""
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained(folder)
        tokenizer = ", tokenizer loads"
    print(f"ok {folder} ({family}): {tokens.shape[1]} tokens within {error:.1e}, generate() runs{tokenizer}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
