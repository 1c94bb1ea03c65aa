// Fused attention, forward pass: O = softmax(Q K^T * scale + bias) V and the log-sum-exp
// of every score row, without materialising scores or bias (FlashAttention-2 schedule).
//
// Grid: (query blocks of 64 kMFrags, heads, batch); block: 4 warps, warp w owns query rows
// 16 kMFrags w .. 16 kMFrags (w + 1) - 1 of the block, as kMFrags m-fragments of 16 rows.
// For each visible 64-key tile: S = Q K^T on tensor cores (each K fragment loaded once for
// all m-fragments; Q fragments kept in registers where they fit, FwdTiles), bias and mask in
// registers, online softmax, O += P V with P taken straight from the S accumulators
// (mma.cuh). K of the next tile loads while P V runs; V of a tile loads while its S is
// computed.
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

template <class Element, int kHeadDim, BiasMode kMode, int kMFrags>
__global__ void __launch_bounds__(FwdTiles<Element, kHeadDim, kMFrags>::kThreads)
    flash_fwd_kernel(const FlashFwdParams p) {
  using Tiles = FwdTiles<Element, kHeadDim, kMFrags>;
  using Traits = ElementTraits<Element>;
  constexpr int kBlockM = Tiles::kBlockM, kBlockN = Tiles::kBlockN, kStride = Tiles::kStride;
  constexpr int kThreads = Tiles::kThreads, kWarpRows = Tiles::kWarpRows;
  constexpr bool kQInRegisters = Tiles::kQInRegisters;
  constexpr int kKSteps = kHeadDim / 16;  // k-steps of S = Q K^T
  constexpr int kSTiles = kBlockN / 8;    // n-tiles of one m-fragment's S (16 x 64)
  constexpr int kOTiles = kHeadDim / 8;   // n-tiles of one m-fragment's O (16 x D)

  extern __shared__ __align__(16) unsigned char smem[];
  Element* sQ = reinterpret_cast<Element*>(smem);  // (kBlockM, D); later the output staging tile
  Element* sK = sQ + kBlockM * kStride;            // (64, D)
  Element* sV = sK + kBlockN * kStride;            // (64, D)

  const int seq_len = p.seq_len;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks start first
  const int head = blockIdx.y, batch = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = m_block * kBlockM;
  const int row_end = min(row0 + kBlockM, seq_len);
  const int warp_row0 = row0 + kWarpRows * warp;

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

  // Query positions of this lane's rows (g and g + 8 of each m-fragment), exact as floats.
  float row_pos[kMFrags][2];
#pragma unroll
  for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
    for (int r = 0; r < 2; ++r) row_pos[mf][r] = static_cast<float>(warp_row0 + 16 * mf + g + 8 * r);

  load_tile_async<kBlockM, kHeadDim, kThreads>(sQ, kStride, q, p.q.row_stride, row0, seq_len, tid);
  load_tile_async<kBlockN, kHeadDim, kThreads>(sK, kStride, k, p.k.row_stride, n_first * kBlockN,
                                               seq_len, tid);
  cp_async_commit();

  uint32_t q_frag[kQInRegisters ? kMFrags : 1][kQInRegisters ? kKSteps : 1][4];
  float acc_o[kMFrags][kOTiles][4];
#pragma unroll
  for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mf][nt][e] = 0.f;
  OnlineSoftmax<kSTiles> softmax[kMFrags];

  for (int n_block = n_first; n_block <= n_last; ++n_block) {
    const int col0 = n_block * kBlockN;
    load_tile_async<kBlockN, kHeadDim, kThreads>(sV, kStride, v, p.v.row_stride, col0, seq_len, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and this K have landed; V may still be in flight
    __syncthreads();

    if constexpr (kQInRegisters) {
      if (n_block == n_first) {
#pragma unroll
        for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
          for (int ks = 0; ks < kKSteps; ++ks)
            ldmatrix_x4(q_frag[mf][ks],
                        sQ + (kWarpRows * warp + 16 * mf + lane % 16) * kStride + ks * 16 + (lane / 16) * 8);
      }
    }

    // S = Q K^T: this warp's 16 kMFrags rows x 64 keys.
    float s[kMFrags][kSTiles][4];
#pragma unroll
    for (int mf = 0; mf < kMFrags; ++mf)
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mf][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t qa[kMFrags][4];  // A = this warp's Q rows, k-step ks
#pragma unroll
      for (int mf = 0; mf < kMFrags; ++mf) {
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int r = 0; r < 4; ++r) qa[mf][r] = q_frag[mf][ks][r];
        } else {
          ldmatrix_x4(qa[mf], sQ + (kWarpRows * warp + 16 * mf + lane % 16) * kStride + ks * 16 +
                                  (lane / 16) * 8);
        }
      }
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];  // B = K^T for key n-tiles 2np and 2np + 1
        ldmatrix_x4(kb, sK + (np * 16 + lane % 8 + (lane / 16) * 8) * kStride + ks * 16 +
                            ((lane / 8) % 2) * 8);
