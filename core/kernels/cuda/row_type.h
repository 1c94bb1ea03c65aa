// What a float32-or-bfloat16 operand of extrap's CUDA kernels is (residual_norm_params.h,
// cross_entropy_params.h): absent, float32, or bfloat16 (the bits of __nv_bfloat16 /
// c10::BFloat16). Plain C++: no torch, no CUDA.
#pragma once

namespace extrap::cuda {

enum class RowType : int { none = 0, float32 = 1, bfloat16 = 2 };

}  // namespace extrap::cuda
