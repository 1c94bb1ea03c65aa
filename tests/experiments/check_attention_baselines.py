"""benchmarks/attention_pytorch.py checked on the CPU: its slopes against the paper's formula,
its FLOP counts, its score_mod against its materialised bias and both against -slope |i - j|,
its float32 reference against SDPA, FlexAttention (eager and, where Inductor compiles it here,
compiled) against the reference, and its case logic end to end (JSON keys, out of memory, a
wrong output not timed, one-line errors) with the CUDA timer swapped for a wall clock.

    .venv/bin/python tests/experiments/check_attention_baselines.py REPO_ROOT
"""
import argparse
import io
import pathlib
import json
import math
import os
import sys
import time

sys.path.insert(0, str(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "benchmarks"))
import inductor_cache  # noqa: E402  (before torch: Inductor's cache for this CPU capability)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import attention_pytorch as ap  # noqa: E402

torch.manual_seed(0)
failures = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name} {detail}")
    if not ok:
        failures.append(name)


# 0. Inductor's cache: a directory per CPU capability (benchmarks/inductor_cache.py), unless the
# user named one; a capped process and an uncapped one never share compiled code.
check("inductor cache of this capability",
      inductor_cache.USER_CHOSEN
      or os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith(os.sep + inductor_cache.capability_key()))
