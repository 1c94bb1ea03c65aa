// The residual add and the norm after it, h = x + y and u = norm(h) (a LayerNorm or an RMSNorm,
// with or without its bias), forward and backward, as CUDA kernels: core/kernels/residual_norm.h's
// CPU row loops, one block a row. An RMSNorm skips the mean's block sum (p.rms is one value for
// every thread, so every thread skips it alike) and the mean(g) term of the backward.
//
// Written against simt.h, so the same source is a CUDA kernel (residual_norm.cu, nvcc) and a
// CPU-thread emulation of it (tests/kernels/test_residual_norm_simt.cpp, any machine).
//
// Forward, a block of kThreads threads a row: thread t holds the row's values t, t + kThreads,
// ... (kCols of them, in registers; loads and stores coalesced across the warp), sums them for
// the mean, then the centred squares for the variance (two passes, as the CPU loop), and writes
// h, u and/or u's bfloat16 copy, the row's mean and rstd. Backward, a fixed number of blocks walk
// the rows (row = block, block + blocks, ...): per row the two sums of LayerNorm's backward in one
// block reduction, dx = dh + rstd (g - mean(g) - xhat mean(g xhat)) with g = du gamma; each
// thread keeps its columns' dgamma and dbeta sums in registers across its rows, writes them to
// its block's slot of `partial`, and a second kernel adds the slots in block order.
//
// Block sums: a warp's values by butterfly shuffles, then every thread adds the warps' totals in
// warp order, so every thread holds the same value.
#pragma once

#include "core/kernels/cuda/residual_norm_params.h"
#include "core/kernels/cuda/simt.h"

#include <stdexcept>
#include <string>

namespace extrap::cuda {

namespace add_layer_norm_detail {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// The sum of v over the block's threads, in every thread. `scratch` is kWarps floats of shared
// memory, free again when this returns.
EXTRAP_SIMT_DEVICE float block_sum(float v, float* scratch) {
  for (int mask = 16; mask > 0; mask >>= 1) v += simt::shuffle_xor(v, mask);
  const int t = simt::thread_index();
  if (t % 32 == 0) scratch[t / 32] = v;
  simt::sync_block();
  float total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  simt::sync_block();
  return total;
}

EXTRAP_SIMT_DEVICE float load(const void* p, RowType type, int64_t i) {
  if (type == RowType::float32) return static_cast<const float*>(p)[i];
  if (type == RowType::bfloat16) return simt::to_float(static_cast<const simt::bf16*>(p)[i]);
  return 0.0f;
}

template <int kCols>
EXTRAP_SIMT_KERNEL void forward_kernel(AddLayerNormForward p) {
  EXTRAP_SIMT_SHARED float scratch[kWarps];
  const int t = simt::thread_index();
  const int64_t D = p.width;
  for (int64_t row = simt::block_index(); row < p.rows; row += simt::block_count()) {
    const int64_t first = row * D;
    float v[kCols];
    float sum = 0;
EXTRAP_SIMT_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int64_t j = t + int64_t(c) * kThreads;
      v[c] = 0;
      if (j < D) {
        v[c] = p.x[first + j] + load(p.y, p.y_type, first + j);
        if (p.h) p.h[first + j] = v[c];
        sum += v[c];
      }
    }
    const float mean = p.rms ? 0.0f : block_sum(sum, scratch) / float(D);
    float squares = 0;
EXTRAP_SIMT_UNROLL
    for (int c = 0; c < kCols; ++c)
      if (t + int64_t(c) * kThreads < D) squares += (v[c] - mean) * (v[c] - mean);
    const float rstd = simt::rsqrt(block_sum(squares, scratch) / float(D) + p.eps);
EXTRAP_SIMT_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int64_t j = t + int64_t(c) * kThreads;
      if (j >= D) continue;
      const float u = (v[c] - mean) * rstd * p.gamma[j] + (p.beta ? p.beta[j] : 0.0f);
      if (p.u) p.u[first + j] = u;
      if (p.u_bf16) static_cast<simt::bf16*>(p.u_bf16)[first + j] = simt::to_bf16(u);
    }
    if (t == 0) {
      p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

template <int kCols>
EXTRAP_SIMT_KERNEL void backward_kernel(AddLayerNormBackward p) {
  EXTRAP_SIMT_SHARED float scratch[kWarps];
  const int t = simt::thread_index();
  const int64_t D = p.width;
  float dgamma[kCols], dbeta[kCols];
EXTRAP_SIMT_UNROLL
  for (int c = 0; c < kCols; ++c) dgamma[c] = dbeta[c] = 0;
  for (int64_t row = simt::block_index(); row < p.rows; row += simt::block_count()) {
    const int64_t first = row * D;
    const float mean = p.mean[row], rstd = p.rstd[row];
    float g[kCols], xhat[kCols];
    float sum_g = 0, sum_gx = 0;
EXTRAP_SIMT_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int64_t j = t + int64_t(c) * kThreads;
      g[c] = xhat[c] = 0;
      if (j >= D) continue;
      float du = load(p.du, p.du_type, first + j);
      if (p.du_copy) du += simt::to_float(static_cast<const simt::bf16*>(p.du_copy)[first + j]);
      xhat[c] = (p.h[first + j] - mean) * rstd;
      g[c] = du * p.gamma[j];
      sum_g += g[c];
      sum_gx += g[c] * xhat[c];
      dgamma[c] += du * xhat[c];
      dbeta[c] += du;
    }
    const float a = p.rms ? 0.0f : block_sum(sum_g, scratch) / float(D);
    const float b = block_sum(sum_gx, scratch) / float(D);
EXTRAP_SIMT_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int64_t j = t + int64_t(c) * kThreads;
      if (j >= D) continue;
      float dx = rstd * (g[c] - a - xhat[c] * b);
      if (p.dh) dx = p.dh[first + j] + dx;
      p.dx[first + j] = dx;
      if (p.dy_bf16) static_cast<simt::bf16*>(p.dy_bf16)[first + j] = simt::to_bf16(dx);
    }
  }
  float* slot = p.partial + int64_t(simt::block_index()) * 2 * D;
EXTRAP_SIMT_UNROLL
  for (int c = 0; c < kCols; ++c) {
    const int64_t j = t + int64_t(c) * kThreads;
    if (j >= D) continue;
    slot[j] = dgamma[c];
    slot[D + j] = dbeta[c];
  }
}

// dgamma and dbeta: thread j of the grid adds column j of every block's slot, in block order.
EXTRAP_SIMT_KERNEL void weight_grads_kernel(AddLayerNormBackward p) {
  const int64_t j = int64_t(simt::block_index()) * kThreads + simt::thread_index();
  if (j >= 2 * p.width) return;
  float total = 0;
  for (int64_t b = 0; b < p.blocks; ++b) total += p.partial[b * 2 * p.width + j];
  if (j < p.width) p.dgamma[j] = total;
  else if (p.dbeta) p.dbeta[j - p.width] = total;
}

// kCols for a row of `width` values: the smallest power of two with kThreads * kCols >= width.
inline int columns_for(int64_t width) {
  if (width < 1 || width > kAddLayerNormMaxWidth)
    throw std::invalid_argument("add_layer_norm on CUDA: rows of " + std::to_string(width) +
                                " values (1 to " + std::to_string(kAddLayerNormMaxWidth) + ")");
  int cols = 1;
  while (int64_t(cols) * kThreads < width) cols *= 2;
  return cols;
}

// Forward blocks: one a row, at most this many (each then walks every this-many-th row).
constexpr int64_t kMaxForwardBlocks = 1 << 20;

}  // namespace add_layer_norm_detail

