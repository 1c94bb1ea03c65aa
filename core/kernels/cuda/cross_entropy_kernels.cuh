// The training loss, the summed cross-entropy of (rows, classes) logits, forward and backward, as
// CUDA kernels: core/kernels/fused_cpu_loss.h's CPU row loops, one block a row.
//
// Written against simt.h, so the same source is a CUDA kernel (cross_entropy.cu, nvcc) and a
// CPU-thread emulation of it (tests/kernels/test_cross_entropy_simt.cpp, any machine).
//
// Forward: each of a row's 256 threads reads its logits t, t + 256, ... once, keeping the running
// maximum and the sum of exp(x - maximum) as the count of terms at the maximum (each exactly 1)
// and the float32 sum of the rest, the CPU loop's split (a confident row's loss is the log of 1
// plus terms below float32's half-ulp at 1). A new maximum turns the terms so far into `rest`,
// scaled; the block combines the threads' partials the same way, warp by warp in a fixed order.
// Then, as on the CPU, log_sum = log(at_max + rest) and the row's loss log_sum - (x[target] -
// maximum) in double, lse = maximum + log_sum. A second kernel adds the rows' losses in double,
// in a fixed order (each thread its rows in turn, then the threads in order), to one float32.
// Backward: g (exp(x - lse) - onehot(target)) written in the logits' dtype, g read on the device
// (no wait for the host, so a CUDA graph can hold it).
//
// A row whose target is ignore_index adds 0 and gets a zero gradient. A target outside
// [0, classes) cannot be refused here without a wait for the device: its row's loss and gradient
// are NaN, so the sum is, and the trainer stops on the non-finite loss.
#pragma once

#include "core/kernels/cuda/cross_entropy_params.h"
#include "core/kernels/cuda/simt.h"

