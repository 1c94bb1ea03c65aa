# Lane-level NumPy emulation of the fused attention kernels (flash_fwd.cu, flash_bwd.cu),
# for checking their index arithmetic without a GPU: ldmatrix (.trans) and mma.sync m16n8k16
# follow the PTX ISA fragment layouts (mma.cuh), and every shared-memory address, mask, tile
# range and softmax step uses the kernels' own expressions, warp by warp and lane by lane.
# 16-bit operands are rounded to fp16. Compared against a float64 reference, per bias mode.
# Sequential: it cannot see races, barriers, cp.async groups or atomics (run the CUDA tests
# and compute-sanitizer for those). Keep it in step with the kernels when they change.
#
#   .venv/bin/python core/attention/cuda/emulate_kernels.py [T,T,...] [D,D,...] [M,M,...]
#   (M: m-fragments a forward warp, 1 or 2, i.e. 64 or 128 query rows a block; NumPy; minutes for T ~ 130)
import itertools
import math
import sys

import numpy as np

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
LANES = np.arange(32)

def rnd(x):  # 16-bit rounding of the packed operands (fp16 here)
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)

# ---- PTX primitives ------------------------------------------------------------------
# Each lane's (group, thread-in-group) place in a fragment: g = lane / 4, t = lane % 4. The
# primitives move whole fragments by index arrays built from these, one entry per (lane,
# register, half): the layouts of the PTX ISA, written once below.
G, T4 = LANES // 4, LANES % 4
PAIR = np.arange(2)
# A 16x16 operand of mma.m16n8k16: a[lane, i, c] is A[rows[i], cols[i] + c].
A_ROWS = np.stack([G, G + 8, G, G + 8], axis=1)[:, :, None] + 0 * PAIR     # [lane, i, c]
A_COLS = np.stack([2 * T4, 2 * T4, 2 * T4 + 8, 2 * T4 + 8], axis=1)[:, :, None] + PAIR
# The 16x8 B operand: b0[lane, c] is B[2t + c, g], b1[lane, c] is B[2t + 8 + c, g].
B0_ROWS, B1_ROWS = (2 * T4)[:, None] + PAIR, (2 * T4 + 8)[:, None] + PAIR
B_COLS = G[:, None] + 0 * PAIR
# The 16x8 accumulator: d[lane, 0:2] is C[g, 2t:2t+2], d[lane, 2:4] is C[g + 8, 2t:2t+2].
C_ROWS = np.concatenate([G[:, None] + 0 * PAIR, (G + 8)[:, None] + 0 * PAIR], axis=1)  # [lane, 4]
C_COLS = np.concatenate([(2 * T4)[:, None] + PAIR] * 2, axis=1)

def ldmatrix_x4(smem, addr, trans=False):
    """smem: flat float32 array; addr[lane]: element address of row (lane%8) of matrix lane//8.
    returns regs[lane, i, 2]"""
    matrices = smem[np.asarray(addr).reshape(4, 8)[:, :, None] + np.arange(8)]  # [i, row, col]
    if not trans:  # lane l holds row l/4, columns 2(l%4), +1 of each matrix
        regs = matrices[:, G[:, None], (2 * T4)[:, None] + PAIR]                 # [i, lane, c]
    else:          # .trans: the same fragment of each matrix's transpose
        regs = matrices[:, (2 * T4)[:, None] + PAIR, G[:, None]]
    return np.ascontiguousarray(regs.transpose(1, 0, 2), dtype=np.float32)

