// A dense bias that is a function of |i - j| only (KERPLE, Sandwich), described by offset
// (AttentionBias::dense_by_offset): the function is evaluated once per distinct distance in a
// tile and spread over it, so every tile of the same distances holds bit-for-bit the same
// values (the efficient path's tiles equal the reference's whole matrix), a T x T tile costs
// O(T) evaluations, and the attention profile reads each row's biases by offset.
#pragma once

#include "core/attention/attention.h"

#include <algorithm>
#include <cstdlib>

namespace extrap {

// kernel: (R,) float32 distances on `device` -> (H, R) biases. Returns the offset function of
// AttentionBias::dense_by_offset: the (H, hi - lo) biases at offsets j - i = lo .. hi - 1, the
// kernel evaluated once per distinct distance |j - i| among them.
template <class Kernel>
AttentionBias::OffsetFn distance_bias_offsets(torch::Device device, Kernel kernel) {
  return [device, kernel](int64_t lo, int64_t hi) {
    const int64_t last = hi - 1;
    const int64_t nearest = (lo <= 0 && last >= 0) ? 0 : std::min(std::abs(lo), std::abs(last));
    const int64_t farthest = std::max(std::abs(lo), std::abs(last));
    const auto options = torch::TensorOptions().device(device);
    const torch::Tensor per_distance =
        kernel(torch::arange(nearest, farthest + 1, options.dtype(torch::kFloat32)));  // (H, R)
    return per_distance.index_select(1, torch::arange(lo, hi, options.dtype(torch::kLong)).abs() - nearest);
  };
}

}  // namespace extrap
