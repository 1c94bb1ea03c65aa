#!/usr/bin/env python3
"""The comparison point for `extrap bench train`: the same model as a PyTorch 2 user writes it.

Reads the same YAML config (model, position, train shapes; --set key=value overrides), builds
the same pre-norm transformer (fused qkv, embeddings scaled by sqrt(d_model) and initialised
with std d_model^-0.5, tied or with an untied head, dropout where the config has it) with ALiBi,
sinusoidal, rotary or no positions, and the config's architecture (model.norm LayerNorm or
nn.RMSNorm, model.bias, model.ffn GELU/ReLU mlp or SwiGLU/GeGLU with Llama's width where
d_ffn is 0, model.kv_heads grouped-query attention, model.block sequential or parallel),
trains it on random tokens with AdamW and gradient clipping, and prints tokens/s and peak
memory the way extrap does: same shapes, same threads, fp32. Nothing is held back:
  * attention is F.scaled_dot_product_attention: `is_causal=True` without a bias, the ALiBi
    bias (with the causal mask folded in) as its float attn_mask otherwise, built once per
    length and reused, as a user caches it; grouped-query attention through its
    `enable_gqa=True` (no copy of k and v per query head); rotary with the half pairing
    (Hugging Face's rotate_half) or the interleaved one, its cos and sin cached per length;
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


def ffn_width(m):
    """The feed-forward width: d_ffn, or with d_ffn 0 4 d_model (mlp) or Llama's rule (2/3 of
    4 d_model rounded up to a multiple of ffn_multiple), as extrap's ModelConfig::ffn_width."""
    if m["d_ffn"] > 0:
        return m["d_ffn"]
    if m["ffn"] == "mlp":
        return 4 * m["d_model"]
    width = 2 * (4 * m["d_model"]) // 3
    return (width + m["ffn_multiple"] - 1) // m["ffn_multiple"] * m["ffn_multiple"]


def norm(m):
    if m["norm"] == "rmsnorm":
        if m["bias"]:
            raise SystemExit("train_pytorch.py: nn.RMSNorm has no bias; set model.bias false with rmsnorm")
        return nn.RMSNorm(m["d_model"], eps=m["norm_eps"])
    return nn.LayerNorm(m["d_model"], eps=m["norm_eps"], bias=m["bias"])


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, bias = m["d_model"], m["bias"]
        self.heads, self.kv_heads = m["heads"], m["kv_heads"] or m["heads"]
        self.d_head = d // self.heads
        self.dropout = m["dropout"]
        self.attention_dropout = m["attention_dropout"]
        self.parallel = m["block"] != "sequential"
        self.ln_attention = norm(m)
        self.qkv = nn.Linear(d, (self.heads + 2 * self.kv_heads) * self.d_head, bias=bias)
        self.out = nn.Linear(d, d, bias=bias)
        self.ln_ffn = norm(m) if m["block"] != "parallel_shared" else None
        self.gated = m["ffn"] != "mlp"
        width = ffn_width(m)
        self.ffn_in = nn.Linear(d, 2 * width if self.gated else width, bias=bias)
        self.ffn_out = nn.Linear(width, d, bias=bias)
        if m["ffn"] == "swiglu":
            self.act = F.silu
        else:
            self.act = F.relu if m["ffn"] == "mlp" and m["activation"] == "relu" else F.gelu

    def ffn(self, x):
        a = self.ffn_in(x)
        if self.gated:
            g, u = a.chunk(2, dim=-1)
            return self.ffn_out(self.act(g) * u)
        return self.ffn_out(self.act(a))

    def forward(self, x, mask, causal, rotate):
        B, T, D = x.shape
        H, Hkv, Dh = self.heads, self.kv_heads, self.d_head
        n1 = self.ln_attention(x)
        q, k, v = self.qkv(n1).view(B, T, H + 2 * Hkv, Dh).transpose(1, 2).split([H, Hkv, Hkv], dim=1)
        if rotate is not None:
            q, k = rotate(q), rotate(k)
        p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                           is_causal=causal and mask is None, enable_gqa=Hkv != H)  # (B, H, T, Dh)
        y = F.dropout(self.out(y.transpose(1, 2).reshape(B, T, D)), self.dropout, self.training)
        if self.parallel:  # x + attn(n1 x) + ffn(n2 x); one norm for both where ln_ffn is None
            f = self.ffn(n1 if self.ln_ffn is None else self.ln_ffn(x))
            return x + y + F.dropout(f, self.dropout, self.training)
        h = x + y
        return h + F.dropout(self.ffn(self.ln_ffn(h)), self.dropout, self.training)


