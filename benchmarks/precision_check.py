#!/usr/bin/env python3
"""Does train.precision bf16 change the quick sweep's perplexities beyond seed-to-seed noise?

Reads results files of configs/quick.yaml run in fp32 and in bf16 (several seeds each) and
prints, per method and evaluation length, the mean perplexity of each precision over its
seeds, the sample standard deviation across seeds in fp32 (the noise) and the difference of
the means in units of that noise. Run it with the project's environment:

    .venv/bin/python benchmarks/precision_check.py --fp32 A.h5 [B.h5 ...] --bf16 C.h5 [...]
"""
import argparse
import statistics
from collections import defaultdict

import h5py


def perplexities(paths):
    """{(position, eval_length): {seed: perplexity}} from the /summary rows marked ok."""
    out = defaultdict(dict)
    for path in paths:
        with h5py.File(path, "r") as f:
            for row in f["summary"][...]:
                if row["status"].decode() != "ok" or row["mode"].decode() != "nonoverlapping":
                    continue
                key = (row["position"].decode(), int(row["eval_length"]))
                out[key][int(row["seed"])] = float(row["perplexity"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp32", nargs="+", required=True)
    ap.add_argument("--bf16", nargs="+", required=True)
    args = ap.parse_args()
    fp32, bf16 = perplexities(args.fp32), perplexities(args.bf16)
    print("| method | eval length | fp32 mean | bf16 mean | fp32 seed sd | bf16 seed sd | (bf16 - fp32) / fp32 sd |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for key in sorted(fp32, key=lambda k: (k[0], k[1])):
        a, b = list(fp32[key].values()), list(bf16.get(key, {}).values())
        if len(a) < 2 or len(b) < 1:
            continue
        sd = statistics.stdev(a)
        sd_b = statistics.stdev(b) if len(b) > 1 else float("nan")
        delta = (statistics.mean(b) - statistics.mean(a)) / sd if sd > 0 else float("inf")
        worst = max(worst, abs(delta))
        print(f"| {key[0]} | {key[1]} | {statistics.mean(a):.3f} | {statistics.mean(b):.3f} | {sd:.3f} | "
              f"{sd_b:.3f} | {delta:+.2f} |")
    print(f"\nlargest |difference of means| in fp32 seed standard deviations: {worst:.2f}")


if __name__ == "__main__":
    main()
