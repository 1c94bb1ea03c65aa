#!/usr/bin/env python3
"""The comparison point for `extrap bench train`: the same model as a PyTorch 2 user writes it.

Reads the same YAML config (model, position, train shapes; --set key=value overrides), builds
the same pre-LayerNorm transformer (fused qkv, tied embeddings scaled by sqrt(d_model) and
initialised with std d_model^-0.5, GELU or ReLU FFN, dropout where the config has it) with
ALiBi, sinusoidal or no positions, trains it on random tokens with AdamW and gradient
clipping, and prints tokens/s and peak memory the way extrap does: same shapes, same threads,
fp32. Nothing is held back:
  * attention is F.scaled_dot_product_attention: `is_causal=True` without a bias, the ALiBi
    bias (with the causal mask folded in) as its float attn_mask otherwise, built once per
    length and reused, as a user caches it;
  * AdamW runs its fused implementation (`fused=True`, the fastest on the CPU);
  * `--compile` runs the model under torch.compile (Inductor, CPU), warm-up steps included
    before timing.

Run it with the project's environment (scripts/setup.sh makes it):
    .venv/bin/python benchmarks/train_pytorch.py --config configs/train_quick.yaml --steps 20
    .venv/bin/python benchmarks/train_pytorch.py --config configs/train_quick.yaml --compile
"""
import argparse
import math
import os
import resource
import statistics
import time

import inductor_cache  # noqa: F401  (before torch: Inductor's cache for this CPU capability)
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml


def alibi_slopes(n):
    """The ALiBi paper's slopes (../shared/REFERENCE.md), also for n not a power of two."""
    p = 2 ** int(math.floor(math.log2(n)))
    base = [2 ** (-8 * (h + 1) / p) for h in range(p)]
    extra = [2 ** (-8 * (k + 1) / (2 * p)) for k in range(2 * p)][0::2]
    return (base + extra)[:n]


class Block(nn.Module):
    def __init__(self, d, heads, ffn, activation, dropout, attention_dropout):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.ln_attention = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln_ffn = nn.LayerNorm(d)
        self.ffn_in = nn.Linear(d, ffn)
        self.ffn_out = nn.Linear(ffn, d)
        self.act = F.relu if activation == "relu" else F.gelu

    def forward(self, x, mask, causal):
        B, T, D = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln_attention(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                           is_causal=causal and mask is None)  # (B, H, T, Dh)
        y = F.dropout(self.out(y.transpose(1, 2).reshape(B, T, D)), self.dropout, self.training)
        h = x + y
        f = self.ffn_out(self.act(self.ffn_in(self.ln_ffn(h))))
        return h + F.dropout(f, self.dropout, self.training)