namespace extrap::cuda {

namespace cross_entropy_detail {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// A row's sum of exp(x - max) so far: at_max + rest.
struct ExpSum {
  float max, at_max, rest;
};

EXTRAP_SIMT_DEVICE ExpSum with_value(ExpSum s, float x) {
  if (x > s.max) {  // a new maximum: the terms so far are below it
    s.rest = (s.at_max + s.rest) * simt::exp(s.max - x);
    s.at_max = 1;
    s.max = x;
  } else if (x == s.max) {
    s.at_max += 1;
  } else {
    s.rest += simt::exp(x - s.max);  // also NaN for a NaN logit, which the sum then carries
  }
  return s;
}

EXTRAP_SIMT_DEVICE ExpSum combined(ExpSum a, ExpSum b) {
  const float max = a.max > b.max ? a.max : b.max;
  ExpSum out{max, 0, 0};
  const auto add = [&](const ExpSum& s) {
    if (s.max == max) {
      out.at_max += s.at_max;
      out.rest += s.rest;
    } else {
      out.rest += (s.at_max + s.rest) * simt::exp(s.max - max);
    }
  };
  add(a);
  add(b);
  return out;
}

EXTRAP_SIMT_DEVICE float load(const void* p, RowType type, int64_t i) {
  if (type == RowType::bfloat16) return simt::to_float(static_cast<const simt::bf16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

EXTRAP_SIMT_KERNEL void forward_kernel(CrossEntropyForward p) {
  EXTRAP_SIMT_SHARED float warp_max[kWarps], warp_at_max[kWarps], warp_rest[kWarps];
  const int t = simt::thread_index();
  const int64_t V = p.classes;
  for (int64_t row = simt::block_index(); row < p.rows; row += simt::block_count()) {
    const int64_t target = p.targets[row];
    if (target == p.ignore_index) {
      if (t == 0) {
        p.lse[row] = 0;
        p.row_loss[row] = 0;
      }
      continue;
    }
    const int64_t first = row * V;
    ExpSum s{-INFINITY, 0, 0};
    for (int64_t j = t; j < V; j += kThreads) s = with_value(s, load(p.logits, p.logits_type, first + j));
    for (int mask = 16; mask > 0; mask >>= 1)
      s = combined(s, {simt::shuffle_xor(s.max, mask), simt::shuffle_xor(s.at_max, mask),
                       simt::shuffle_xor(s.rest, mask)});
    if (t % 32 == 0) {
      warp_max[t / 32] = s.max;
      warp_at_max[t / 32] = s.at_max;
      warp_rest[t / 32] = s.rest;
    }
    simt::sync_block();
    if (t == 0) {
      ExpSum row_sum{warp_max[0], warp_at_max[0], warp_rest[0]};
      for (int w = 1; w < kWarps; ++w) row_sum = combined(row_sum, {warp_max[w], warp_at_max[w], warp_rest[w]});
      const double log_sum = simt::log(double(row_sum.at_max) + double(row_sum.rest));
      p.lse[row] = float(double(row_sum.max) + log_sum);
      // log_sum - (x[t] - max): exact where x[t] is the maximum, as on the CPU.
      p.row_loss[row] = target >= 0 && target < V
                            ? log_sum - (double(load(p.logits, p.logits_type, first + target)) - double(row_sum.max))
                            : simt::quiet_nan();
    }
    simt::sync_block();  // the shared partials are free for the next row
  }
}

// One block: thread t adds rows t, t + kThreads, ... in order, then thread 0 the threads in order.
EXTRAP_SIMT_KERNEL void sum_kernel(CrossEntropyForward p) {
  EXTRAP_SIMT_SHARED double partial[kThreads];
  const int t = simt::thread_index();
  double sum = 0;
  for (int64_t row = t; row < p.rows; row += kThreads) sum += p.row_loss[row];
  partial[t] = sum;
  simt::sync_block();
  if (t == 0) {
    double total = 0;
    for (int i = 0; i < kThreads; ++i) total += partial[i];
    *p.loss = float(total);
  }
}

EXTRAP_SIMT_KERNEL void backward_kernel(CrossEntropyBackward p) {
  const int t = simt::thread_index();
  const int64_t V = p.classes;
  const float g = *p.grad_loss;
  for (int64_t row = simt::block_index(); row < p.rows; row += simt::block_count()) {
    const int64_t first = row * V, target = p.targets[row];
    const bool ignored = target == p.ignore_index, outside = !ignored && (target < 0 || target >= V);
    const float lse = p.lse[row];
    for (int64_t j = t; j < V; j += kThreads) {
      float out = 0;
      if (outside) {
        out = simt::quiet_nan();
      } else if (!ignored) {
        out = g * simt::exp(load(p.logits, p.logits_type, first + j) - lse);
        if (j == target) out -= g;
      }
      if (p.logits_type == RowType::bfloat16) static_cast<simt::bf16*>(p.grad)[first + j] = simt::to_bf16(out);
      else static_cast<float*>(p.grad)[first + j] = out;
    }
  }
}

// Blocks: one a row, at most this many (each then walks every this-many-th row).
constexpr int64_t kMaxBlocks = 1 << 20;

}  // namespace cross_entropy_detail

// `launch(kernel, blocks, threads, params)` starts `kernel` (cross_entropy.cu: on a stream; the
// tests: on CPU threads). Writes lse, row_loss and loss.
template <class Launch>
void dispatch_cross_entropy_forward(const CrossEntropyForward& p, Launch&& launch) {
  using namespace cross_entropy_detail;
  if (p.rows > 0) launch(forward_kernel, p.rows < kMaxBlocks ? p.rows : kMaxBlocks, kThreads, p);
  launch(sum_kernel, 1, kThreads, p);
}

// Writes grad.
template <class Launch>
void dispatch_cross_entropy_backward(const CrossEntropyBackward& p, Launch&& launch) {
  using namespace cross_entropy_detail;
  if (p.rows > 0) launch(backward_kernel, p.rows < kMaxBlocks ? p.rows : kMaxBlocks, kThreads, p);
}

}  // namespace extrap::cuda
