#!/usr/bin/env python3
"""PyTorch baselines for extrap's fused CUDA attention (ALiBi bias computed in the kernel).

Times one attention call, forward and forward+backward, with CUDA events (median of
--repeats calls after --warmup calls) and measures its peak device memory (the caching
allocator's peak of allocated bytes during one untimed call), for

  flex-alibi          FlexAttention under torch.compile; the ALiBi bias is a score_mod reading
                      a per-head slopes tensor, causal masking is a block mask (fully masked
                      tiles are skipped)
  flex-alibi-learned  the same with the slopes a leaf tensor that requires grad:
                      forward+backward also computes d(loss)/d(slopes) (learned ALiBi slopes)
  flex-offsets        FlexAttention with a score_mod reading a learned per-head table of the
                      offsets j - i (T5's kind of bias, what `extrap bench attention --impls
                      offsets` times), the table's gradient included
  sdpa-flash          F.scaled_dot_product_attention WITHOUT a bias (is_causal for causal) on
  sdpa-cudnn          each fused backend in turn (--impls sdpa runs all three); a backend that
  sdpa-efficient      refuses the shape is reported "unavailable". PyTorch's no-bias floor:
                      what ALiBi costs is the distance from it
  sdpa-bias           F.scaled_dot_product_attention with the ALiBi bias materialised as a
                      (1, H, T, T) bf16 attn_mask (causal mask folded in as -inf), built
                      untimed; the generic way to add a bias to SDPA. The mask is computed in
                      float32 and rounded once to bf16 (SDPA wants the query's dtype), so its
                      far entries are coarse: at T = 16384 the smallest slope's bias reaches
                      -64, where bf16 steps by 0.25

at a constant number of tokens per batch (B = max(1, tokens // T)), causal ALiBi
(-slope * (i - j) for j <= i) and bidirectional symmetric ALiBi (-slope * |i - j|). Inputs,
FLOP counts and the JSON-lines schema are those of the C++ benchmark
(experiments/bench/bench_fused_attention.cpp, `extrap bench attention --device cuda`), so
the two files can be read together: forward FLOPs 4 B H T^2 D, halved when causal;
forward+backward counts 3.5 forwards. Peak memory includes the live inputs (q, k, v, dout)
and whatever the implementation keeps between calls (the materialised bias, the block mask).

Before an implementation is timed at a shape, its forward output is compared with a float32
reference computed with plain math (q k^T * scale + bias, softmax, @ v) -- at the first
length and at every T <= 2048 -- and ||out - ref|| / ||ref|| is recorded as max_rel_err;
above 2e-2 the case is reported "wrong (...)" and not timed. The sdpa-<backend> cases have
no bias, so their reference has none either.

Run it on a machine with a CUDA GPU (PyTorch >= 2.5 for FlexAttention):

    python3 benchmarks/attention_pytorch.py --out benchmarks/results/attention_pytorch.jsonl
    python3 benchmarks/attention_pytorch.py --causal --head-dims 128 --impls flex-alibi,sdpa

Each FlexAttention shape and pass is compiled on its first call (untimed, but it takes tens of
seconds per shape); Inductor's on-disk caches make a second run on the same machine faster.
A case that runs out of memory is reported "out of memory" and skipped at longer lengths.
"""
import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
import statistics
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import inductor_cache  # noqa: F401  (before torch: Inductor's cache for this CPU capability)
import torch
import torch.nn.functional as F

IMPLS = ("flex-alibi", "flex-alibi-learned", "flex-offsets", "sdpa", "sdpa-bias")
# --impls sdpa expands to one case per fused SDPA backend: (reported impl, SDPBackend name).
SDPA_BACKENDS = (
    ("sdpa-flash", "FLASH_ATTENTION"),
    ("sdpa-cudnn", "CUDNN_ATTENTION"),
    ("sdpa-efficient", "EFFICIENT_ATTENTION"),
)
PASSES = ("forward", "forward+backward")
DTYPE, DTYPE_NAME = torch.bfloat16, "bf16"
REL_ERR_LIMIT = 2e-2       # above this a forward output is "wrong" and not timed
CHECK_MAX_LENGTH = 2048    # outputs are checked at the first length and at T <= this
OUT_OF_MEMORY = "out of memory"
SKIPPED_OOM = "skipped (out of memory at a shorter length)"
# What SDPA raises when every backend allowed (here: one) refuses the inputs (CUDA; CPU).
SDPA_REFUSALS = ("No available kernel", "No viable backend")