class LM(nn.Module):
    def __init__(self, vocab, m, position):
        super().__init__()
        self.d = m["d_model"]
        self.heads = m["heads"]
        self.position = position
        self.causal = m["objective"] == "causal_lm"
        self.embedding = nn.Embedding(vocab, self.d)
        nn.init.normal_(self.embedding.weight, 0.0, self.d ** -0.5)
        self.blocks = nn.ModuleList(
            Block(self.d, self.heads, m["d_ffn"], m["activation"], m["dropout"], m["attention_dropout"])
            for _ in range(m["layers"]))
        self.ln_final = nn.LayerNorm(self.d)
        self.dropout = m["dropout"]
        self.register_buffer("slopes", torch.tensor(alibi_slopes(self.heads)), persistent=False)
        self.mask_length = -1
        self.mask = None

    def attention_mask(self, T):
        """The (1, H, T, T) ALiBi bias, -inf above the diagonal when causal; None without one.

        Four dimensions, not three: given an (H, T, T) mask, PyTorch's CPU SDPA takes its math
        path (torch._fused_sdp_choice 0); given (1, H, T, T), its flash kernel (1), which is
        faster forward and backward."""
        if self.position != "alibi":
            return None
        if T != self.mask_length:
            i = torch.arange(T, device=self.slopes.device).view(T, 1)
            j = torch.arange(T, device=self.slopes.device).view(1, T)
            bias = -self.slopes.view(-1, 1, 1) * (i - j).abs()
            if self.causal:
                bias = bias.masked_fill(j > i, float("-inf"))
            self.mask, self.mask_length = bias.unsqueeze(0), T
        return self.mask

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.embedding(tokens) * math.sqrt(self.d)
        if self.position == "sinusoidal":
            pos = torch.arange(T, dtype=torch.float64, device=x.device).unsqueeze(1)
            inv = torch.exp(torch.arange(0, self.d // 2, dtype=torch.float64, device=x.device)
                            * (-2 * math.log(10000.0) / self.d))
            x = x + torch.stack([(pos * inv).sin(), (pos * inv).cos()], -1).flatten(1).float()
        x = F.dropout(x, self.dropout, self.training)
        mask = self.attention_mask(T)
        for block in self.blocks:
            x = block(x, mask, self.causal)
        return self.ln_final(x) @ self.embedding.weight.t()


def load_config(path, overrides):
    cfg = yaml.safe_load(open(path)) or {}
    for o in overrides:
        key, value = o.split("=", 1)
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(value)
    # extrap's defaults (core/model/config.h) for every key the model and the step read.
    model = dict(layers=4, d_model=256, heads=8, d_ffn=1024, activation="gelu", dropout=0.1,
                 attention_dropout=0.0, objective="causal_lm", tie_embeddings=True)
    model.update({k: v for k, v in cfg.get("model", {}).items() if k in model})
    if not model["tie_embeddings"]:
        raise SystemExit("train_pytorch.py implements tied embeddings only")
    train = dict(seq_len=256, batch_tokens=8192, accumulation=1, lr=1e-3, weight_decay=0.01, clip=1.0,
                 threads=0, seed=1, precision="fp32", device="cpu")
    train.update({k: v for k, v in cfg.get("train", {}).items() if k in train})
    position = cfg.get("position", "alibi")
    if isinstance(position, dict):
        position = position.get("name", "alibi")
    return model, train, position


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=257)
    ap.add_argument("--compile", action="store_true", help="run the model under torch.compile (Inductor)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="default: the config's train.device (cpu when unset); on cuda each step is "
                         "synchronised before its time is read and peak memory is the CUDA allocator's")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                    help="bf16: matrix products under torch.autocast (bfloat16), fp32 master weights; "
                         "default: the config's train.precision (fp32 when unset)")
    args = ap.parse_args()
    m, t, position = load_config(args.config, args.set)
    precision = args.precision or t["precision"]
    if position not in ("alibi", "sinusoidal", "none"):
        raise SystemExit(f"train_pytorch.py implements alibi, sinusoidal and none, not {position}")
    if m["objective"] != "causal_lm":
        raise SystemExit("train_pytorch.py implements the causal LM objective only")
    threads = t["threads"] or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(t["seed"])
    device = torch.device(args.device or t["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_pytorch.py: device cuda, but this PyTorch sees no CUDA device")
    model = LM(args.vocab, m, position).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], weight_decay=t["weight_decay"], fused=True)
    forward = torch.compile(model) if args.compile else model
    seqs = max(1, t["batch_tokens"] // t["seq_len"] // t["accumulation"])

    def step():
        opt.zero_grad()
        for _ in range(t["accumulation"]):
            tokens = torch.randint(0, args.vocab, (seqs, t["seq_len"] + 1), device=device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            (loss / t["accumulation"]).backward()
        if t["clip"] > 0:
            nn.utils.clip_grad_norm_(model.parameters(), t["clip"])
        opt.step()

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    for _ in range(max(args.warmup, 1)):
        step()
    synchronize()
    warmup_seconds = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    tokens = seqs * t["accumulation"] * t["seq_len"]
    params = sum(p.numel() for p in model.parameters())
    mode = "compiled (Inductor)" if args.compile else "eager"
    print(f"pytorch {torch.__version__} {mode}: {params} parameters, position {position}, "
          f"{seqs} sequences x {t['seq_len']} tokens x {t['accumulation']} accumulation, {threads} threads, "
          f"{precision}, device {device}" + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""))
    print(f"warm-up: {max(args.warmup, 1)} steps in {warmup_seconds:.1f} s (compilation included)")
    print(f"step time: median {median:.4f} s (min {min(times):.4f}, max {max(times):.4f}) over {args.steps} steps")
    print(f"tokens/s: {tokens / median:.0f}")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    if device.type == "cuda":
        print(f"peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
        # 6 x parameters a token (the tied embedding counted once) plus attention's two
        # products, 12 x layers x T x d_model a token, halved when causal: as extrap counts.
        per_token = 6 * params + 12 * m["layers"] * t["seq_len"] * m["d_model"] * 0.5
        print(f"model FLOPs: {per_token:.3g} a token, {per_token * tokens / median / 1e12:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
