// The criterion for a kernel computing in bfloat16 or float16 (STYLE.md): against a float64
// reference on the same (upcast) inputs, its largest error is at most twice that of LibTorch's
// own computation in the same low precision, plus a floor of 1e-4 (max |ref| + 1) for the cases
// where LibTorch is exact.
#pragma once

#include <torch/torch.h>

#include <catch2/catch.hpp>

namespace extrap::testing {

inline double max_error(const torch::Tensor& x, const torch::Tensor& ref) {
  return (x.to(torch::kFloat64) - ref).abs().max().item<double>();
}

// `got`: the kernel's result; `low`: LibTorch's in the same precision; `ref`: float64.
inline void check_close(const char* what, const torch::Tensor& got, const torch::Tensor& low,
                        const torch::Tensor& ref) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(got.sizes() == ref.sizes());
  REQUIRE_FALSE(torch::isnan(got).any().item<bool>());
  const double error = max_error(got, ref), low_error = max_error(low, ref);
  const double floor = 1e-4 * (ref.abs().max().item<double>() + 1.0);
  INFO("kernel error " << error << ", LibTorch low-precision error " << low_error);
  CHECK(error <= 2 * low_error + floor);
}

}  // namespace extrap::testing
