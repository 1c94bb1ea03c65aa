// Fused attention, backward pass (FlashAttention-2 schedule): gradients of q, k, v and, for
// BiasMode::Linear, of the per-head slopes, recomputing the probabilities from the saved
// log-sum-exp instead of storing them.
//
// Three kernels:
//   1. delta_i = sum_d dO[i, d] * O[i, d]                              (flash_bwd_delta_kernel)
//   2. per 64-key block: for every visible 64-query tile           (flash_bwd_kernel)
//        S^T = K Q^T, P^T = 2^(logit - lse)        (recomputed, base 2, same tile_logits)
//        dV += P^T dO
//        dP^T = V dO^T, dS^T = P^T * (dP^T - delta)
//        dK += dS^T Q
//        dQ += dS K   -> fp32 atomics (float4 by default) into dq_accum (dS^T goes
//                        through shared memory)
//        dslope_left  -= sum_{j <= i} dS (i - j),  dslope_right -= sum_{j > i} dS (j - i)
//        doffsets[j - i] += dS                       (BiasMode::Offsets: per tile in shared
//                        memory, then one atomic per offset of the tile)
//      The block's 4 warps own 16 keys each (the rows of S^T), so P^T and dS^T stay in
//      registers as the A operands of dV and dK (mma.cuh). dK and dV are scaled and written
//      once at the end; the slope gradients are reduced over the block, then one atomicAdd.
//   3. dQ = dq_accum * scale, converted to the input type        (flash_bwd_convert_dq_kernel)
#include "core/attention/cuda/alibi.cuh"
#include "core/attention/cuda/flash_launch.cuh"
#include "core/attention/cuda/mask.cuh"
#include "core/attention/cuda/mma.cuh"
#include "core/attention/cuda/tile_io.cuh"

#include <stdexcept>
#include <string>

