// Which scores are visible, and which tiles can skip the per-element check.
//
// A score (i, j) (query i, key j) is visible iff j < T and
//   j == i, or j < i and the head looks left, or j > i and it looks right (HeadBias, with
//   look_right already false for a causal call).
// The loops over tiles visit only tiles that hold at least one visible score; the element
// check runs only on tiles that hold at least one invisible one.
#pragma once

#include "core/attention/cuda/alibi.cuh"

namespace extrap::cuda {

__device__ __forceinline__ bool score_visible(const HeadBias& hb, int i, int j, int seq_len) {
  return j < seq_len && (j == i || (j < i ? hb.look_left : hb.look_right));
}

// Keys [*begin, *end) that queries [row_begin, row_end) can see (row_end <= T).
__device__ inline void visible_keys(const HeadBias& hb, int row_begin, int row_end, int seq_len,
                                    int* begin, int* end) {
  *begin = hb.look_left ? 0 : row_begin;           // j >= i >= row_begin
  *end = hb.look_right ? seq_len : row_end;        // j <= i <= row_end - 1
}

// Queries [*begin, *end) that can see keys [col_begin, col_end) (col_end <= T).
__device__ inline void visible_queries(const HeadBias& hb, int col_begin, int col_end,
                                       int seq_len, int* begin, int* end) {
  *begin = hb.look_right ? 0 : col_begin;          // i >= j >= col_begin
  *end = hb.look_left ? seq_len : col_end;         // i <= j <= col_end - 1
}

// Whether the tile of queries [r0, r1) and keys [c0, c1) may hold an invisible score.
// Queries past T are not checked: their rows are never stored (forward) or have zero
// probability through their +inf log-sum-exp (backward).
__device__ __forceinline__ bool tile_needs_mask(const HeadBias& hb, int r0, int r1, int c0, int c1,
                                                int seq_len) {
  if (c1 > seq_len) return true;                   // keys past the end
  if (!hb.look_right && c1 - 1 > r0) return true;  // some j > i
  if (!hb.look_left && c0 < r1 - 1) return true;   // some j < i
  return false;
}

}  // namespace extrap::cuda