def mma(d, a, b0, b1):
    """d[lane,4] f32; a[lane,4,2]; b0,b1[lane,2]. D = A B + D with the PTX layouts."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    A[A_ROWS, A_COLS] = a
    B[B0_ROWS, B_COLS] = b0
    B[B1_ROWS, B_COLS] = b1
    C[C_ROWS, C_COLS] = d
    d[:] = (A @ B + C)[C_ROWS, C_COLS]

def pack(lo, hi):
    return np.stack([rnd(lo), rnd(hi)], axis=-1)  # [lane, 2]

def quad_reduce(v, op):  # v[32]
    out = v.copy()
    for off in (1, 2):
        out = op(out, out[LANES ^ off])
    return out

# ---- bias / mask ---------------------------------------------------------------------
def geometric(h, n):
    p = 1
    while p * 2 <= n: p *= 2
    e = -8.0 * (h + 1) / p if h < p else -4.0 * (2 * (h - p) + 1) / p
    return np.float32(2.0 ** e)

def head_slopes(mode, bias, h, H):
    left, right, ll, lr = 0.0, 0.0, True, True
    sl, sr = bias.get('left'), bias.get('right')
    if mode == 'AlibiCausal':
        left = sl[h] if sl is not None else geometric(h, H); lr = False
    elif mode == 'AlibiSymmetric':
        left = sl[h] if sl is not None else geometric(h, H)
        right = sr[h] if sr is not None else geometric(h, H)
    elif mode == 'AlibiNonsymmetric':
        half = H // 2
        if h < half:
            left = sl[h] if sl is not None else geometric(h, half); lr = False
        else:
            right = sr[h] if sr is not None else geometric(h - half, half); ll = False
    elif mode == 'Linear':
        left, right = sl[h], sr[h]; ll, lr = bias['look_left'][h], bias['look_right'][h]
    return left, right, ll, lr

class HB:
    def __init__(s, mode, bias, h, H, causal):
        l, r, ll, lr = head_slopes(mode, bias, h, H)
        s.mode = mode
        if mode == 'Offsets':  # alibi.cuh make_head_bias: the head's row, indexed by j - i
            table, origin = bias['table'], bias['origin']
            s.row = lambda off, h=h: table[h, origin + off]
            s.lo, s.hi = -origin, table.shape[1] - 1 - origin
        s.sl2 = np.float32(np.float32(l) * np.float32(LOG2E)); s.sr2 = np.float32(np.float32(r) * np.float32(LOG2E))
        s.look_left = ll; s.look_right = lr and not causal

def tile_side(q0, q1, k0, k1):
    if k1 - 1 <= q0: return 1
    if k0 >= q1 - 1: return -1
    return 0

def tile_logit(hb, score, scale_log2, rel, c, sign, side):
    """alibi.cuh tile_logits for one score: rel = row_pos - col_pos0 (float32), c = 8 nt + e % 2."""
    if hb.mode == 'None': return np.float32(score * scale_log2)
    d = np.float32(sign * np.float32(np.float32(rel) - np.float32(c)))
    if hb.mode == 'Offsets':  # offset_index: j - i = -d, clamped into the table
        index = min(max(-int(np.rint(d)), hb.lo), hb.hi)
        return np.float32(np.float32(score) * scale_log2 + np.float32(hb.row(index) * np.float32(LOG2E)))
    if side != 0:
        m = -hb.sl2 if side > 0 else hb.sr2
        b = np.float32(m * d)
    else:
        b = np.float32(-hb.sl2 * d) if d >= 0 else np.float32(hb.sr2 * d)
    return np.float32(np.float32(score) * scale_log2 + b)

def visible(hb, i, j, T):
    return j < T and (j == i or (hb.look_left if j < i else hb.look_right))

def visible_keys(hb, r0, r1, T):
    return (0 if hb.look_left else r0), (T if hb.look_right else r1)

def visible_queries(hb, c0, c1, T):
    return (0 if hb.look_right else c0), (T if hb.look_left else c1)

def tile_needs_mask(hb, r0, r1, c0, c1, T):
    if c1 > T: return True
    if not hb.look_right and c1 - 1 > r0: return True
    if not hb.look_left and c0 < r1 - 1: return True
    return False

# ---- tiles ---------------------------------------------------------------------------
def load_tile(smem, stride, gmem, row0, T, rows, D):
    # smem flat; gmem (T, D) float32 (already 16-bit values)
    for r in range(rows):
        for c in range(0, D, 8):
            if row0 + r < T:
                smem[r * stride + c: r * stride + c + 8] = gmem[row0 + r, c:c + 8]
            else:
                smem[r * stride + c: r * stride + c + 8] = 0.0

def store_accumulator(smem, stride, row0, acc, s0, s1):
    """acc[lane, nt, 4]: n-tile nt's accumulator fragment, rows g (scaled by s0) and g + 8 (s1)."""
    cols = np.arange(acc.shape[1])[None, :, None] * 8 + (2 * T4)[:, None, None] + PAIR  # [lane, nt, c]
    top = (row0 + G)[:, None, None] * stride + cols
    smem[top] = rnd(acc[:, :, 0:2] * s0[:, None, None])
    smem[top + 8 * stride] = rnd(acc[:, :, 2:4] * s1[:, None, None])