# ---------------------------------------------------------------------------------------------
# Pure functions: slopes, FLOPs, the bias, the score_mod, the reference. Device-agnostic, so a
# CPU self-check can test them.
# ---------------------------------------------------------------------------------------------

def alibi_slopes(num_heads: int) -> list:
    """ALiBi's fixed per-head slopes (Press et al., 2022), as the C++ positions/alibi_slopes.

    n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the slopes of the largest
    power of two p < n, followed by slopes 0, 2, 4, ... of the 2p-head sequence until there
    are n. Each slope is computed from its own exponent, in double precision.
    """
    if num_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {num_heads}")

    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    p = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    return geometric(p) + geometric(2 * p)[0::2][: num_heads - p]


def forward_flops(batch: int, heads: int, length: int, head_dim: int, causal: bool) -> float:
    """4 B H T^2 D (two matmuls of 2 B H T^2 D each), halved when causal."""
    return 4.0 * batch * heads * float(length) * length * head_dim / (2 if causal else 1)


def pass_flops(forward: float, pass_name: str) -> float:
    """The backward pass counts 2.5 forwards, so forward+backward counts 3.5."""
    return forward * (1.0 if pass_name == "forward" else 3.5)


def alibi_bias_head(slope: Optional[torch.Tensor], length: int, causal: bool,
                    device=None) -> torch.Tensor:
    """One head's (T, T) float32 additive bias: -slope * |i - j| (query i, key j), and -inf
    above the diagonal when causal. slope None: the causal mask alone (zeros otherwise).

    The distances are exact in float32 up to T = 2^24. Differentiable in `slope`.
    """
    pos = torch.arange(length, device=device, dtype=torch.float32)
    distance = pos.view(-1, 1) - pos.view(1, -1)                      # i - j: (T, T)
    if slope is None:
        bias = torch.zeros(length, length, device=device, dtype=torch.float32)
    else:
        bias = -slope.to(device=device, dtype=torch.float32) * distance.abs()
    if causal:
        bias = bias.masked_fill(distance < 0, -math.inf)               # key after query
    return bias


def materialise_alibi(slopes: torch.Tensor, length: int, causal: bool,
                      dtype: torch.dtype = DTYPE) -> torch.Tensor:
    """The (1, H, T, T) ALiBi attn_mask for SDPA in `dtype`, causal mask folded in.

    Built one head at a time in float32 (exact distances) and rounded once, so the float32
    temporary is (T, T), not (H, T, T): 1 GiB rather than 16 GiB at T = 16384.
    """
    heads = slopes.numel()
    out = torch.empty(1, heads, length, length, device=slopes.device, dtype=dtype)
    for h in range(heads):
        out[0, h].copy_(alibi_bias_head(slopes[h], length, causal, slopes.device))
    return out


def alibi_score_mod(slopes: torch.Tensor, causal: bool):
    """FlexAttention score_mod adding ALiBi from `slopes` (H,), float32, captured by closure.

    Causal: score + slope * (kv - q), i.e. -slope * (i - j) on the allowed j <= i (the block
    mask removes j > i). Bidirectional: score - slope * |q - kv|.
    """
    if causal:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)
    else:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx).abs()
    return score_mod


