"""Loads folders `extrap export --format hf` wrote and checks each with transformers: a family's
own class, or the folder's remote code (model_type "extrap", trust_remote_code=True). Its per-token
log-probabilities for REFERENCE's tokens equal REFERENCE's (1e-5, relative, of at least 1); a
causal model's generate() continues the text greedily exactly as its own logits pick, token by
token; its tokenizer loads (AutoTokenizer), and with --text TEXT_FILE and `text_ids` in REFERENCE
it encodes the file to exactly those ids (where they are the file's UTF-8 bytes, it also decodes
them back to the text). tests/hub/test_import.cpp runs it.

usage: check_hf_export.py [--text TEXT_FILE] DIR REFERENCE.safetensors [DIR REFERENCE ...]

REFERENCE holds `tokens` (int64, T) and `logprobs` (float32): a causal LM's T - 1 values
log p(tokens[i+1] | tokens[:i+1]); a masked LM's T values log p(tokens[i] | tokens), nothing masked;
optionally `text_ids` (int64): extrap's ids of TEXT_FILE.
Prints "ok DIR (FAMILY): ..." per folder, or "FAILED: ..." (exit 1).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer


def check(folder, reference, text_file):
    ref = load_file(reference)
    tokens, expected = ref["tokens"].long().unsqueeze(0), ref["logprobs"].double()
    config = json.load(open(os.path.join(folder, "config.json")))
    family = config["model_type"]
    remote = family == "extrap"
    masked = config["architectures"] == ["ExtrapForMaskedLM"]
    # transformers' eager Falcon adds the ALiBi bias twice (tests/import/make_checkpoints.py): SDPA is right.
    kwargs = {"trust_remote_code": True} if remote else {"attn_implementation": "sdpa" if family == "falcon" else "eager"}
    auto = AutoModelForMaskedLM if masked else AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
    with torch.inference_mode():
        logprobs = model(tokens).logits[0].double().log_softmax(-1)
    if masked:
        got = logprobs.gather(1, tokens[0, :, None]).squeeze(1)
    else:
        got = logprobs[:-1].gather(1, tokens[0, 1:, None]).squeeze(1)
    if got.shape != expected.shape:
        return f"FAILED: {folder} ({family}): {tuple(got.shape)} log-probabilities, the reference has {tuple(expected.shape)}"
    error = ((got - expected).abs() / expected.abs().clamp(min=1.0)).max().item()
    if not error <= 1e-5:
        return f"FAILED: {folder} ({family}): log-probabilities differ by {error:.2e} (allowed 1e-5)"
    done = [f"{tokens.shape[1]} tokens within {error:.1e}"]
    if not masked:
        prompt = tokens[:, :8]
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=6, do_sample=False)
            greedy = prompt
            for _ in range(6):  # the whole sequence each step: what the model's own logits pick
                greedy = torch.cat([greedy, model(greedy).logits[:, -1:].argmax(-1)], dim=1)
        if not torch.equal(out, greedy):
            return f"FAILED: {folder} ({family}): generate() gave {out.tolist()}, greedy decoding {greedy.tolist()}"
        done.append("generate() is greedy decoding")
    if os.path.exists(os.path.join(folder, "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        done.append(f"tokenizer loads ({type(tokenizer).__name__})")
        if text_file and "text_ids" in ref:
            text = open(text_file, encoding="utf-8", newline="").read()
            ids, want = tokenizer(text)["input_ids"], ref["text_ids"].tolist()
            if ids != want:
                first = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
                return (f"FAILED: {folder}: the tokenizer's {len(ids)} ids of {text_file} are not extrap's {len(want)} "
                        f"(first difference at {first})")
            if want == list(text.encode("utf-8")) and tokenizer.decode(ids) != text:
                return f"FAILED: {folder}: the tokenizer does not decode its ids back to the text"
            done.append(f"its ids of {len(text)} characters are extrap's")
    return f"ok {folder} ({family}{', remote code' if remote else ''}): " + ", ".join(done)


def main(argv):
    text_file = None
    if argv[:1] == ["--text"]:
        text_file, argv = argv[1], argv[2:]
    if not argv or len(argv) % 2:
        sys.exit(__doc__)
    failed = False
    for folder, reference in zip(argv[::2], argv[1::2]):
        line = check(folder, reference, text_file)
        print(line, flush=True)
        failed |= line.startswith("FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
