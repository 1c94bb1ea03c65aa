// The (B, H, T, D) layout extrap's kernels and cuDNN's graphs (built for the frontend's default
// 16-byte operand alignment) both read in 16-byte vectors: unit stride on D, every other stride a
// multiple of 8 elements, a 16-byte aligned base. Anything else is copied to contiguous memory.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace extrap {

inline bool vector_layout(const torch::Tensor& t) {
  return t.stride(3) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
}

inline torch::Tensor in_vector_layout(const torch::Tensor& t) { return vector_layout(t) ? t : t.contiguous(); }

}  // namespace extrap