def offsets_score_mod(table: torch.Tensor, length: int):
    """FlexAttention score_mod adding table[h, (j - i) + length - 1]: a bias of the offset alone."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx - q_idx + length - 1]
    return score_mod


def offsets_table(heads: int, length: int, device) -> torch.Tensor:
    """A fixed (H, 2T - 1) float32 table of offsets j - i = -(T - 1) .. T - 1, seeded by T."""
    generator = torch.Generator().manual_seed(length)
    return (torch.randn(heads, 2 * length - 1, generator=generator) * 0.5).to(device)


def causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention mask_mod: query i sees keys j <= i."""
    return q_idx >= kv_idx


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        slopes: Optional[torch.Tensor], causal: bool,
                        score_budget_bytes: int = 1 << 30,
                        table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Plain-math float32 attention: softmax(q k^T / sqrt(D) + bias) v; (B, H, T, D) float32.

    bias: ALiBi from `slopes` (None: the causal mask alone), or table[h, (j - i) + T - 1] when
    `table` is given. Computed one head and a few batch rows at a time so the float32 scores stay
    near `score_budget_bytes` at any T.
    """
    batch, heads, length, head_dim = q.shape
    scale = head_dim ** -0.5
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    rows = max(1, score_budget_bytes // (4 * length * length))        # batch rows per chunk
    for h in range(heads):
        bias = alibi_bias_head(None if slopes is None else slopes[h], length, causal, q.device)
        if table is not None:
            pos = torch.arange(length, device=q.device)
            bias = bias + table[h].to(q.device)[pos.view(1, -1) - pos.view(-1, 1) + length - 1]
        for b0 in range(0, batch, rows):
            b1 = min(batch, b0 + rows)
            qh, kh, vh = (t[b0:b1, h].float() for t in (q, k, v))    # (b, T, D)
            scores = qh @ kh.transpose(-1, -2) * scale + bias
            out[b0:b1, h] = torch.softmax(scores, dim=-1) @ vh
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius norms, in float32)."""
    return ((out.float() - ref).norm() / ref.norm()).item()


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def time_call(call: Callable[[], None], warmup: int, repeats: int, prime: bool = False):
    """(median ms, peak bytes) of `call`, as the C++ bench's time_call.

    One untimed call for the memory peak, `warmup` calls, then `repeats` calls each between two
    CUDA events on the current stream; the median of their times. prime: one more call before
    the peak, for a compiled function whose first call compiles (and may allocate for it).
    """
    if prime:
        call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    for _ in range(warmup):
        call()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, stop in zip(starts, stops):
        start.record()
        call()
        stop.record()
    stops[-1].synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops)), peak


# ---------------------------------------------------------------------------------------------
# Shapes and implementations
# ---------------------------------------------------------------------------------------------

@dataclass
class Shape:
    """One shape the implementations run at, with what they share built lazily and untimed."""
    mode: str                      # "causal" or "bidirectional"
    causal: bool
    head_dim: int
    length: int
    batch: int
    heads: int
    check: bool                    # compare forward outputs with the float32 reference?
    slopes: torch.Tensor           # (H,) float32 on the device
    q: torch.Tensor                # (B, H, T, D)
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    forward_flops: float
    _cache: dict = field(default_factory=dict)

    def cached(self, key: str, build: Callable[[], object]):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def reference(self, alibi) -> torch.Tensor:
        """The float32 reference output: with the ALiBi bias (True), the causal mask alone
        (False) or the offsets table ("offsets").

        Computed on the GPU, kept on the host: held on the device it would add B H T D floats
        to the peak memory of every case measured after it.
        """
        with torch.no_grad():
            if alibi == "offsets":
                return self.cached("reference-offsets", lambda: reference_attention(
                    self.q, self.k, self.v, None, self.causal,
                    table=offsets_table(self.heads, self.length, self.q.device)).cpu())
            return self.cached(f"reference-{alibi}", lambda: reference_attention(
                self.q, self.k, self.v, self.slopes if alibi else None, self.causal).cpu())

    def block_mask(self):
        """FlexAttention's causal block mask for this length (None when bidirectional)."""
        if not self.causal:
            return None
        from torch.nn.attention.flex_attention import create_block_mask
        return self.cached("block_mask", lambda: create_block_mask(
            causal_mask_mod, B=None, H=None, Q_LEN=self.length, KV_LEN=self.length,
            device=self.q.device))

    def release(self):
        self._cache.clear()