// The one place where the row width becomes a kernel's template parameter. `launch(kernel,
// blocks, threads, params)` starts `kernel` (residual_norm.cu: on a stream; the tests: on CPU
// threads).
template <class Launch>
void dispatch_add_layer_norm_forward(const AddLayerNormForward& p, Launch&& launch) {
  using namespace add_layer_norm_detail;
  if (p.rows <= 0) return;
  const int64_t blocks = p.rows < kMaxForwardBlocks ? p.rows : kMaxForwardBlocks;
  switch (columns_for(p.width)) {
    case 1: return launch(forward_kernel<1>, blocks, kThreads, p);
    case 2: return launch(forward_kernel<2>, blocks, kThreads, p);
    case 4: return launch(forward_kernel<4>, blocks, kThreads, p);
    case 8: return launch(forward_kernel<8>, blocks, kThreads, p);
    case 16: return launch(forward_kernel<16>, blocks, kThreads, p);
    default: return launch(forward_kernel<32>, blocks, kThreads, p);
  }
}

// Writes dx (and dy_bf16), overwrites `partial`, writes dgamma and dbeta.
template <class Launch>
void dispatch_add_layer_norm_backward(const AddLayerNormBackward& p, Launch&& launch) {
  using namespace add_layer_norm_detail;
  if (p.rows <= 0) return;
  if (p.blocks < 1 || p.blocks > p.rows)
    throw std::invalid_argument("add_layer_norm on CUDA: " + std::to_string(p.blocks) + " backward blocks for " +
                                std::to_string(p.rows) + " rows (1 to the row count)");
  switch (columns_for(p.width)) {
    case 1: launch(backward_kernel<1>, p.blocks, kThreads, p); break;
    case 2: launch(backward_kernel<2>, p.blocks, kThreads, p); break;
    case 4: launch(backward_kernel<4>, p.blocks, kThreads, p); break;
    case 8: launch(backward_kernel<8>, p.blocks, kThreads, p); break;
    case 16: launch(backward_kernel<16>, p.blocks, kThreads, p); break;
    default: launch(backward_kernel<32>, p.blocks, kThreads, p); break;
  }
  launch(weight_grads_kernel, (2 * p.width + kThreads - 1) / kThreads, kThreads, p);
}

}  // namespace extrap::cuda