#pragma unroll
        for (int mf = 0; mf < kMFrags; ++mf) {
          Traits::mma(s[mf][2 * np], qa[mf], kb[0], kb[1]);
          Traits::mma(s[mf][2 * np + 1], qa[mf], kb[2], kb[3]);
        }
      }
    }

    // Base-2 logits with bias; invisible scores to -inf.
    const float col_pos0 = static_cast<float>(col0 + 2 * t);
#pragma unroll
    for (int mf = 0; mf < kMFrags; ++mf) {
      const int r0 = warp_row0 + 16 * mf;
      tile_logits<kMode, true>(s[mf], hb, scale_log2, row_pos[mf], col_pos0,
                               tile_side(r0, r0 + 16, col0, col0 + kBlockN));
      if (tile_needs_mask(hb, r0, r0 + 16, col0, col0 + kBlockN, seq_len)) {
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = r0 + g + 8 * (e / 2);
            const int j = col0 + nt * 8 + 2 * t + (e % 2);
            if (!score_visible(hb, i, j, seq_len)) s[mf][nt][e] = -INFINITY;
          }
      }
    }

    // Probabilities, packed to 16 bits at once as the A operands of P V (mma.cuh): k-step kj
    // covers keys 16kj .. 16kj + 15. Half the registers of S, which is dead from here.
    uint32_t pa[kMFrags][kBlockN / 16][4];
#pragma unroll
    for (int mf = 0; mf < kMFrags; ++mf) {
      float correction[2];
      softmax[mf].update(s[mf], correction);
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
        acc_o[mf][nt][0] *= correction[0];
        acc_o[mf][nt][1] *= correction[0];
        acc_o[mf][nt][2] *= correction[1];
        acc_o[mf][nt][3] *= correction[1];
      }
#pragma unroll
      for (int kj = 0; kj < kBlockN / 16; ++kj) {
        pa[mf][kj][0] = Traits::pack(s[mf][2 * kj][0], s[mf][2 * kj][1]);
        pa[mf][kj][1] = Traits::pack(s[mf][2 * kj][2], s[mf][2 * kj][3]);
        pa[mf][kj][2] = Traits::pack(s[mf][2 * kj + 1][0], s[mf][2 * kj + 1][1]);
        pa[mf][kj][3] = Traits::pack(s[mf][2 * kj + 1][2], s[mf][2 * kj + 1][3]);
      }
    }

    cp_async_wait<0>();  // V has landed
    __syncthreads();     // ... for every thread, and every warp is done reading sK
    if (n_block < n_last) {
      load_tile_async<kBlockN, kHeadDim, kThreads>(sK, kStride, k, p.k.row_stride, col0 + kBlockN,
                                                   seq_len, tid);
      cp_async_commit();
    }

    // O += P V; each V fragment serves every m-fragment.
#pragma unroll
    for (int kj = 0; kj < kBlockN / 16; ++kj) {
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t vb[4];  // B = V for head-dim n-tiles 2dp and 2dp + 1
        ldmatrix_x4_trans(vb, sV + (kj * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + dp * 16 +
                                  (lane / 16) * 8);
#pragma unroll
        for (int mf = 0; mf < kMFrags; ++mf) {
          Traits::mma(acc_o[mf][2 * dp], pa[mf][kj], vb[0], vb[1]);
          Traits::mma(acc_o[mf][2 * dp + 1], pa[mf][kj], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done reading sV before the next tile overwrites it
  }

  // Stage O through shared memory (this warp's own rows of sQ, which only it reads) for
  // 16-byte coalesced stores.
#pragma unroll
  for (int mf = 0; mf < kMFrags; ++mf) {
    float inv_sum[2], row_lse[2];
    softmax[mf].finish(inv_sum, row_lse);
    store_accumulator<Element, kOTiles>(sQ, kStride, kWarpRows * warp + 16 * mf, acc_o[mf],
                                        inv_sum[0], inv_sum[1], lane);
    const int r0 = warp_row0 + 16 * mf;
    if (t == 0) {
      if (r0 + g < seq_len) lse[r0 + g] = row_lse[0];
      if (r0 + g + 8 < seq_len) lse[r0 + g + 8] = row_lse[1];
    }
  }
  __syncthreads();
  store_tile<kBlockM, kHeadDim, kThreads>(o, p.o.row_stride, sQ, kStride, row0, seq_len, tid);
}

}  // namespace

template <class Element, int kHeadDim, BiasMode kMode, int kMFrags>
void launch_flash_fwd(const FlashFwdParams& params, cudaStream_t stream) {
  using Tiles = FwdTiles<Element, kHeadDim, kMFrags>;
  auto kernel = flash_fwd_kernel<Element, kHeadDim, kMode, kMFrags>;
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

#define EXTRAP_INSTANTIATE_FWD(Element, HeadDim, Mode)                                         \
  template void launch_flash_fwd<Element, HeadDim, Mode, 1>(const FlashFwdParams&, cudaStream_t); \
  template void launch_flash_fwd<Element, HeadDim, Mode, 2>(const FlashFwdParams&, cudaStream_t);
EXTRAP_FLASH_CONFIGS(EXTRAP_INSTANTIATE_FWD)
#undef EXTRAP_INSTANTIATE_FWD

}  // namespace extrap::cuda