def make_shape(args, causal: bool, head_dim: int, length: int, check: bool,
               slopes: torch.Tensor) -> Shape:
    """Random (B, H, T, D) inputs seeded by length and head dimension, as the C++ bench."""
    batch = max(1, args.tokens // length)
    torch.manual_seed(length * 131 + head_dim)
    draw = lambda: torch.randn(batch, args.heads, length, head_dim, device="cuda", dtype=DTYPE)
    q, k, v, dout = draw(), draw(), draw(), draw()
    return Shape(mode="causal" if causal else "bidirectional", causal=causal, head_dim=head_dim,
                 length=length, batch=batch, heads=args.heads, check=check, slopes=slopes,
                 q=q, k=k, v=v, dout=dout,
                 forward_flops=forward_flops(batch, args.heads, length, head_dim, causal))


@dataclass
class Case:
    """One reported implementation at one shape.

    build() makes what the implementation needs (untimed: block mask, materialised bias) and
    returns its attention call fn(q, k, v) -> (B, H, T, D).
    """
    impl: str
    build: Callable[[], Callable]
    alibi: object = True          # reference with ALiBi (True), without (False), or "offsets"
    context: Callable[[], object] = contextlib.nullcontext  # entered around check and timing
    extra_grads: tuple = ()         # leaves besides q, k, v whose gradients fwd+bwd asks for
    compiled: bool = False          # first call compiles: prime before the memory peak
    unavailable: Optional[str] = None  # a reason not to run it at all


_compiled_flex = None


def compiled_flex_attention():
    """flex_attention under torch.compile, compiled once (each shape and pass specialises it).

    Dynamo keeps one cache per code object and by default falls back to eager -- the slow,
    unfused path -- after 8 recompilations; this benchmark compiles once per shape, mode and
    pass, so the limit is raised (and main() resets Dynamo between shapes).
    """
    global _compiled_flex
    if _compiled_flex is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention
        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # the newer and the older name
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 1024))
        for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 4096))
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_case(shape: Shape, learned: bool) -> Case:
    slopes = shape.slopes.detach().clone().requires_grad_(True) if learned else shape.slopes

    def build():
        flex = compiled_flex_attention()
        score_mod = alibi_score_mod(slopes, shape.causal)
        block_mask = shape.block_mask()
        return lambda q, k, v: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

    return Case("flex-alibi-learned" if learned else "flex-alibi", build,
                extra_grads=(slopes,) if learned else (), compiled=True)


def flex_offsets_case(shape: Shape) -> Case:
    table = offsets_table(shape.heads, shape.length, shape.q.device).requires_grad_(True)

    def build():
        flex = compiled_flex_attention()
        score_mod = offsets_score_mod(table, shape.length)
        block_mask = shape.block_mask()
        return lambda q, k, v: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

    return Case("flex-offsets", build, alibi="offsets", extra_grads=(table,), compiled=True)


def sdpa_cases(shape: Shape) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cases = []
    for impl, backend_name in SDPA_BACKENDS:
        backend = getattr(SDPBackend, backend_name, None)
        build = lambda: (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal))
        cases.append(Case(impl, build, alibi=False,
                          context=(lambda b=backend: sdpa_kernel([b])),
                          unavailable=None if backend is not None
                          else f"unavailable (no SDPBackend.{backend_name} in torch {torch.__version__})"))
    return cases


def sdpa_bias_case(shape: Shape) -> Case:
    def build():
        # Held by the returned call alone, so freed with it when the case is done (as the C++
        # bench, which builds it per implementation); 8.6 GB at T = 16384, H = 16.
        mask = materialise_alibi(shape.slopes, shape.length, shape.causal, shape.q.dtype)
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return Case("sdpa-bias", build)


def cases_for(impl: str, shape: Shape) -> list:
    if impl == "flex-alibi":
        return [flex_case(shape, learned=False)]
    if impl == "flex-alibi-learned":
        return [flex_case(shape, learned=True)]
    if impl == "flex-offsets":
        return [flex_offsets_case(shape)]
    if impl == "sdpa":
        return sdpa_cases(shape)
    return [sdpa_bias_case(shape)]


# ---------------------------------------------------------------------------------------------
# Running one case
# ---------------------------------------------------------------------------------------------

def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}".strip().rstrip(":")
    return text if len(text) <= 200 else text[:197] + "..."