# ---- forward -------------------------------------------------------------------------
def fwd(q, k, v, mode, bias, causal, scale, MF=1):
    B, H, T, D = q.shape
    WR = 16 * MF; BM = 4 * WR; BN = 64 if MF * D <= 128 else 32; stride = D + 8
    q_in_regs = MF * D <= 128
    o = np.full(q.shape, np.nan, np.float32); lse = np.full((B, H, T), np.nan, np.float32)
    KS, ST, OT = D // 16, BN // 8, D // 8
    nblocks = (T + BM - 1) // BM
    for b in range(B):
        for h in range(H):
            for bx in range(nblocks):
                m_block = nblocks - 1 - bx
                sQ = np.full(BM * stride, np.nan, np.float32); sK = np.full(BN * stride, np.nan, np.float32); sV = np.full(BN * stride, np.nan, np.float32)
                row0 = m_block * BM; row_end = min(row0 + BM, T)
                hb = HB(mode, bias, h, H, causal)
                kb_, ke_ = visible_keys(hb, row0, row_end, T)
                n_first, n_last = kb_ // BN, (ke_ - 1) // BN
                scale_log2 = np.float32(scale * LOG2E)
                load_tile(sQ, stride, q[b, h], row0, T, BM, D)
                load_tile(sK, stride, k[b, h], n_first * BN, T, BN, D)
                acc = np.zeros((4, MF, 32, OT, 4)); qf = [[None] * MF for _ in range(4)]
                rmax = np.full((4, MF, 32, 2), -np.inf); rsum = np.zeros((4, MF, 32, 2))
                for n_block in range(n_first, n_last + 1):
                    col0 = n_block * BN
                    load_tile(sV, stride, v[b, h], col0, T, BN, D)
                    s_all = []
                    for w, mf in itertools.product(range(4), range(MF)):
                        lane = LANES
                        qaddr = lambda ks: (WR * w + 16 * mf + lane % 16) * stride + ks * 16 + (lane // 16) * 8
                        if q_in_regs and n_block == n_first:
                            qf[w][mf] = [ldmatrix_x4(sQ, qaddr(ks)) for ks in range(KS)]
                        s = np.zeros((32, ST, 4))
                        for ks in range(KS):
                            qa = qf[w][mf][ks] if q_in_regs else ldmatrix_x4(sQ, qaddr(ks))
                            for np_ in range(ST // 2):
                                kbr = ldmatrix_x4(sK, (np_ * 16 + lane % 8 + (lane // 16) * 8) * stride + ks * 16 + ((lane // 8) % 2) * 8)
                                mma(s[:, 2 * np_], qa, kbr[:, 0], kbr[:, 1])
                                mma(s[:, 2 * np_ + 1], qa, kbr[:, 2], kbr[:, 3])
                        wr0 = row0 + WR * w + 16 * mf
                        side = tile_side(wr0, wr0 + 16, col0, col0 + BN)
                        masked = tile_needs_mask(hb, wr0, wr0 + 16, col0, col0 + BN, T)
                        for l in range(32):
                            g, t = l // 4, l % 4
                            for nt in range(ST):
                                for e in range(4):
                                    i = wr0 + g + 8 * (e // 2); j = col0 + nt * 8 + 2 * t + (e % 2)
                                    rel = np.float32(i) - np.float32(col0 + 2 * t)
                                    s[l, nt, e] = tile_logit(hb, s[l, nt, e], scale_log2, rel, nt * 8 + (e % 2), 1, side)
                                    if masked and not visible(hb, i, j, T): s[l, nt, e] = -np.inf
                        # online softmax
                        tmax = rmax[w, mf].copy()
                        tmax[:, 0] = np.maximum(tmax[:, 0], np.max(s[:, :, 0:2], axis=(1, 2)))
                        tmax[:, 1] = np.maximum(tmax[:, 1], np.max(s[:, :, 2:4], axis=(1, 2)))
                        corr = np.zeros((32, 2)); base = np.zeros((32, 2))
                        for r in range(2):
                            tmax[:, r] = quad_reduce(tmax[:, r], np.maximum)
                            base[:, r] = np.where(tmax[:, r] == -np.inf, 0.0, tmax[:, r])
                            with np.errstate(invalid='ignore'):
                                corr[:, r] = np.exp2(rmax[w, mf][:, r] - base[:, r])
                            rmax[w, mf][:, r] = tmax[:, r]
                        tsum = np.zeros((32, 2))
                        for e in range(4):
                            s[:, :, e] = np.exp2(s[:, :, e] - base[:, e // 2][:, None])
                            tsum[:, e // 2] += s[:, :, e].sum(axis=1)
                        rsum[w, mf] = rsum[w, mf] * corr + tsum
                        acc[w, mf][:, :, 0:2] *= corr[:, 0][:, None, None]
                        acc[w, mf][:, :, 2:4] *= corr[:, 1][:, None, None]
                        s_all.append(s)
                    # __syncthreads: every warp is done with sK (K of the next tile loads after P V here)
                    for (w, mf), s in zip(itertools.product(range(4), range(MF)), s_all):
                        lane = LANES
                        for kj in range(BN // 16):
                            pa = np.stack([pack(s[:, 2 * kj, 0], s[:, 2 * kj, 1]), pack(s[:, 2 * kj, 2], s[:, 2 * kj, 3]),
                                           pack(s[:, 2 * kj + 1, 0], s[:, 2 * kj + 1, 1]), pack(s[:, 2 * kj + 1, 2], s[:, 2 * kj + 1, 3])], axis=1)
                            for dp in range(D // 16):
                                vb = ldmatrix_x4(sV, (kj * 16 + lane % 8 + ((lane // 8) % 2) * 8) * stride + dp * 16 + (lane // 16) * 8, trans=True)
                                mma(acc[w, mf][:, 2 * dp], pa, vb[:, 0], vb[:, 1])
                                mma(acc[w, mf][:, 2 * dp + 1], pa, vb[:, 2], vb[:, 3])
                    if n_block < n_last:
                        load_tile(sK, stride, k[b, h], col0 + BN, T, BN, D)
                # epilogue
                for w, mf in itertools.product(range(4), range(MF)):
                    inv = np.zeros((32, 2)); rl = np.zeros((32, 2))
                    for r in range(2):
                        sm = quad_reduce(rsum[w, mf][:, r], np.add)
                        inv[:, r] = np.where(sm > 0, 1.0 / np.where(sm > 0, sm, 1), 0.0)
                        rl[:, r] = np.where(sm > 0, (rmax[w, mf][:, r] + np.log2(np.where(sm > 0, sm, 1))) * LN2, -np.inf)
                    store_accumulator(sQ, stride, WR * w + 16 * mf, acc[w, mf], inv[:, 0], inv[:, 1])
                    wr0 = row0 + WR * w + 16 * mf
                    for l in range(0, 32, 4):
                        g = l // 4
                        if wr0 + g < T: lse[b, h, wr0 + g] = rl[l, 0]
                        if wr0 + g + 8 < T: lse[b, h, wr0 + g + 8] = rl[l, 1]
                for r in range(BM):
                    if row0 + r < T:
                        o[b, h, row0 + r] = sQ[r * stride: r * stride + D]
    return o, lse

# ---- backward ------------------------------------------------------------------------
def bwd(q, k, v, o, lse, dout, mode, bias, causal, scale, want_slopes, want_offsets=False):
    B, H, T, D = q.shape
    BM = BN = 64; stride = D + 8; dss = BM + 8
    KS, QT, DT = D // 16, BM // 8, D // 8
    CH = 64; CT = CH // 8
    delta = (dout.astype(np.float64) * o.astype(np.float64)).sum(-1).astype(np.float32)
    dq_acc = np.zeros((B, H, T, D), np.float64)
    dq = np.full(q.shape, np.nan, np.float32); dk = np.full(q.shape, np.nan, np.float32); dv = np.full(q.shape, np.nan, np.float32)
    dsl = np.zeros(H); dsr = np.zeros(H)
    dtab = np.zeros(bias['table'].shape) if mode == 'Offsets' else None
    scale_log2 = np.float32(scale * LOG2E)
    for b in range(B):
        for h in range(H):
            for n_block in range((T + BN - 1) // BN):
                sK = np.full(BN * stride, np.nan, np.float32); sV = np.full(BN * stride, np.nan, np.float32)
                sQ = np.full(BM * stride, np.nan, np.float32); sdO = np.full(BM * stride, np.nan, np.float32)
                sdS = np.full(BN * dss, np.nan, np.float32)
                col0 = n_block * BN; col_end = min(col0 + BN, T)
                hb = HB(mode, bias, h, H, causal)
                qb_, qe_ = visible_queries(hb, col0, col_end, T)
                m_first, m_last = qb_ // BM, (qe_ - 1) // BM
                load_tile(sK, stride, k[b, h], col0, T, BN, D); load_tile(sV, stride, v[b, h], col0, T, BN, D)
                adk = np.zeros((4, 32, DT, 4)); adv = np.zeros((4, 32, DT, 4))
                tsl = np.zeros((4, 32)); tsr = np.zeros((4, 32))
                s_off = np.zeros(BM + BN)  # sOffsetGrad: a tile's dS per j - i
                for m_block in range(m_first, m_last + 1):
                    row0 = m_block * BM
                    load_tile(sQ, stride, q[b, h], row0, T, BM, D); load_tile(sdO, stride, dout[b, h], row0, T, BM, D)
                    sLse = np.array([lse[b, h, row0 + x] * np.float32(LOG2E) if row0 + x < T else np.inf for x in range(BM)], np.float32)
                    sDelta = np.array([delta[b, h, row0 + x] if row0 + x < T else 0.0 for x in range(BM)], np.float32)
                    for w in range(4):
                        lane = LANES; wc0 = col0 + 16 * w
                        pt = np.zeros((32, QT, 4))
                        for ks in range(KS):
                            ka = ldmatrix_x4(sK, (16 * w + lane % 16) * stride + ks * 16 + (lane // 16) * 8)
                            for np_ in range(QT // 2):
                                qbr = ldmatrix_x4(sQ, (np_ * 16 + lane % 8 + (lane // 16) * 8) * stride + ks * 16 + ((lane // 8) % 2) * 8)
                                mma(pt[:, 2 * np_], ka, qbr[:, 0], qbr[:, 1]); mma(pt[:, 2 * np_ + 1], ka, qbr[:, 2], qbr[:, 3])
                        masked = tile_needs_mask(hb, row0, row0 + BM, wc0, wc0 + 16, T)
                        side = tile_side(row0, row0 + BM, wc0, wc0 + 16)
                        for l in range(32):
                            g, t = l // 4, l % 4
                            for nt in range(QT):
                                for e in range(4):
                                    j = wc0 + g + 8 * (e // 2); qi = nt * 8 + 2 * t + (e % 2); i = row0 + qi
                                    rel = np.float32(j) - np.float32(row0 + 2 * t)
                                    x = tile_logit(hb, pt[l, nt, e], scale_log2, rel, nt * 8 + (e % 2), -1, side)
                                    pt[l, nt, e] = 0.0 if (masked and not visible(hb, i, j, T)) else np.exp2(x - sLse[qi])
                        for kj in range(BM // 16):
                            pa = np.stack([pack(pt[:, 2 * kj, 0], pt[:, 2 * kj, 1]), pack(pt[:, 2 * kj, 2], pt[:, 2 * kj, 3]),
                                           pack(pt[:, 2 * kj + 1, 0], pt[:, 2 * kj + 1, 1]), pack(pt[:, 2 * kj + 1, 2], pt[:, 2 * kj + 1, 3])], axis=1)
                            for dp in range(D // 16):
                                ob = ldmatrix_x4(sdO, (kj * 16 + lane % 8 + ((lane // 8) % 2) * 8) * stride + dp * 16 + (lane // 16) * 8, trans=True)
                                mma(adv[w][:, 2 * dp], pa, ob[:, 0], ob[:, 1]); mma(adv[w][:, 2 * dp + 1], pa, ob[:, 2], ob[:, 3])
                        ds = np.zeros((32, QT, 4))
                        for ks in range(KS):
                            va = ldmatrix_x4(sV, (16 * w + lane % 16) * stride + ks * 16 + (lane // 16) * 8)
                            for np_ in range(QT // 2):
                                ob = ldmatrix_x4(sdO, (np_ * 16 + lane % 8 + (lane // 16) * 8) * stride + ks * 16 + ((lane // 8) % 2) * 8)
                                mma(ds[:, 2 * np_], va, ob[:, 0], ob[:, 1]); mma(ds[:, 2 * np_ + 1], va, ob[:, 2], ob[:, 3])
                        for l in range(32):
                            g, t = l // 4, l % 4
                            for nt in range(QT):
                                for e in range(4):
                                    qi = nt * 8 + 2 * t + (e % 2)
                                    ds[l, nt, e] = pt[l, nt, e] * (ds[l, nt, e] - sDelta[qi])
                                    if mode == 'Offsets' and want_offsets:
                                        s_off[16 * w + g + 8 * (e // 2) - qi + BM - 1] += ds[l, nt, e]
                                    if mode == 'Linear':
                                        dist = row0 + qi - (wc0 + g + 8 * (e // 2))
                                        if dist >= 0: tsl[w, l] -= ds[l, nt, e] * dist
                                        else: tsr[w, l] += ds[l, nt, e] * dist
                        for kj in range(BM // 16):
                            da = np.stack([pack(ds[:, 2 * kj, 0], ds[:, 2 * kj, 1]), pack(ds[:, 2 * kj, 2], ds[:, 2 * kj, 3]),
                                           pack(ds[:, 2 * kj + 1, 0], ds[:, 2 * kj + 1, 1]), pack(ds[:, 2 * kj + 1, 2], ds[:, 2 * kj + 1, 3])], axis=1)
                            for dp in range(D // 16):
                                qbr = ldmatrix_x4(sQ, (kj * 16 + lane % 8 + ((lane // 8) % 2) * 8) * stride + dp * 16 + (lane // 16) * 8, trans=True)
                                mma(adk[w][:, 2 * dp], da, qbr[:, 0], qbr[:, 1]); mma(adk[w][:, 2 * dp + 1], da, qbr[:, 2], qbr[:, 3])
                            for l in range(32):
                                g, t = l // 4, l % 4
                                sdS[(16 * w + g) * dss + 16 * kj + 2 * t: (16 * w + g) * dss + 16 * kj + 2 * t + 2] = da[l, 0]
                                sdS[(16 * w + g + 8) * dss + 16 * kj + 2 * t: (16 * w + g + 8) * dss + 16 * kj + 2 * t + 2] = da[l, 1]
                                sdS[(16 * w + g) * dss + 16 * kj + 8 + 2 * t: (16 * w + g) * dss + 16 * kj + 8 + 2 * t + 2] = da[l, 2]
                                sdS[(16 * w + g + 8) * dss + 16 * kj + 8 + 2 * t: (16 * w + g + 8) * dss + 16 * kj + 8 + 2 * t + 2] = da[l, 3]
                    # __syncthreads, then (Offsets) the tile's flush, then dQ
                    if mode == 'Offsets' and want_offsets:
                        for tid in range(BM + BN - 1):
                            off = col0 - row0 - (BM - 1) + tid
                            value = np.float32(s_off[tid]); s_off[tid] = 0.0
                            if value != 0.0:
                                assert hb.lo <= off <= hb.hi, f"a nonzero gradient at offset {off} outside the table"
                                dtab[h, bias['origin'] + off] += value
                    for w in range(4):
                        lane = LANES; wrow = row0 + 16 * w
                        for chunk in range(D // CH):
                            dqa = np.zeros((32, CT, 4))
                            for kj in range(BN // 16):
                                sa = ldmatrix_x4(sdS, (kj * 16 + lane % 8 + (lane // 16) * 8) * dss + 16 * w + ((lane // 8) % 2) * 8, trans=True)
                                for dp in range(CT // 2):
                                    kbr = ldmatrix_x4(sK, (kj * 16 + lane % 8 + ((lane // 8) % 2) * 8) * stride + chunk * CH + dp * 16 + (lane // 16) * 8, trans=True)
                                    mma(dqa[:, 2 * dp], sa, kbr[:, 0], kbr[:, 1]); mma(dqa[:, 2 * dp + 1], sa, kbr[:, 2], kbr[:, 3])
                            # add_dq with float4 atomics (the default width): lanes t and t ^ 1
                            # swap halves, the even lane adds row g, the odd lane row g + 8.
                            for l in range(32):
                                g, t = l // 4, l % 4
                                even = t % 2 == 0
                                for nt in range(CT):
                                    col = chunk * CH + nt * 8 + 2 * t
                                    # the sender, of the other parity, sends row g + 8's pair if even
                                    got = dqa[l ^ 1, nt, 0:2] if even else dqa[l ^ 1, nt, 2:4]
                                    row = wrow + g if even else wrow + g + 8
                                    if row < T:
                                        value = np.concatenate([dqa[l, nt, 0:2], got] if even else [got, dqa[l, nt, 2:4]])
                                        start = col if even else col - 2
                                        assert start % 4 == 0
                                        dq_acc[b, h, row, start:start + 4] += value
                # epilogue
                for w in range(4):
                    ones = np.ones(32)
                    store_accumulator(sQ, stride, 16 * w, adk[w], ones * scale, ones * scale)
                    store_accumulator(sdO, stride, 16 * w, adv[w], ones, ones)
                for r in range(BN):
                    if col0 + r < T:
                        dk[b, h, col0 + r] = sQ[r * stride: r * stride + D]
                        dv[b, h, col0 + r] = sdO[r * stride: r * stride + D]
                if mode == 'Linear' and want_slopes:
                    dsl[h] += tsl.sum(); dsr[h] += tsr.sum()
    dq = rnd(dq_acc * scale)
    if want_offsets:
        return dq, dk, dv, dsl, dsr, dtab
    return dq, dk, dv, dsl, dsr

# ---- reference -----------------------------------------------------------------------
def reference(q, k, v, dout, mode, bias, causal, scale):
    B, H, T, D = q.shape
    q = q.astype(np.float64); k = k.astype(np.float64); v = v.astype(np.float64); dout = dout.astype(np.float64)
    i = np.arange(T)[:, None]; j = np.arange(T)[None, :]
    bias_m = np.zeros((H, T, T)); allowed = np.zeros((H, T, T), bool)
    dist_left = np.where(j <= i, -(i - j), 0.0); dist_right = np.where(j > i, -(j - i), 0.0)
    slopes = []
    for h in range(H):
        l, r, ll, lr = head_slopes(mode, bias, h, H)
        lr = lr and not causal
        slopes.append((float(np.float32(l)), float(np.float32(r))))
        bias_m[h] = (float(np.float32(l)) * dist_left + float(np.float32(r)) * dist_right) if mode != 'None' else 0.0
        if mode == 'Offsets':  # clamped as the kernels clamp: only masked entries ever are
            off = np.clip(j - i, -bias['origin'], bias['table'].shape[1] - 1 - bias['origin'])
            bias_m[h] = bias['table'][h, bias['origin'] + off].astype(np.float64)
        allowed[h] = (j == i) | ((j < i) & ll) | ((j > i) & lr)
    s = np.einsum('bhid,bhjd->bhij', q, k) * scale + bias_m[None]
    s = np.where(allowed[None], s, -np.inf)
    m = s.max(-1, keepdims=True); p = np.exp(s - m); l = p.sum(-1, keepdims=True); p = p / l
    lse = (m + np.log(l))[..., 0]
    o = p @ v
    dp = dout @ v.transpose(0, 1, 3, 2)
    dv = p.transpose(0, 1, 3, 2) @ dout
    ds = p * (dp - (dout * o).sum(-1, keepdims=True))
    dq = ds @ k * scale; dk = ds.transpose(0, 1, 3, 2) @ q * scale
    dsl = np.array([(ds[:, hh] * dist_left).sum() for hh in range(H)])
    dsr = np.array([(ds[:, hh] * dist_right).sum() for hh in range(H)])
    if mode == 'Offsets':
        dtab = np.zeros(bias['table'].shape)
        for hh in range(H):
            for off in range(-(T - 1), min(T, bias['table'].shape[1] - bias['origin'])):
                dtab[hh, bias['origin'] + off] = np.trace(ds[:, hh].sum(0), offset=off)
        return o, lse, dq, dk, dv, dsl, dsr, dtab
    return o, lse, dq, dk, dv, dsl, dsr

def run(mode, bias, causal, B, H, T, D, seed, MF=1):
    rng = np.random.default_rng(seed)
    q, k, v, dout = [rnd(rng.standard_normal((B, H, T, D))) for _ in range(4)]
    scale = np.float32(1 / math.sqrt(D))
    o, lse = fwd(q, k, v, mode, bias, causal, scale, MF)
    extra = []
    if mode == 'Offsets':
        ro, rlse, rdq, rdk, rdv, rdsl, rdsr, rdtab = reference(q, k, v, dout, mode, bias, causal, scale)
        dq, dk, dv, dsl, dsr, dtab = bwd(q, k, v, o, lse, dout, mode, bias, causal, scale, False, True)
        extra = [('dtable', dtab, rdtab)]
    else:
        ro, rlse, rdq, rdk, rdv, rdsl, rdsr = reference(q, k, v, dout, mode, bias, causal, scale)
        dq, dk, dv, dsl, dsr = bwd(q, k, v, o, lse, dout, mode, bias, causal, scale, mode == 'Linear')
    errs = {}
    for name, a, r in [('o', o, ro), ('lse', lse, rlse), ('dq', dq, rdq), ('dk', dk, rdk), ('dv', dv, rdv)] + \
            ([('dsl', dsl, rdsl), ('dsr', dsr, rdsr)] if mode == 'Linear' else []) + extra:
        if np.isnan(a).any():
            errs[name] = float('nan')
        else:
            errs[name] = float(np.abs(a - r).max() / (np.abs(r).max() + 1e-3))
    return errs

if __name__ == '__main__':
    H = 4
    alibi = np.array([geometric(h, H) for h in range(H)], np.float32)
    table = np.random.default_rng(5).standard_normal((H, 399)).astype(np.float32)
    configs = [
        ('None', {}, True), ('None', {}, False),
        ('AlibiCausal', {}, True), ('AlibiSymmetric', {}, False), ('AlibiNonsymmetric', {}, False),
        ('AlibiSymmetric', {'left': alibi, 'right': alibi * 0.5}, False),
        ('Linear', {'left': alibi * 1.5, 'right': alibi * 0.7, 'look_left': [True, False, True, False], 'look_right': [False, True, True, False]}, False),
        ('Linear', {'left': alibi, 'right': alibi * 0.7, 'look_left': [True] * 4, 'look_right': [True] * 4}, False),
        ('Linear', {'left': alibi, 'right': alibi, 'look_left': [True] * 4, 'look_right': [True] * 4}, True),
        # A table of offsets j - i up to 199 tokens: both sides, and (causal) only j - i <= 0, so
        # that the clamp of the masked entries is exercised.
        ('Offsets', {'table': table, 'origin': 199}, False),
        ('Offsets', {'table': np.ascontiguousarray(table[:, :200]), 'origin': 199}, True),
    ]
    Ts = [int(x) for x in sys.argv[1].split(',')] if len(sys.argv) > 1 else [1, 17, 70, 130]
    Ds = [int(x) for x in sys.argv[2].split(',')] if len(sys.argv) > 2 else [64]
    MFs = [int(x) for x in sys.argv[3].split(',')] if len(sys.argv) > 3 else [1, 2]
    worst = 0
    for (mode, bias, causal), T, D, MF in itertools.product(configs, Ts, Ds, MFs):
        e = run(mode, bias, causal, 1, H, T, D, seed=T * 7 + D, MF=MF)
        worst = max([worst] + [x if not math.isnan(x) else 1e9 for x in e.values()])
        print(f"{mode:18s} causal={causal!s:5} T={T:4d} D={D:3d} rows={64 * MF:3d} " + " ".join(f"{k}={v:.1e}" for k, v in e.items()), flush=True)
    print("worst error relative to the reference scale:", worst, "(fp16 operands: expect ~1e-3)")
    sys.exit(0 if worst < 5e-3 else 1)