check("capped and uncapped caches differ",
      inductor_cache.capability_key({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                     "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
      != inductor_cache.capability_key({}))

# 1. Slopes: the paper's definition, written differently (start * ratio^i, start = 2^(-8/n)).
def paper_slopes(n):
    def pow2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return pow2(n)
    closest = 2 ** math.floor(math.log2(n))
    return pow2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


for n in (1, 2, 4, 8, 12, 16, 20, 32, 48):
    a, b = ap.alibi_slopes(n), paper_slopes(n)
    check(f"slopes H={n}", len(a) == n and all(abs(x - y) <= 1e-13 * y for x, y in zip(a, b)))
check("slopes H=16 exact", ap.alibi_slopes(16) == [2.0 ** (-(h + 1) / 2) for h in range(16)])
check("slopes H=12 interleave", ap.alibi_slopes(12)[8:] == [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5])

# 2. FLOPs.
check("flops bidirectional", ap.forward_flops(32, 16, 512, 64, False) == 4 * 32 * 16 * 512 * 512 * 64)
check("flops causal", ap.forward_flops(32, 16, 512, 64, True) == 2 * 32 * 16 * 512 * 512 * 64)
check("flops fwd+bwd", ap.pass_flops(10.0, "forward+backward") == 35.0 and ap.pass_flops(10.0, "forward") == 10.0)

# 3. score_mod (broadcast over (H, T, T)) against the materialised bias.
H, T = 12, 37
slopes = torch.tensor(ap.alibi_slopes(H), dtype=torch.float64).float()
hh = torch.arange(H).view(-1, 1, 1)
qi = torch.arange(T).view(1, -1, 1)
kj = torch.arange(T).view(1, 1, -1)
for causal in (True, False):
    mat = ap.materialise_alibi(slopes, T, causal, torch.float32)[0]
    mod = ap.alibi_score_mod(slopes, causal)(torch.zeros(H, T, T), 0, hh, qi, kj)
    allowed = (kj <= qi).expand(H, T, T) if causal else torch.ones(H, T, T, dtype=torch.bool)
    check(f"score_mod == materialised ({'causal' if causal else 'bidirectional'})",
          torch.allclose(mod[allowed], mat[allowed], rtol=0, atol=1e-6)
          and bool(torch.isinf(mat[~allowed]).all()) and bool((mat[~allowed] < 0).all()))
    explicit = torch.stack([torch.tensor([[-(float(slopes[h]) * abs(i - j)) if (not causal or j <= i) else -math.inf
                                            for j in range(T)] for i in range(T)]) for h in range(H)])
    check(f"materialised == -slope*|i-j| elementwise ({'causal' if causal else 'bidirectional'})",
          torch.equal(mat, explicit))
bf = ap.materialise_alibi(slopes, 300, True, torch.bfloat16)
check("materialised bf16 = float32 rounded once, shape (1,H,T,T)",
      bf.shape == (1, H, 300, 300) and bf.dtype == torch.bfloat16
      and torch.equal(bf, ap.materialise_alibi(slopes, 300, True, torch.float32).bfloat16()))
check("causal mask-only bias", torch.equal(ap.alibi_bias_head(None, 4, True),
      torch.tensor([[0, -math.inf, -math.inf, -math.inf], [0, 0, -math.inf, -math.inf],
                    [0, 0, 0, -math.inf], [0, 0, 0, 0]]).float()))

# 4. Reference vs F.sdpa (float32, materialised mask) and chunked vs unchunked.
B, H, T, D = 3, 4, 64, 16
s4 = torch.tensor(ap.alibi_slopes(H)).float()
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
for causal in (True, False):
    ref = ap.reference_attention(q, k, v, s4, causal)
    sd = F.scaled_dot_product_attention(q, k, v, attn_mask=ap.materialise_alibi(s4, T, causal, torch.float32))
    chunked = ap.reference_attention(q, k, v, s4, causal, score_budget_bytes=1)  # one row at a time
    check(f"reference == sdpa+mask ({causal=})", ap.relative_error(sd, ref) < 1e-5,
          f"rel {ap.relative_error(sd, ref):.2e}")
    check(f"reference chunked == whole ({causal=})", torch.allclose(chunked, ref, atol=1e-6))
    nob = ap.reference_attention(q, k, v, None, causal)
    sdn = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    check(f"no-bias reference == sdpa ({causal=})", ap.relative_error(sdn, nob) < 1e-5)
check("relative_error", abs(ap.relative_error(torch.ones(4) * 1.1, torch.ones(4)) - 0.1) < 1e-6)

# 5. FlexAttention eager on CPU vs the reference, and the learned-slopes gradient.
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

B, H, T, D = 2, 4, 256, 16
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
for causal in (True, False):
    bm = create_block_mask(ap.causal_mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device="cpu") if causal else None
    out = flex_attention(q, k, v, score_mod=ap.alibi_score_mod(s4, causal), block_mask=bm)
    err = ap.relative_error(out, ap.reference_attention(q, k, v, s4, causal))
    check(f"flex eager == reference ({causal=})", err < 1e-5, f"rel {err:.2e}")
    wrong = ap.relative_error(out, ap.reference_attention(q, k, v, s4 * 1.05, causal))
    check(f"  ... and sensitive to the slopes ({causal=})", wrong > 1e-3, f"rel vs 1.05*slopes {wrong:.2e}")
    # learned slopes: d/d(slopes) through flex vs through sdpa with a differentiable bias
    ls = s4.clone().requires_grad_(True)
    dout = torch.randn(B, H, T, D)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    try:
        g_flex = torch.autograd.grad(flex_attention(qg, kg, vg, score_mod=ap.alibi_score_mod(ls, causal),
                                                    block_mask=bm), (qg, kg, vg, ls), dout)
    except NotImplementedError as e:
        print(f"SKIP  flex backward on CPU: {str(e).splitlines()[0]}")
        continue
    ls2 = s4.clone().requires_grad_(True)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    bias = torch.stack([ap.alibi_bias_head(ls2[h], T, causal) for h in range(H)]).unsqueeze(0)
    g_ref = torch.autograd.grad(F.scaled_dot_product_attention(qg, kg, vg, attn_mask=bias), (qg, kg, vg, ls2), dout)
    errs = [ap.relative_error(a, b) for a, b in zip(g_flex, g_ref)]
    check(f"flex eager grads q,k,v,slopes == reference ({causal=})", max(errs) < 1e-4,
          " ".join(f"{e:.1e}" for e in errs))

# 6. Compiled flex on CPU (Inductor's CPU flex template), if it compiles here.
try:
    flex = ap.compiled_flex_attention()
    for causal in (True, False):
        bm = create_block_mask(ap.causal_mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device="cpu") if causal else None
        with torch.no_grad():
            out = flex(q, k, v, score_mod=ap.alibi_score_mod(s4, causal), block_mask=bm)
        err = ap.relative_error(out, ap.reference_attention(q, k, v, s4, causal))
        check(f"flex compiled (CPU) == reference ({causal=})", err < 1e-4, f"rel {err:.2e}")
    print("      dynamo recompile_limit now", torch._dynamo.config.recompile_limit)
except Exception as e:  # noqa: BLE001
    print(f"SKIP  compiled flex on CPU: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

# 7. run_case / report end to end on CPU: time_call swapped for a wall-clock timer.
def cpu_time_call(call, warmup, repeats, prime=False):
    if prime:
        call()
    call()
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2], 0


# 5b. The offsets table (flex-offsets): flex's score_mod, the reference's table bias and a
# differentiable materialised bias through SDPA agree, outputs and the table's gradient; and the
# reference against a loop written from the definition.
Ts = 6
qs, ks, vs = (torch.randn(1, 2, Ts, 8) for _ in range(3))
small = ap.offsets_table(2, Ts, "cpu")
looped = torch.zeros(1, 2, Ts, 8)
for h in range(2):
    for i in range(Ts):
        logits = torch.stack([qs[0, h, i] @ ks[0, h, j] / math.sqrt(8) + small[h, j - i + Ts - 1] for j in range(i + 1)])
        looped[0, h, i] = torch.softmax(logits, 0) @ vs[0, h, : i + 1]
check("offsets reference == loop from the definition",
      ap.relative_error(ap.reference_attention(qs, ks, vs, None, True, table=small), looped) < 1e-6)
table = ap.offsets_table(H, T, "cpu")
pos = torch.arange(T)
for causal in (True, False):
    bm = create_block_mask(ap.causal_mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device="cpu") if causal else None
    out = flex_attention(q, k, v, score_mod=ap.offsets_score_mod(table, T), block_mask=bm)
    ref = ap.reference_attention(q, k, v, None, causal, table=table)
    check(f"flex offsets == reference ({causal=})", ap.relative_error(out, ref) < 1e-5)
    check(f"  ... and sensitive to the table ({causal=})",
          ap.relative_error(out, ap.reference_attention(q, k, v, None, causal, table=table * 1.05)) > 1e-3)
    lt = table.clone().requires_grad_(True)
    dout = torch.randn(B, H, T, D)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    try:
        g_flex = torch.autograd.grad(flex_attention(qg, kg, vg, score_mod=ap.offsets_score_mod(lt, T), block_mask=bm),
                                     (qg, kg, vg, lt), dout)
    except NotImplementedError as e:
        print(f"SKIP  flex offsets backward on CPU: {str(e).splitlines()[0]}")
        continue
    lt2 = table.clone().requires_grad_(True)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    bias = lt2[:, pos.view(1, -1) - pos.view(-1, 1) + T - 1].unsqueeze(0)
    if causal:
        bias = bias.masked_fill(pos.view(1, -1) > pos.view(-1, 1), -math.inf)
    g_ref = torch.autograd.grad(F.scaled_dot_product_attention(qg, kg, vg, attn_mask=bias), (qg, kg, vg, lt2), dout)
    errs = [ap.relative_error(a, b) for a, b in zip(g_flex, g_ref)]
    check(f"flex offsets grads q,k,v,table == reference ({causal=})", max(errs) < 1e-4,
          " ".join(f"{e:.1e}" for e in errs))

ap.time_call = cpu_time_call
args = argparse.Namespace(warmup=1, repeats=3, tokens=512, heads=4, impls=list(ap.IMPLS),
                          passes=list(ap.PASSES))


def cpu_shape(causal, T, D=16, check_out=True):
    B = max(1, args.tokens // T)
    torch.manual_seed(T * 131 + D)
    draw = lambda: torch.randn(B, args.heads, T, D, dtype=torch.bfloat16)
    qq, kk, vv, dd = draw(), draw(), draw(), draw()
    return ap.Shape(mode="causal" if causal else "bidirectional", causal=causal, head_dim=D, length=T,
                    batch=B, heads=args.heads, check=check_out, slopes=s4, q=qq, k=kk, v=vv, dout=dd,
                    forward_flops=ap.forward_flops(B, args.heads, T, D, causal))


sink = io.StringIO()
oom = set()
for causal in (True, False):
    shape = cpu_shape(causal, 128)
    torch._dynamo.reset()
    for impl in ap.IMPLS:
        for case in ap.cases_for(impl, shape):
            res = ap.run_case(case, shape, args.passes, args, oom)
            for p in args.passes:
                ap.report(sink, "cpu", "2026-01-01T00:00:00Z", args, shape, case.impl, p, res[p])
lines = [json.loads(line) for line in sink.getvalue().splitlines()]
statuses = {(r["impl"], r["mode"], r["pass"]): r["status"] for r in lines}
keys = ["device", "date", "impl", "mode", "dtype", "head_dim", "seq_len", "batch", "heads", "pass",
        "status", "ms", "tflops", "peak_mem_bytes", "max_rel_err"]
check("JSON keys and order", all(list(r) == keys for r in lines))
for impl in ("flex-alibi", "flex-alibi-learned", "flex-offsets", "sdpa-bias"):
    for mode in ("causal", "bidirectional"):
        for p in ap.PASSES:
            st = statuses[(impl, mode, p)]
            if impl.startswith("flex") and p == "forward+backward" and "backward on CPU" in st:
                print(f"SKIP  end to end: {impl} {mode} {p}: {st}")  # CPU flex has no backward
                continue
            check(f"end to end ok: {impl} {mode} {p}", st == "ok", st)
print("      sdpa backends on CPU:", {k: v for k, v in statuses.items() if k[0].startswith("sdpa-") and k[0] != "sdpa-bias"})
check("rel errors recorded", all(r["max_rel_err"] is not None and r["max_rel_err"] < 2e-2
                                 for r in lines if r["status"] == "ok"))

# OOM at one length -> skipped at the next; a wrong output is not timed; other errors go on.
def raise_oom():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")


oom_case = ap.Case("fake-oom", build=lambda: (lambda q, k, v: raise_oom()))
wrong_case = ap.Case("fake-wrong", build=lambda: (lambda q, k, v: torch.zeros_like(q)))
err_case = ap.Case("fake-err", build=lambda: (lambda q, k, v: (_ for _ in ()).throw(ValueError("boom\nsecond line"))))
oom = set()
r1 = ap.run_case(oom_case, cpu_shape(True, 64), args.passes, args, oom)
r2 = ap.run_case(oom_case, cpu_shape(True, 128), args.passes, args, oom)
check("oom then skipped", all(m.status == ap.OUT_OF_MEMORY for m in r1.values())
      and all(m.status == ap.SKIPPED_OOM for m in r2.values()), f"{oom}")
r3 = ap.run_case(wrong_case, cpu_shape(False, 64), args.passes, args, set())
check("wrong output not timed", all(m.status.startswith("wrong (rel err 1") and m.ms is None for m in r3.values()),
      r3["forward"].status)
r4 = ap.run_case(err_case, cpu_shape(False, 64), args.passes, args, set())
check("other error: one line", r4["forward"].status == "error: ValueError: boom", r4["forward"].status)
r5 = ap.run_case(err_case, cpu_shape(False, 64, check_out=False), ["forward"], args, set())
check("error during timing", r5["forward"].status == "error: ValueError: boom")

print("\n" + sink.getvalue().splitlines()[0])
print(f"\n{len(failures)} failure(s)" + (": " + ", ".join(failures) if failures else ""))
sys.exit(1 if failures else 0)