def is_out_of_memory(error: BaseException) -> bool:
    # The caching allocator raises OutOfMemoryError; cuDNN, cuBLAS and Triton allocation
    # failures surface as RuntimeErrors that say so.
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def attempt(action: Callable[[], object]):
    """(result, None), or (None, status) for an exception: "out of memory", "unavailable (why)"
    where SDPA found no kernel in the one backend allowed (its warnings say why), otherwise
    "error: <one line>". Warnings are shown as usual unless they explain such a refusal."""
    result, status, refused = None, None, False
    with warnings.catch_warnings(record=True) as caught:
        try:
            result = action()
        except Exception as error:  # noqa: BLE001 -- a benchmark reports and goes on
            if is_out_of_memory(error):
                status = OUT_OF_MEMORY
            elif any(text in str(error) for text in SDPA_REFUSALS):
                refused = True
                # SDPA warns "<backend> kernel not used because:", then once per reason.
                reasons = []
                for w in caught:
                    lines = str(w.message).strip().splitlines()
                    if lines and not lines[0].endswith("because:") and lines[0] not in reasons:
                        reasons.append(lines[0])
                why = "; ".join(reasons) or one_line(error)
                status = f"unavailable ({why if len(why) <= 200 else why[:197] + '...'})"
            else:
                status = f"error: {one_line(error)}"
    if not refused:  # re-emit what was caught, outside catch_warnings, once each
        shown = set()
        for w in caught:
            if (str(w.message), w.category) not in shown:
                shown.add((str(w.message), w.category))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result, status


def make_pass_call(fn: Callable, pass_name: str, shape: Shape, extra_grads: tuple):
    """The call timed for a pass: the forward alone under no_grad, or forward and backward to
    the gradients of q, k, v (and of extra_grads) with autograd.grad."""
    if pass_name == "forward":
        q, k, v = shape.q, shape.k, shape.v

        def forward():
            with torch.no_grad():
                fn(q, k, v)
        return forward

    q, k, v = (t.detach().requires_grad_(True) for t in (shape.q, shape.k, shape.v))
    inputs = (q, k, v) + tuple(extra_grads)

    def forward_backward():
        torch.autograd.grad(fn(q, k, v), inputs, shape.dout)
    return forward_backward


@dataclass
class Measurement:
    status: str = "ok"
    ms: Optional[float] = None
    peak_bytes: Optional[int] = None
    rel_err: Optional[float] = None


def run_case(case: Case, shape: Shape, passes: list, args, out_of_memory: set) -> dict:
    """{pass: Measurement} for one case at one shape: build, check, then time each pass."""
    keys = {p: f"{case.impl}|{shape.mode}|{shape.head_dim}|{p}" for p in passes}
    todo = [p for p in passes if keys[p] not in out_of_memory]
    results = {p: Measurement(status=SKIPPED_OOM) for p in passes if p not in todo}
    if case.unavailable or not todo:
        results.update({p: Measurement(status=case.unavailable) for p in todo})
        return results

    def fail_all(status, rel_err=None):
        for p in todo:
            results[p] = Measurement(status=status, rel_err=rel_err)
            if status == OUT_OF_MEMORY:
                out_of_memory.add(keys[p])
        return results

    fn, status = attempt(case.build)
    if status:
        return fail_all(status)

    rel_err = None
    if shape.check:
        def check():
            with case.context(), torch.no_grad():
                out = fn(shape.q, shape.k, shape.v)
            return relative_error(out.cpu(), shape.reference(case.alibi))
        rel_err, status = attempt(check)
        torch.cuda.empty_cache()
        if status:
            return fail_all(status)
        if not rel_err <= REL_ERR_LIMIT:  # NaN is wrong too
            return fail_all(f"wrong (rel err {rel_err:.3g})", rel_err)

    for p in todo:
        def timed():
            with case.context():
                return time_call(make_pass_call(fn, p, shape, case.extra_grads),
                                 args.warmup, args.repeats, prime=case.compiled)
        timing, status = attempt(timed)
        torch.cuda.empty_cache()
        if status == OUT_OF_MEMORY:
            out_of_memory.add(keys[p])
        results[p] = (Measurement(status=status, rel_err=rel_err) if status
                      else Measurement(ms=timing[0], peak_bytes=timing[1], rel_err=rel_err))
    return results


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

ROW = "{:<18} {:<14} {:>4} {:>6} {:<17} "


def print_header(device: str, date: str, args):
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    print(f"device: {device}\ndate: {date}\ntorch {torch.__version__}, triton {triton_version}")
    print(f"tokens per batch {args.tokens}, H {args.heads}, {DTYPE_NAME}, "
          f"median of {args.repeats} calls after {args.warmup}\n")
    print(ROW.format("impl", "mode", "D", "T", "pass") + f"{'ms':>10} {'TFLOP/s':>9} {'peak GB':>10}",
          flush=True)


