// Fused attention, forward pass: O = softmax(Q K^T * scale + bias) V and the log-sum-exp
// of every score row, without materialising scores or bias (FlashAttention-2 schedule).
//
// Grid: (query blocks of 64, heads, batch); block: 4 warps, warp w owns query rows
// 16w .. 16w + 15 of the block. For each visible 64-key tile: S = Q K^T on tensor cores
// (Q fragments kept in registers), bias and mask in registers, online softmax, O += P V with
// P taken straight from the S accumulators (mma.cuh). K of the next tile loads while P V
// runs; V of a tile loads while its S is computed.
#include "core/attention/cuda/alibi.cuh"
#include "core/attention/cuda/flash_launch.cuh"
#include "core/attention/cuda/mask.cuh"
#include "core/attention/cuda/mma.cuh"
#include "core/attention/cuda/softmax.cuh"
#include "core/attention/cuda/tile_io.cuh"

#include <stdexcept>
#include <string>

namespace extrap::cuda {
namespace {

template <class Element, int kHeadDim, BiasMode kMode>
__global__ void __launch_bounds__(FwdTiles<Element, kHeadDim>::kThreads)
    flash_fwd_kernel(const FlashFwdParams p) {
  using Tiles = FwdTiles<Element, kHeadDim>;
  using Traits = ElementTraits<Element>;
  constexpr int kBlockM = Tiles::kBlockM, kBlockN = Tiles::kBlockN, kStride = Tiles::kStride;
  constexpr int kThreads = Tiles::kThreads;
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of S = Q K^T
  constexpr int kSTiles = kBlockN / 8;    // n-tiles of one warp's S (16 x 64)
  constexpr int kOTiles = kHeadDim / 8;   // n-tiles of one warp's O (16 x D)

  extern __shared__ __align__(16) unsigned char smem[];
  Element* sQ = reinterpret_cast<Element*>(smem);  // (64, D); later the output staging tile
  Element* sK = sQ + kBlockM * kStride;            // (64, D)
  Element* sV = sK + kBlockN * kStride;            // (64, D)

  const int seq_len = p.seq_len;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks start first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = m_block * kBlockM;
  const int row_end = min(row0 + kBlockM, seq_len);
  const int warp_row0 = row0 + 16 * warp;

  const auto* q = static_cast<const Element*>(p.q.data) + batch * p.q.batch_stride + head * p.q.head_stride;
  const auto* k = static_cast<const Element*>(p.k.data) + batch * p.k.batch_stride + head * p.k.head_stride;
  const auto* v = static_cast<const Element*>(p.v.data) + batch * p.v.batch_stride + head * p.v.head_stride;
  auto* o = static_cast<Element*>(p.o.data) + batch * p.o.batch_stride + head * p.o.head_stride;
  float* lse = p.lse + (static_cast<int64_t>(batch) * p.heads + head) * seq_len;

  const HeadBias hb = make_head_bias<kMode>(p.bias, head, p.heads, p.causal);
  int key_begin, key_end;
  visible_keys(hb, row0, row_end, seq_len, &key_begin, &key_end);
  const int n_first = key_begin / kBlockN, n_last = (key_end - 1) / kBlockN;
  const float scale_log2 = p.softmax_scale * kLog2e;

  load_tile_async<kBlockM, kHeadDim, kThreads>(sQ, kStride, q, p.q.row_stride, row0, seq_len, tid);
  load_tile_async<kBlockN, kHeadDim, kThreads>(sK, kStride, k, p.k.row_stride, n_first * kBlockN,
                                               seq_len, tid);
  cp_async_commit();

  uint32_t q_frag[kKSteps][4];
  float acc_o[kOTiles][4];
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[nt][e] = 0.f;
  OnlineSoftmax<kSTiles> softmax;

  for (int n_block = n_first; n_block <= n_last; ++n_block) {
    const int col0 = n_block * kBlockN;
    load_tile_async<kBlockN, kHeadDim, kThreads>(sV, kStride, v, p.v.row_stride, col0, seq_len, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and this K have landed; V may still be in flight
    __syncthreads();

    if (n_block == n_first) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldmatrix_x4(q_frag[ks], sQ + (16 * warp + lane % 16) * kStride + ks * 16 + (lane / 16) * 8);
    }

    // S = Q K^T: this warp's 16 rows x 64 keys.
    float s[kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];  // B = K^T for key n-tiles 2np and 2np + 1
        ldmatrix_x4(kb, sK + (np * 16 + lane % 8 + (lane / 16) * 8) * kStride + ks * 16 +
                            ((lane / 8) % 2) * 8);
        Traits::mma(s[2 * np], q_frag[ks], kb[0], kb[1]);
        Traits::mma(s[2 * np + 1], q_frag[ks], kb[2], kb[3]);
      }
    }