namespace extrap::cuda {
namespace {

constexpr int kAuxThreads = 128;  // threads per block of the delta and convert kernels

// delta[bh, i] = sum_d dO[i, d] * O[i, d], fp32. kHeadDim / 8 threads per row, 16 bytes each.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kAuxThreads) flash_bwd_delta_kernel(const FlashBwdParams p) {
  using Traits = ElementTraits<Element>;
  constexpr int kThreadsPerRow = kHeadDim / 8, kRowsPerBlock = kAuxThreads / kThreadsPerRow;
  const int seq_len = p.fwd.seq_len;
  const int64_t rows = static_cast<int64_t>(p.fwd.batch) * p.fwd.heads * seq_len;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int col = (threadIdx.x % kThreadsPerRow) * 8;
  float sum = 0.f;
  if (row < rows) {
    const int i = static_cast<int>(row % seq_len);
    const int64_t bh = row / seq_len;
    const int head = static_cast<int>(bh % p.fwd.heads), batch = static_cast<int>(bh / p.fwd.heads);
    const auto* o = static_cast<const Element*>(p.fwd.o.data) + batch * p.fwd.o.batch_stride +
                    head * p.fwd.o.head_stride + i * p.fwd.o.row_stride + col;
    const auto* dout = static_cast<const Element*>(p.dout.data) + batch * p.dout.batch_stride +
                       head * p.dout.head_stride + i * p.dout.row_stride + col;
    const uint4 ov = *reinterpret_cast<const uint4*>(o);
    const uint4 dv = *reinterpret_cast<const uint4*>(dout);
    const uint32_t o_words[4] = {ov.x, ov.y, ov.z, ov.w};
    const uint32_t d_words[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 a = Traits::unpack(o_words[w]), b = Traits::unpack(d_words[w]);
      sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
  }
  // The kThreadsPerRow lanes of a row are consecutive and aligned within the warp.
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (row < rows && threadIdx.x % kThreadsPerRow == 0) p.delta[row] = sum;
}

// dQ = dq_accum * scale, written in the input type; 8 elements per thread.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kAuxThreads) flash_bwd_convert_dq_kernel(const FlashBwdParams p) {
  using Traits = ElementTraits<Element>;
  constexpr int kThreadsPerRow = kHeadDim / 8;
  const int seq_len = p.fwd.seq_len;
  const int64_t rows = static_cast<int64_t>(p.fwd.batch) * p.fwd.heads * seq_len;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kAuxThreads + threadIdx.x;
  const int64_t row = index / kThreadsPerRow;
  if (row >= rows) return;
  const int col = static_cast<int>(index % kThreadsPerRow) * 8;
  const int i = static_cast<int>(row % seq_len);
  const int64_t bh = row / seq_len;
  const int head = static_cast<int>(bh % p.fwd.heads), batch = static_cast<int>(bh / p.fwd.heads);
  const float* src = p.dq_accum + row * kHeadDim + col;
  const float4 lo = *reinterpret_cast<const float4*>(src);
  const float4 hi = *reinterpret_cast<const float4*>(src + 4);
  const float scale = p.fwd.softmax_scale;
  const uint4 out = {Traits::pack(lo.x * scale, lo.y * scale), Traits::pack(lo.z * scale, lo.w * scale),
                     Traits::pack(hi.x * scale, hi.y * scale), Traits::pack(hi.z * scale, hi.w * scale)};
  auto* dq = static_cast<Element*>(p.dq.data) + batch * p.dq.batch_stride + head * p.dq.head_stride +
             i * p.dq.row_stride + col;
  *reinterpret_cast<uint4*>(dq) = out;
}

// Adds one warp's dQ fragment (rows warp_row + g and + 8, columns col0 + 8 nt + 2t and + 1:
// the mma accumulator layout, mma.cuh) into dq_accum, with fp32 atomics of `width` floats (1, 2
// or 4; sm_90 has float2 and float4 atomicAdd). For 4, lanes t and t ^ 1 first swap halves
// (one shuffle a value), so that the even lane holds four consecutive columns of row g and the
// odd lane four of row g + 8; the column is then a multiple of 4 (16-byte aligned rows).
template <int kHeadDim, int kTiles>
__device__ __forceinline__ void add_dq(float* dq_accum, const float (&dq)[kTiles][4], int warp_row, int col0,
                                       int seq_len, int width, int g, int t) {
  const int row_lo = warp_row + g, row_hi = warp_row + g + 8;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const int col = col0 + nt * 8 + 2 * t;
    if (width == 4) {
      const bool even = t % 2 == 0;
      // The even lane sends its row g + 8 pair, the odd lane its row g pair.
      const float got0 = __shfl_xor_sync(0xffffffffu, even ? dq[nt][2] : dq[nt][0], 1);
      const float got1 = __shfl_xor_sync(0xffffffffu, even ? dq[nt][3] : dq[nt][1], 1);
      const int row = even ? row_lo : row_hi;
      if (row < seq_len) {
        const float4 value = even ? make_float4(dq[nt][0], dq[nt][1], got0, got1)
                                  : make_float4(got0, got1, dq[nt][2], dq[nt][3]);
        atomicAdd(reinterpret_cast<float4*>(dq_accum + static_cast<int64_t>(row) * kHeadDim + (even ? col : col - 2)),
                  value);
      }
    } else if (width == 2) {
      if (row_lo < seq_len)
        atomicAdd(reinterpret_cast<float2*>(dq_accum + static_cast<int64_t>(row_lo) * kHeadDim + col),
                  make_float2(dq[nt][0], dq[nt][1]));
      if (row_hi < seq_len)
        atomicAdd(reinterpret_cast<float2*>(dq_accum + static_cast<int64_t>(row_hi) * kHeadDim + col),
                  make_float2(dq[nt][2], dq[nt][3]));
    } else {
      if (row_lo < seq_len) {
        float* dst = dq_accum + static_cast<int64_t>(row_lo) * kHeadDim + col;
        atomicAdd(dst, dq[nt][0]);
        atomicAdd(dst + 1, dq[nt][1]);
      }
      if (row_hi < seq_len) {
        float* dst = dq_accum + static_cast<int64_t>(row_hi) * kHeadDim + col;
        atomicAdd(dst, dq[nt][2]);
        atomicAdd(dst + 1, dq[nt][3]);
      }
    }
  }
}

// Stages query tile m_block's Q and dO (cp.async, one group) and its log-sum-exp (times
// log2(e)) and delta (plain stores) into shared memory.
template <int kBlockM, int kHeadDim, int kThreads, class Element>
__device__ __forceinline__ void load_query_tile(const FlashBwdParams& p, Element* sQ, Element* sdO,
                                                int stride, float* sLse, float* sDelta,
                                                const Element* q, const Element* dout,
                                                const float* lse, const float* delta, int row0,
                                                int tid) {
  const int seq_len = p.fwd.seq_len;
  load_tile_async<kBlockM, kHeadDim, kThreads>(sQ, stride, q, p.fwd.q.row_stride, row0, seq_len, tid);
  load_tile_async<kBlockM, kHeadDim, kThreads>(sdO, stride, dout, p.dout.row_stride, row0, seq_len, tid);
  cp_async_commit();
  if (tid < kBlockM) {
    const int i = row0 + tid;
    // Queries past T: +inf log-sum-exp makes their probabilities exactly 0.
    sLse[tid] = i < seq_len ? lse[i] * kLog2e : INFINITY;
    sDelta[tid] = i < seq_len ? delta[i] : 0.f;
  }
}

