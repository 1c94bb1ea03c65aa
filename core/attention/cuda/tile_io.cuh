// Moving (rows x D) tiles of a (T, D) slice between global and shared memory, 16 bytes per
// thread and access, consecutive threads on consecutive 16-byte pieces of a row (coalesced).
// Rows at or past T are zero-filled on load and skipped on store.
//
// Shared tiles are row-major with a row stride of D + 8 elements: the 16-byte shift between
// rows puts the 8 row addresses of every ldmatrix on 8 different 4-bank groups, so the
// ldmatrix reads (and these 16-byte accesses) are free of bank conflicts.
#pragma once

#include "core/attention/cuda/mma.cuh"

namespace extrap::cuda {

template <int kRows, int kHeadDim, int kThreads, class Element>
__device__ __forceinline__ void load_tile_async(Element* smem, int smem_stride, const Element* gmem,
                                                int64_t row_stride, int row0, int seq_len,
                                                int tid) {
  constexpr int kChunksPerRow = kHeadDim / 8;  // 8 elements = 16 bytes
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int c = tid + it * kThreads;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = row0 + r < seq_len;
    const Element* src = valid ? gmem + (row0 + r) * row_stride + col : gmem;
    cp_async_16(smem + r * smem_stride + col, src, valid);
  }
}

template <int kRows, int kHeadDim, int kThreads, class Element>
__device__ __forceinline__ void store_tile(Element* gmem, int64_t row_stride, const Element* smem,
                                           int smem_stride, int row0, int seq_len, int tid) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int c = tid + it * kThreads;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    if (row0 + r < seq_len)
      *reinterpret_cast<uint4*>(gmem + (row0 + r) * row_stride + col) =
          *reinterpret_cast<const uint4*>(smem + r * smem_stride + col);
  }
}

// Writes one warp's 16 x (8 * kNTiles) fp32 accumulator (mma layout, rows g and g + 8),
// times `scale`, into a shared tile as 16-bit elements, starting at row `row0` of the tile.
template <class Element, int kNTiles>
__device__ __forceinline__ void store_accumulator(Element* smem, int smem_stride, int row0,
                                                  const float (&acc)[kNTiles][4], float scale0,
                                                  float scale1, int lane) {
  using Traits = ElementTraits<Element>;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const int col = nt * 8 + 2 * t;
    *reinterpret_cast<uint32_t*>(smem + (row0 + g) * smem_stride + col) =
        Traits::pack(acc[nt][0] * scale0, acc[nt][1] * scale0);
    *reinterpret_cast<uint32_t*>(smem + (row0 + g + 8) * smem_stride + col) =
        Traits::pack(acc[nt][2] * scale1, acc[nt][3] * scale1);
  }
}

}  // namespace extrap::cuda
