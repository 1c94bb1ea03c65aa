"""Checks analysis/extrap_model.py against `extrap eval` (tests/export/test_export.cpp runs it).

usage: check_export.py MODEL.safetensors EVAL.json TOKENS.txt LOGITS.safetensors [...]

For each model: the safetensors package and the module's own reader give identical tensors;
the model's logits for LOGITS' tokens equal extrap's (float32) within 2e-5 + 1e-5 relative (with
an adaptive softmax, model.adaptive_cutoffs, both are the log-probabilities of every word);
then every row of EVAL.json (written by `extrap eval --json`) is recomputed in float64 from
TOKENS.txt (its first max_tokens tokens): the same scored-token count, and the summed NLL and
perplexity within 1e-5 relative. A perplexity averages small differences away, the logits of
one window do not: a tiny model barely trained uses position information weakly, so a wrong
position detail can move its perplexity by less than 1e-5 but moves some logit by far more.
Prints "ok MODEL" per model; exits 1 at the first mismatch.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
import extrap_model  # noqa: E402

TOLERANCE = 1e-5  # perplexity and NLL sum, relative (measured: about 1e-7)
LOGIT_ATOL, LOGIT_RTOL = 2e-5, 1e-5  # extrap's float32 logits against float64 (measured: ~1e-6)


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def check(model_path, eval_path, tokens_path, logits_path):
    package = extrap_model.load(model_path, torch.float64, use_package=True)
    fallback = extrap_model.load(model_path, torch.float64, use_package=False)
    a, b = package.state_dict(), fallback.state_dict()
    if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
        fail(f"{model_path}: the two readers disagree")
    model = package
    reference, _ = extrap_model.read_safetensors(logits_path)
    with torch.no_grad():
        logits = model(reference["tokens"])
    difference = (logits - reference["logits"].double()).abs()
    allowed = LOGIT_ATOL + LOGIT_RTOL * reference["logits"].double().abs()
    if not bool((difference <= allowed).all()):
        worst = int((difference - allowed).argmax())
        fail(f"{model_path} ({model.metadata['position']}): logits differ from extrap's by up to "
             f"{difference.max().item():.3e} (at flat index {worst})")
    print(f"  {model_path}: logits within {difference.max().item():.1e} of extrap's")
    with open(eval_path) as f:
        expected = json.load(f)
    tokens = extrap_model.tokens_of_file(model, tokens_path)
    if expected["max_tokens"] > 0:
        tokens = tokens[:expected["max_tokens"]]
    rows = expected["results"]
    if len(rows) < 4:
        fail(f"{eval_path}: expected two lengths, non-overlapping and sliding; got {len(rows)} rows")
    for row in rows:
        if row["status"] != "ok":
            fail(f"{eval_path}: extrap failed at length {row['length']}: {row['error']}")
        got = extrap_model.evaluate(model, tokens, row["length"], row["stride"])
        where = f"{model_path} ({model.metadata['position']}) L={row['length']} S={row['stride']}"
        if row["rope_scaling"] == "none" and row["rope_factor"] is not None:
            fail(f"{where}: rope_factor {row['rope_factor']!r} for an evaluation without RoPE scaling")
        if got["scored_tokens"] != row["scored_tokens"]:
            fail(f"{where}: scored {got['scored_tokens']} tokens, extrap {row['scored_tokens']}")
        for key in ("nll_sum", "perplexity"):
            relative = abs(got[key] - row[key]) / abs(row[key])
            if not relative <= TOLERANCE:
                fail(f"{where}: {key} {got[key]!r}, extrap {row[key]!r} (relative {relative:.2e})")
        print(f"  {where}: perplexity {got['perplexity']:.6f} vs extrap {row['perplexity']:.6f}")
    print(f"ok {model_path}")


def main(argv):
    if len(argv) % 4 != 0 or not argv:
        fail(__doc__)
    for i in range(0, len(argv), 4):
        check(*argv[i:i + 4])


if __name__ == "__main__":
    main(sys.argv[1:])