class LM(nn.Module):
    def __init__(self, vocab, m, position, position_options):
        super().__init__()
        self.d = m["d_model"]
        self.heads = m["heads"]
        self.position = position
        self.options = position_options
        self.causal = m["objective"] == "causal_lm"
        self.embedding = nn.Embedding(vocab, self.d)
        nn.init.normal_(self.embedding.weight, 0.0, self.d ** -0.5)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.ln_final = norm(m)
        self.head = None if m["tie_embeddings"] else nn.Linear(self.d, vocab, bias=False)
        self.dropout = m["dropout"]
        self.register_buffer("slopes", torch.tensor(alibi_slopes(self.heads)), persistent=False)
        self.mask_length = -1
        self.mask = None
        self.rotation_length = -1
        self.rotation = None

    def rotary(self, T, device):
        """x -> x rotated by position, the tables cached per length: rotary's `fraction` of each head,
        its pairs (i, i + d/2) with pairing half (Hugging Face's rotate_half), else (2i, 2i+1)."""
        if self.position != "rotary":
            return None
        if T != self.rotation_length:
            d_head = self.d // self.heads
            d = 2 * math.floor(float(self.options.get("fraction", 1.0)) * d_head / 2 + 1e-9)
            base = float(self.options.get("base", 10000.0))
            theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
            angle = torch.arange(T, dtype=torch.float64, device=device)[:, None] * theta  # (T, d/2)
            cos, sin = angle.cos().float(), angle.sin().float()
            half = self.options.get("pairing", "interleaved") == "half"

            def rotate(x):
                r, rest = x[..., :d], x[..., d:]
                if half:
                    x1, x2 = r[..., :d // 2], r[..., d // 2:]
                    turned = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
                else:
                    x1, x2 = r[..., 0::2], r[..., 1::2]
                    turned = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
                return torch.cat((turned, rest), dim=-1) if rest.shape[-1] else turned

            self.rotation, self.rotation_length = rotate, T
        return self.rotation

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
        rotate = self.rotary(T, x.device)
        if self.position == "sinusoidal":
            pos = torch.arange(T, dtype=torch.float64, device=x.device).unsqueeze(1)
            inv = torch.exp(torch.arange(0, self.d // 2, dtype=torch.float64, device=x.device)
                            * (-2 * math.log(10000.0) / self.d))
            x = x + torch.stack([(pos * inv).sin(), (pos * inv).cos()], -1).flatten(1).float()
        x = F.dropout(x, self.dropout, self.training)
        mask = self.attention_mask(T)
        for block in self.blocks:
            x = block(x, mask, self.causal, rotate)
        return self.ln_final(x) @ (self.embedding.weight if self.head is None else self.head.weight).t()


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
    model = dict(layers=4, d_model=256, heads=8, kv_heads=0, d_ffn=1024, ffn_multiple=256, ffn="mlp",
                 activation="gelu", norm="layernorm", norm_eps=1e-5, bias=True, block="sequential",
                 qk_norm=False, embedding_norm=False, dropout=0.1, attention_dropout=0.0, objective="causal_lm",
                 tie_embeddings=True)
    model.update({k: v for k, v in cfg.get("model", {}).items() if k in model})
    for key in ("qk_norm", "embedding_norm"):
        if model[key]:
            raise SystemExit(f"train_pytorch.py does not implement model.{key}")
    train = dict(seq_len=256, batch_tokens=8192, accumulation=1, lr=1e-3, weight_decay=0.01, clip=1.0,
                 threads=0, seed=1, precision="fp32", device="cpu")
    train.update({k: v for k, v in cfg.get("train", {}).items() if k in train})
    position, options = cfg.get("position", "alibi"), {}
    if isinstance(position, dict):
        options = {k: v for k, v in position.items() if k != "name"}
        position = position.get("name", "alibi")
    return model, train, position, options


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
    m, t, position, options = load_config(args.config, args.set)
    precision = args.precision or t["precision"]
    if position not in ("alibi", "sinusoidal", "none", "rotary"):
        raise SystemExit(f"train_pytorch.py implements alibi, sinusoidal, rotary and none, not {position}")
    if m["objective"] != "causal_lm":
        raise SystemExit("train_pytorch.py implements the causal LM objective only")
    threads = t["threads"] or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(t["seed"])
    device = torch.device(args.device or t["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_pytorch.py: device cuda, but this PyTorch sees no CUDA device")
    model = LM(args.vocab, m, position, options).to(device)
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