    // Base-2 logits with bias; invisible scores to -inf.
    const bool masked = tile_needs_mask(hb, warp_row0, warp_row0 + 16, col0, col0 + kBlockN, seq_len);
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = warp_row0 + g + 8 * (e / 2);
        const int j = col0 + nt * 8 + 2 * t + (e % 2);
        s[nt][e] = logit_log2<kMode>(s[nt][e], scale_log2, hb, i, j);
        if (masked && !score_visible(hb, i, j, seq_len)) s[nt][e] = -INFINITY;
      }
    }

    float correction[2];
    softmax.update(s, correction);
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      acc_o[nt][0] *= correction[0];
      acc_o[nt][1] *= correction[0];
      acc_o[nt][2] *= correction[1];
      acc_o[nt][3] *= correction[1];
    }

    cp_async_wait<0>();  // V has landed
    __syncthreads();     // ... for every thread, and every warp is done reading sK
    if (n_block < n_last) {
      load_tile_async<kBlockN, kHeadDim, kThreads>(sK, kStride, k, p.k.row_stride, col0 + kBlockN,
                                                   seq_len, tid);
      cp_async_commit();
    }

    // O += P V: P (16 x 64) from the S accumulators, k-step kj covers keys 16kj .. 16kj + 15.
#pragma unroll
    for (int kj = 0; kj < kBlockN / 16; ++kj) {
      const uint32_t pa[4] = {Traits::pack(s[2 * kj][0], s[2 * kj][1]),
                              Traits::pack(s[2 * kj][2], s[2 * kj][3]),
                              Traits::pack(s[2 * kj + 1][0], s[2 * kj + 1][1]),
                              Traits::pack(s[2 * kj + 1][2], s[2 * kj + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t vb[4];  // B = V for head-dim n-tiles 2dp and 2dp + 1
        ldmatrix_x4_trans(vb, sV + (kj * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + dp * 16 +
                                  (lane / 16) * 8);
        Traits::mma(acc_o[2 * dp], pa, vb[0], vb[1]);
        Traits::mma(acc_o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done reading sV before the next tile overwrites it
  }

  float inv_sum[2], row_lse[2];
  softmax.finish(inv_sum, row_lse);

  // Stage O through shared memory (sQ, no longer read) for 16-byte coalesced stores.
  store_accumulator<Element, kOTiles>(sQ, kStride, 16 * warp, acc_o, inv_sum[0], inv_sum[1], lane);
  if (t == 0) {
    if (warp_row0 + g < seq_len) lse[warp_row0 + g] = row_lse[0];
    if (warp_row0 + g + 8 < seq_len) lse[warp_row0 + g + 8] = row_lse[1];
  }
  __syncthreads();
  store_tile<kBlockM, kHeadDim, kThreads>(o, p.o.row_stride, sQ, kStride, row0, seq_len, tid);
}

}  // namespace

template <class Element, int kHeadDim, BiasMode kMode>
void launch_flash_fwd(const FlashFwdParams& params, cudaStream_t stream) {
  using Tiles = FwdTiles<Element, kHeadDim>;
  auto kernel = flash_fwd_kernel<Element, kHeadDim, kMode>;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Tiles::kSmemBytes);
  if (status == cudaSuccess) {
    const dim3 grid((params.seq_len + Tiles::kBlockM - 1) / Tiles::kBlockM, params.heads,
                    params.batch);
    kernel<<<grid, Tiles::kThreads, Tiles::kSmemBytes, stream>>>(params);
    status = cudaGetLastError();
  }
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("flash attention forward: ") + cudaGetErrorString(status));
}

#define EXTRAP_INSTANTIATE_FWD(Element, HeadDim, Mode) \
  template void launch_flash_fwd<Element, HeadDim, Mode>(const FlashFwdParams&, cudaStream_t);
EXTRAP_FLASH_CONFIGS(EXTRAP_INSTANTIATE_FWD)
#undef EXTRAP_INSTANTIATE_FWD

}  // namespace extrap::cuda
