// A dense bias that is a function of |i - j| only (KERPLE, Sandwich), described tile by tile:
// the function is evaluated once per distinct distance in the tile and spread over it, so
// every tile of the same distances holds bit-for-bit the same values (the efficient path's
// tiles equal the reference's whole matrix) and a T x T tile costs O(T) evaluations.
#pragma once

#include "core/attention/attention.h"

#include <algorithm>
#include <cstdlib>

namespace extrap {

// kernel: (R,) float32 distances on `device` -> (H, R) biases.
template <class Kernel>
AttentionBias::DenseBlockFn distance_bias_blocks(torch::Device device, Kernel kernel) {
  return [device, kernel](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    const int64_t lowest = k0 - (q1 - 1), highest = (k1 - 1) - q0;  // the tile's j - i
    const int64_t nearest =
        (lowest <= 0 && highest >= 0) ? 0 : std::min(std::abs(lowest), std::abs(highest));
    const int64_t farthest = std::max(std::abs(lowest), std::abs(highest));
    const auto options = torch::TensorOptions().device(device);
    const torch::Tensor per_distance =
        kernel(torch::arange(nearest, farthest + 1, options.dtype(torch::kFloat32)));  // (H, R)
    auto i = torch::arange(q0, q1, options.dtype(torch::kLong)).view({-1, 1});
    auto j = torch::arange(k0, k1, options.dtype(torch::kLong)).view({1, -1});
    auto index = ((j - i).abs() - nearest).flatten();  // (Tq * Tk,)
    return per_distance.index_select(1, index).view({per_distance.size(0), q1 - q0, k1 - k0});
  };
}

}  // namespace extrap
