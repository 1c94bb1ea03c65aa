// MKL's vector math (VML), which ATen's float exp, log, sin, cos, tanh, erf and sqrt call on the
// CPU, is first called here, when libextrap loads, before any product has run.
//
// Why: with MKL's dynamic threading (MKL_DYNAMIC, on by default) and both cores busy, the first
// VML call of a process that had already run MKL products sometimes split its work over two
// threads and returned the second thread's share at ~1.5e-4 relative error (2,936 of 6,400
// exp values; a weight 0.70714 for 0.70724). Found through a test of stick-breaking's reference
// path in float32 that failed in 1 process in 40 under load, always by the same amount
// (2.57e-4 in the output). Every later call in the process was right. With one exp or log
// called first, at load, 300 processes under the same load gave no wrong value; so did 120 with
// MKL_DYNAMIC=FALSE, and 120 with MKL_NUM_THREADS=1 (measured 2026-11-27, 2-core Xeon VM,
// LibTorch 2.15, MKL 2024.2).
//
// The calls are large enough for MKL to split (8,192 values) and take both float types. They add
// about 3 ms to a process's start: 1.2-1.6 ms of MKL's own VML set-up, which the first exp would
// pay anyway, the rest LibTorch's first calls of these operators (timed in Python on the same
// LibTorch wheel, 2-core Xeon VM, 2026-11-27), against 0.29 s for `extrap --version`.
#include <torch/torch.h>

namespace extrap {
namespace {

bool warm_vector_math() {
  for (const auto type : {torch::kFloat32, torch::kFloat64}) {
    const auto x = torch::linspace(-4, 4, 8192, torch::TensorOptions().dtype(type));
    (void)torch::exp(x);
    (void)torch::log(x.abs() + 1);
  }
  return true;
}

[[maybe_unused]] const bool warmed = warm_vector_math();

}  // namespace
}  // namespace extrap