template <class Element, int kHeadDim, BiasMode kMode>
__global__ void __launch_bounds__(BwdTiles<Element, kHeadDim>::kThreads)
    flash_bwd_kernel(const FlashBwdParams p) {
  using Tiles = BwdTiles<Element, kHeadDim>;
  using Traits = ElementTraits<Element>;
  constexpr int kBlockM = Tiles::kBlockM, kBlockN = Tiles::kBlockN, kStride = Tiles::kStride;
  constexpr int kDsStride = Tiles::kDsStride, kThreads = Tiles::kThreads;
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of S^T = K Q^T and dP^T = V dO^T
  constexpr int kQTiles = kBlockM / 8;    // n-tiles of one warp's S^T (16 keys x 64 queries)
  constexpr int kDTiles = kHeadDim / 8;   // n-tiles of one warp's dK, dV (16 keys x D)
  constexpr int kDqChunk = 64;            // dQ columns per pass (bounds live registers)
  constexpr int kDqTiles = kDqChunk / 8;
  static_assert(kHeadDim % kDqChunk == 0, "head dim must be a multiple of the dQ chunk");

  extern __shared__ __align__(16) unsigned char smem[];
  Element* sK = reinterpret_cast<Element*>(smem);  // (64 keys, D)
  Element* sV = sK + kBlockN * kStride;            // (64 keys, D)
  Element* sQ = sV + kBlockN * kStride;            // (64 queries, D); dK staging at the end
  Element* sdO = sQ + kBlockM * kStride;           // (64 queries, D); dV staging at the end
  Element* sdS = sdO + kBlockM * kStride;          // (64 keys, 64 queries): dS^T
  float* sLse = reinterpret_cast<float*>(sdS + kBlockN * kDsStride);  // (64,) lse * log2(e)
  float* sDelta = sLse + kBlockM;                                     // (64,)
  float* sOffsetGrad = sDelta + kBlockM;  // (kOffsetSlots,): Offsets, a tile's dS per j - i

  const FlashFwdParams& f = p.fwd;
  const int seq_len = f.seq_len;
  const int n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int col0 = n_block * kBlockN;
  const int col_end = min(col0 + kBlockN, seq_len);
  const int warp_col0 = col0 + 16 * warp;  // this warp's first key

  const auto* q = static_cast<const Element*>(f.q.data) + batch * f.q.batch_stride + head * f.q.head_stride;
  const auto* k = static_cast<const Element*>(f.k.data) + batch * f.k.batch_stride + head * f.k.head_stride;
  const auto* v = static_cast<const Element*>(f.v.data) + batch * f.v.batch_stride + head * f.v.head_stride;
  const auto* dout = static_cast<const Element*>(p.dout.data) + batch * p.dout.batch_stride +
                     head * p.dout.head_stride;
  auto* dk = static_cast<Element*>(p.dk.data) + batch * p.dk.batch_stride + head * p.dk.head_stride;
  auto* dv = static_cast<Element*>(p.dv.data) + batch * p.dv.batch_stride + head * p.dv.head_stride;
  const int64_t bh = static_cast<int64_t>(batch) * f.heads + head;
  const float* lse = f.lse + bh * seq_len;
  const float* delta = p.delta + bh * seq_len;
  float* dq_accum = p.dq_accum + bh * seq_len * kHeadDim;

  const HeadBias hb = make_head_bias<kMode>(f.bias, head, f.heads, f.causal);
  int query_begin, query_end;
  visible_queries(hb, col0, col_end, seq_len, &query_begin, &query_end);
  const int m_first = query_begin / kBlockM, m_last = (query_end - 1) / kBlockM;
  const float scale_log2 = f.softmax_scale * kLog2e;

  load_tile_async<kBlockN, kHeadDim, kThreads>(sK, kStride, k, f.k.row_stride, col0, seq_len, tid);
  load_tile_async<kBlockN, kHeadDim, kThreads>(sV, kStride, v, f.v.row_stride, col0, seq_len, tid);
  cp_async_commit();

  float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
#pragma unroll
  for (int nt = 0; nt < kDTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.f;
  float dslope_left = 0.f, dslope_right = 0.f;  // this thread's share
  // Offsets: the gradient's row for this head at offset 0; slot s of a tile holds offset
  // j - i = col0 - row0 - (kBlockM - 1) + s. Zeroed here, and after each flush.
  float* doffsets = nullptr;
  if constexpr (kMode == BiasMode::Offsets) {
    if (p.doffsets != nullptr)
      doffsets = p.doffsets + static_cast<int64_t>(head) * f.bias.offsets_len + f.bias.offsets_origin;
    if (tid < Tiles::kOffsetSlots) sOffsetGrad[tid] = 0.f;
  }

  // Key positions of this lane's rows of S^T (keys g and g + 8 of the warp), exact as floats.
  const float key_pos[2] = {static_cast<float>(warp_col0 + g), static_cast<float>(warp_col0 + g + 8)};

  for (int m_block = m_first; m_block <= m_last; ++m_block) {
    const int row0 = m_block * kBlockM;
    load_query_tile<kBlockM, kHeadDim, kThreads>(p, sQ, sdO, kStride, sLse, sDelta, q, dout, lse, delta,
                                                 row0, tid);
    cp_async_wait<0>();
    __syncthreads();

    // S^T = K Q^T: this warp's 16 keys x 64 queries.
    float pt[kQTiles][4];  // S^T, then P^T
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) pt[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t ka[4];  // A = this warp's K rows
      ldmatrix_x4(ka, sK + (16 * warp + lane % 16) * kStride + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < kQTiles / 2; ++np) {
        uint32_t qb[4];  // B = Q^T for query n-tiles 2np and 2np + 1
        ldmatrix_x4(qb, sQ + (np * 16 + lane % 8 + (lane / 16) * 8) * kStride + ks * 16 +
                            ((lane / 8) % 2) * 8);
        Traits::mma(pt[2 * np], ka, qb[0], qb[1]);
        Traits::mma(pt[2 * np + 1], ka, qb[2], qb[3]);
      }
    }

    // P^T = 2^(logit - lse), 0 where invisible. Row of S^T = key j, column = query i.
    tile_logits<kMode, false>(pt, hb, scale_log2, key_pos, static_cast<float>(row0 + 2 * t),
                              tile_side(row0, row0 + kBlockM, warp_col0, warp_col0 + 16));
    const bool masked = tile_needs_mask(hb, row0, row0 + kBlockM, warp_col0, warp_col0 + 16, seq_len);
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = warp_col0 + g + 8 * (e / 2);
        const int qi = nt * 8 + 2 * t + (e % 2);
        const int i = row0 + qi;
        pt[nt][e] = (masked && !score_visible(hb, i, j, seq_len)) ? 0.f : exp2f(pt[nt][e] - sLse[qi]);
      }
    }

    // dV += P^T dO: k-step kj covers queries 16kj .. 16kj + 15.