def report(out, device: str, date: str, args, shape: Shape, impl: str, pass_name: str,
           m: Measurement):
    """Prints one table row and appends one JSON line (the C++ bench's keys + max_rel_err)."""
    ok = m.status == "ok"
    tflops = pass_flops(shape.forward_flops, pass_name) / (m.ms * 1e-3) / 1e12 if ok else None
    row = ROW.format(impl, shape.mode, shape.head_dim, shape.length, pass_name)
    if ok:
        print(row + f"{m.ms:10.3f} {tflops:9.1f} {m.peak_bytes / 1e9:10.2f}", flush=True)
    else:
        print(row + m.status, flush=True)
    record = {
        "device": device, "date": date, "impl": impl, "mode": shape.mode, "dtype": DTYPE_NAME,
        "head_dim": shape.head_dim, "seq_len": shape.length, "batch": shape.batch,
        "heads": shape.heads, "pass": pass_name, "status": m.status,
        "ms": m.ms if ok else None, "tflops": tflops, "peak_mem_bytes": m.peak_bytes if ok else None,
        "max_rel_err": m.rel_err,
    }
    out.write(json.dumps(record) + "\n")
    out.flush()


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def positive_ints(text: str) -> list:
    values = []
    for item in filter(None, text.split(",")):
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"'{item}' is not a positive integer")
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def choices(known):
    def parse(text: str) -> list:
        items = [s for s in text.split(",") if s]
        for item in items:
            if item not in known:
                raise argparse.ArgumentTypeError(f"unknown entry '{item}' (known: {', '.join(known)})")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items
    return parse


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=positive_ints, default="512,1024,2048,4096,8192,16384",
                    help="comma-separated sequence lengths T (default: %(default)s)")
    ap.add_argument("--head-dims", type=positive_ints, default="64,128",
                    help="comma-separated head dimensions D (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch: B = max(1, tokens // T)")
    ap.add_argument("--heads", type=int, default=16, help="attention heads H")
    ap.add_argument("--impls", type=choices(IMPLS), default=",".join(IMPLS),
                    help="comma-separated implementations (default: %(default)s); "
                         "sdpa runs sdpa-flash, sdpa-cudnn and sdpa-efficient")
    ap.add_argument("--passes", type=choices(PASSES), default=",".join(PASSES),
                    help="forward and/or forward+backward (default: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--causal", action="store_true", help="causal only (default: causal and bidirectional)")
    mode.add_argument("--bidirectional", action="store_true", help="bidirectional only")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls (median reported)")
    ap.add_argument("--out", default="benchmarks/results/attention_pytorch.jsonl",
                    help="JSON lines file to append to (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.repeats < 1 or args.tokens < 1 or args.heads < 1:
        ap.error("--warmup >= 0, --repeats, --tokens and --heads >= 1 please")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_pytorch.py: no CUDA device here; this benchmark needs one", file=sys.stderr)
        return 1
    torch.set_float32_matmul_precision("highest")  # the float32 reference is float32, not TF32

    device = torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    parent = os.path.dirname(args.out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    modes = [m for m, on in ((True, not args.bidirectional), (False, not args.causal)) if on]
    slopes = torch.tensor(alibi_slopes(args.heads), dtype=torch.float64).to("cuda", torch.float32)
    out_of_memory = set()  # impl|mode|D|pass that ran out at a shorter T
    uses_flex = any(impl.startswith("flex") for impl in args.impls)
    if uses_flex:
        importlib.import_module("torch._dynamo")  # torch._dynamo.reset() below

    print_header(device, date, args)
    with open(args.out, "a") as out:
        for head_dim in args.head_dims:
            for causal in modes:
                for length in args.lengths:
                    check = length == args.lengths[0] or length <= CHECK_MAX_LENGTH
                    shape = make_shape(args, causal, head_dim, length, check, slopes)
                    if uses_flex:
                        torch._dynamo.reset()  # one shape's compiled graphs at a time
                    for impl in args.impls:
                        for case in cases_for(impl, shape):
                            results = run_case(case, shape, args.passes, args, out_of_memory)
                            for pass_name in args.passes:
                                report(out, device, date, args, shape, case.impl, pass_name,
                                       results[pass_name])
                            torch.cuda.empty_cache()  # the case's call (and its mask) is gone
                    shape.release()
                    del shape
                    torch.cuda.empty_cache()
    print(f"\nresults appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
