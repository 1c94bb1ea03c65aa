#!/usr/bin/env python3
"""The comparison point for `extrap eval`: long-context evaluation of an exported ALiBi model as
a PyTorch 2 user writes it, eager, float32, under torch.inference_mode.

The weights come from analysis/extrap_model.py's loader (the reference for the export format);
the forward pass is written here around F.scaled_dot_product_attention, since the reference
model computes softmax(QK^T + bias) by hand. Two attention variants:
  * mask: the ALiBi bias with the causal mask folded in (-inf above the diagonal), materialised
    as one float attn_mask (1, H, T, T), built once per length and shared by every layer and
    window, as a user caches it. Its perplexity is the model's and must match extrap's. The
    mask is 4-D because SDPA on the CPU takes its math path, which holds (B, H, T, T) scores,
    for a 3-D (H, T, T) mask, and its flash kernel for a 4-D one.
  * none: no bias, is_causal=True: the speed ceiling of SDPA at this length. Its perplexity is
    not the model's (ALiBi without its bias) and is printed only for completeness.

Windows are non-overlapping, over the first --max-tokens tokens of the file (byte level: the
file's bytes), batched like extrap's eval.batch_tokens (max(1, batch_tokens / length) windows
a forward pass). The timed part is the forward passes and the loss; loading the model and
building the mask are not timed (the mask's build time is printed on its own line).

    .venv/bin/python benchmarks/eval_pytorch.py MODEL.safetensors --tokens-file data/pydoc/valid.txt \\
        --length 16384 --max-tokens 65537 --attention mask --threads 2

Prints "perplexity: P", "seconds: S" and "tokens/s: R" lines; with --attention mask and a mask
larger than --memory-budget-gb, prints "skipped: mask X GB > budget Y GB" and exits 0 without
allocating it. Errors: one line on stderr, exit status 2.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analysis"))
import extrap_model  # noqa: E402  (found through the path above)


def read_tokens(model, path, max_tokens):
    """The first max_tokens token ids of the file, tokenised as extrap tokenises the split."""
    if model.vocabulary is None:  # byte level: no need to read past what is scored
        with open(path, "rb") as f:
            ids = model.encode(f.read(max_tokens))
    else:
        with open(path, encoding="utf-8", newline="") as f:
            ids = model.encode(f.read())
    return torch.tensor(ids[:max_tokens], dtype=torch.long)


def alibi_mask(model, length):
    """(1, H, T, T) float32: -slope_h * (i - j) for keys j <= i, -inf for j > i."""
    position = torch.arange(length, dtype=torch.float32)
    distance = position[:, None] - position[None, :]  # i - j, exact in float32 below 2^24
    distance.masked_fill_(distance < 0, math.inf)  # times -slope: -inf on future keys
    mask = torch.empty(1, model.heads, length, length)
    for h, slope in enumerate(model.position.slopes.tolist()):
        torch.mul(distance, -slope, out=mask[0, h])
    return mask


def hidden(model, tokens, mask):
    """The final LayerNorm's output (B, T, D); mask None: causal attention without a bias."""
    B, T = tokens.shape
    H, Dh = model.heads, model.d_head
    x = model.embedding.weight[tokens] * math.sqrt(model.d_model)
    for block in model.blocks:
        qkv = block.attention.qkv(block.ln_attention(x)).view(B, T, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, Dh)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + block.attention.out(y.transpose(1, 2).reshape(B, T, H * Dh))
        x = x + block.ffn_out(model.act(block.ffn_in(block.ln_ffn(x))))
    return model.ln_final(x)


def evaluate(model, tokens, length, batch_tokens, mask):
    """(summed NLL in float64, scored tokens) over non-overlapping windows of length."""
    inputs, targets = tokens[:-1], tokens[1:]  # input position p predicts token p + 1
    windows = [(b, min(length, inputs.numel() - b)) for b in range(0, inputs.numel(), length)]
    per_pass = max(1, batch_tokens // length)
    nll_sum, scored = 0.0, 0
    for first in range(0, len(windows), per_pass):
        group = windows[first:first + per_pass]
        for size in sorted({s for _, s in group}):  # a short last window goes on its own
            begins = torch.tensor([b for b, s in group if s == size])
            index = begins[:, None] + torch.arange(size)  # (W, size)
            window_mask = mask if mask is None or size == length else mask[..., :size, :size]
            logits = model.logits(hidden(model, inputs[index], window_mask))
            nll = F.cross_entropy(logits.flatten(0, 1), targets[index].flatten(), reduction="none")
            nll_sum += nll.double().sum().item()
            scored += index.numel()
    return nll_sum, scored


def run(args):
    torch.set_num_threads(args.threads)
    model = extrap_model.load(args.model)
    if model.method != "alibi" or not model.causal:
        raise ValueError(f"{args.model}: a causal ALiBi model is needed, not position "
                         f"{model.method!r} (causal {model.causal})")
    tokens = read_tokens(model, args.tokens_file, args.max_tokens)
    extrap_model.check_length(model, tokens.numel(), args.length)
    print(f"pytorch {torch.__version__} sdpa-{args.attention}: length {args.length}, "
          f"{tokens.numel()} tokens, {max(1, args.batch_tokens // args.length)} windows a pass, "
          f"{torch.get_num_threads()} threads")
    with torch.inference_mode():
        mask = None
        if args.attention == "mask":
            gb = model.heads * args.length ** 2 * 4 / 1e9  # the float32 mask
            if gb > args.memory_budget_gb:
                print(f"skipped: mask {gb:.1f} GB > budget {args.memory_budget_gb:g} GB")
                return
            start = time.perf_counter()
            mask = alibi_mask(model, args.length)
            print(f"mask: {gb:.2f} GB built in {time.perf_counter() - start:.2f} s (not timed)")
        start = time.perf_counter()
        nll_sum, scored = evaluate(model, tokens, args.length, args.batch_tokens, mask)
        seconds = time.perf_counter() - start
    print(f"scored tokens: {scored}")
    print(f"perplexity: {math.exp(nll_sum / scored)!r}")
    print(f"seconds: {seconds:.4f}")
    print(f"tokens/s: {scored / seconds:.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="MODEL.safetensors written by `extrap export`")
    parser.add_argument("--tokens-file", required=True, help="the split's text (valid.txt)")
    parser.add_argument("--length", type=int, required=True, help="window length")
    parser.add_argument("--max-tokens", type=int, required=True,
                        help="evaluate the first N tokens, as extrap eval --max-tokens")
    parser.add_argument("--attention", choices=("mask", "none"), required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batch-tokens", type=int, default=16384,
                        help="tokens a forward pass, as extrap's eval.batch_tokens")
    parser.add_argument("--memory-budget-gb", type=float, default=12.0,
                        help="skip --attention mask where the mask alone exceeds this")
    args = parser.parse_args()
    try:
        run(args)
    except Exception as e:  # noqa: BLE001  (a benchmark's command line: one line, no traceback)
        print(f"eval_pytorch.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