#pragma unroll
    for (int kj = 0; kj < kBlockM / 16; ++kj) {
      const uint32_t pa[4] = {Traits::pack(pt[2 * kj][0], pt[2 * kj][1]),
                              Traits::pack(pt[2 * kj][2], pt[2 * kj][3]),
                              Traits::pack(pt[2 * kj + 1][0], pt[2 * kj + 1][1]),
                              Traits::pack(pt[2 * kj + 1][2], pt[2 * kj + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t ob[4];  // B = dO for head-dim n-tiles 2dp and 2dp + 1
        ldmatrix_x4_trans(ob, sdO + (kj * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + dp * 16 +
                                  (lane / 16) * 8);
        Traits::mma(acc_dv[2 * dp], pa, ob[0], ob[1]);
        Traits::mma(acc_dv[2 * dp + 1], pa, ob[2], ob[3]);
      }
    }

    // dP^T = V dO^T: this warp's 16 keys x 64 queries.
    float ds[kQTiles][4];  // dP^T, then dS^T
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t va[4];  // A = this warp's V rows
      ldmatrix_x4(va, sV + (16 * warp + lane % 16) * kStride + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < kQTiles / 2; ++np) {
        uint32_t ob[4];  // B = dO^T for query n-tiles 2np and 2np + 1
        ldmatrix_x4(ob, sdO + (np * 16 + lane % 8 + (lane / 16) * 8) * kStride + ks * 16 +
                            ((lane / 8) % 2) * 8);
        Traits::mma(ds[2 * np], va, ob[0], ob[1]);
        Traits::mma(ds[2 * np + 1], va, ob[2], ob[3]);
      }
    }

    // dS^T = P^T (dP^T - delta); the slope gradients are sums of dS times -distance.
    const float query_pos0 = static_cast<float>(row0);
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * t + (e % 2);
        ds[nt][e] = pt[nt][e] * (ds[nt][e] - sDelta[qi]);
        if constexpr (kMode == BiasMode::Offsets) {
          // Slot of j - i: (16 warp + g + 8 (e / 2)) - qi + kBlockM - 1, in [0, kBlockM + kBlockN - 2].
          if (doffsets != nullptr) atomicAdd(sOffsetGrad + (16 * warp + g + 8 * (e / 2) - qi + kBlockM - 1), ds[nt][e]);
        }
        if constexpr (kMode == BiasMode::Linear) {
          // i - j, exact as a float (no integer conversion per score).
          const float distance = query_pos0 + static_cast<float>(qi) - key_pos[e / 2];
          if (distance >= 0.f)
            dslope_left -= ds[nt][e] * distance;
          else
            dslope_right += ds[nt][e] * distance;
        }
      }
    }

    // dK += dS^T Q (unscaled; the softmax scale is applied once at the end).
#pragma unroll
    for (int kj = 0; kj < kBlockM / 16; ++kj) {
      const uint32_t da[4] = {Traits::pack(ds[2 * kj][0], ds[2 * kj][1]),
                              Traits::pack(ds[2 * kj][2], ds[2 * kj][3]),
                              Traits::pack(ds[2 * kj + 1][0], ds[2 * kj + 1][1]),
                              Traits::pack(ds[2 * kj + 1][2], ds[2 * kj + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t qb[4];  // B = Q for head-dim n-tiles 2dp and 2dp + 1
        ldmatrix_x4_trans(qb, sQ + (kj * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + dp * 16 +
                                  (lane / 16) * 8);
        Traits::mma(acc_dk[2 * dp], da, qb[0], qb[1]);
        Traits::mma(acc_dk[2 * dp + 1], da, qb[2], qb[3]);
      }
      // This warp's dS^T rows (keys 16w + g, 16w + g + 8) to shared memory for dQ.
      *reinterpret_cast<uint32_t*>(sdS + (16 * warp + g) * kDsStride + 16 * kj + 2 * t) = da[0];
      *reinterpret_cast<uint32_t*>(sdS + (16 * warp + g + 8) * kDsStride + 16 * kj + 2 * t) = da[1];
      *reinterpret_cast<uint32_t*>(sdS + (16 * warp + g) * kDsStride + 16 * kj + 8 + 2 * t) = da[2];
      *reinterpret_cast<uint32_t*>(sdS + (16 * warp + g + 8) * kDsStride + 16 * kj + 8 + 2 * t) = da[3];
    }
    __syncthreads();  // all of dS^T is in shared memory (and, Offsets, the tile's dS per offset)
    if constexpr (kMode == BiasMode::Offsets) {
      // One atomic per offset the tile holds; masked scores added 0, and offsets outside the
      // table are only ever masked ones.
      if (doffsets != nullptr && tid < kBlockM + kBlockN - 1) {
        const int offset = col0 - row0 - (kBlockM - 1) + tid;
        const float value = sOffsetGrad[tid];
        sOffsetGrad[tid] = 0.f;  // before the next tile's additions: barriers lie between
        if (value != 0.f && offset >= hb.offset_lo && offset <= hb.offset_hi) atomicAdd(doffsets + offset, value);
      }
    }

    // dQ[warp's 16 queries] += dS K, k-steps over the block's 64 keys; fp32 atomics.
    const int warp_row = row0 + 16 * warp;
#pragma unroll
    for (int chunk = 0; chunk < kHeadDim / kDqChunk; ++chunk) {
      float dq[kDqTiles][4];
#pragma unroll
      for (int nt = 0; nt < kDqTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[nt][e] = 0.f;
#pragma unroll
      for (int kj = 0; kj < kBlockN / 16; ++kj) {
        uint32_t sa[4];  // A = dS (queries x keys) read transposed from dS^T
        ldmatrix_x4_trans(sa, sdS + (kj * 16 + lane % 8 + (lane / 16) * 8) * kDsStride + 16 * warp +
                                  ((lane / 8) % 2) * 8);
#pragma unroll
        for (int dp = 0; dp < kDqTiles / 2; ++dp) {
          uint32_t kb[4];  // B = K for head-dim n-tiles 2dp and 2dp + 1 of the chunk
          ldmatrix_x4_trans(kb, sK + (kj * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride +
                                    chunk * kDqChunk + dp * 16 + (lane / 16) * 8);
          Traits::mma(dq[2 * dp], sa, kb[0], kb[1]);
          Traits::mma(dq[2 * dp + 1], sa, kb[2], kb[3]);
        }
      }
      add_dq<kHeadDim>(dq_accum, dq, warp_row, chunk * kDqChunk, seq_len, p.dq_atomic_width, g, t);
    }
    __syncthreads();  // sQ, sdO, sdS, sLse and sDelta are free for the next query tile
  }

  // dK (times the softmax scale) and dV: stage in sQ / sdO, then coalesced stores.
  store_accumulator<Element, kDTiles>(sQ, kStride, 16 * warp, acc_dk, f.softmax_scale,
                                      f.softmax_scale, lane);
  store_accumulator<Element, kDTiles>(sdO, kStride, 16 * warp, acc_dv, 1.f, 1.f, lane);

  if constexpr (kMode == BiasMode::Linear) {
    if (p.dslopes_left != nullptr) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        dslope_left += __shfl_xor_sync(0xffffffffu, dslope_left, offset);
        dslope_right += __shfl_xor_sync(0xffffffffu, dslope_right, offset);
      }
      // One partial per warp in sLse (free now), then one atomic per block and slope.
      if (lane == 0) {
        sLse[warp] = dslope_left;
        sDelta[warp] = dslope_right;
      }
    }
  }
  __syncthreads();
  store_tile<kBlockN, kHeadDim, kThreads>(dk, p.dk.row_stride, sQ, kStride, col0, seq_len, tid);
  store_tile<kBlockN, kHeadDim, kThreads>(dv, p.dv.row_stride, sdO, kStride, col0, seq_len, tid);
  if constexpr (kMode == BiasMode::Linear) {
    if (p.dslopes_left != nullptr && tid == 0) {
      float left = 0.f, right = 0.f;
#pragma unroll
      for (int w = 0; w < Tiles::kWarps; ++w) {
        left += sLse[w];
        right += sDelta[w];
      }
      atomicAdd(p.dslopes_left + head, left);
      atomicAdd(p.dslopes_right + head, right);
    }
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("flash attention backward, ") + what + ": " +
                             cudaGetErrorString(status));
}

}  // namespace

template <class Element, int kHeadDim, BiasMode kMode>
void launch_flash_bwd(const FlashBwdParams& params, cudaStream_t stream) {
  using Tiles = BwdTiles<Element, kHeadDim>;
  const FlashFwdParams& f = params.fwd;
  const int64_t rows = static_cast<int64_t>(f.batch) * f.heads * f.seq_len;

  check(cudaMemsetAsync(params.dq_accum, 0, rows * kHeadDim * sizeof(float), stream), "zeroing dq");
  constexpr int kRowsPerBlock = kAuxThreads / (kHeadDim / 8);
  flash_bwd_delta_kernel<Element, kHeadDim>
      <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kAuxThreads, 0, stream>>>(params);
  check(cudaGetLastError(), "delta kernel");

  auto kernel = flash_bwd_kernel<Element, kHeadDim, kMode>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tiles::kSmemBytes),
        "shared memory limit");
  const dim3 grid((f.seq_len + Tiles::kBlockN - 1) / Tiles::kBlockN, f.heads, f.batch);
  kernel<<<grid, Tiles::kThreads, Tiles::kSmemBytes, stream>>>(params);
  check(cudaGetLastError(), "main kernel");

  const int64_t threads = rows * (kHeadDim / 8);
  flash_bwd_convert_dq_kernel<Element, kHeadDim>
      <<<static_cast<unsigned>((threads + kAuxThreads - 1) / kAuxThreads), kAuxThreads, 0, stream>>>(params);
  check(cudaGetLastError(), "dq conversion");
}

#define EXTRAP_INSTANTIATE_BWD(Element, HeadDim, Mode) \
  template void launch_flash_bwd<Element, HeadDim, Mode>(const FlashBwdParams&, cudaStream_t);
EXTRAP_FLASH_CONFIGS(EXTRAP_INSTANTIATE_BWD)
#undef EXTRAP_INSTANTIATE_BWD

}  // namespace extrap::cuda
