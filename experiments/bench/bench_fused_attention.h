// `extrap bench attention --device cuda`: the fused CUDA attention against LibTorch's
// attention on the GPU (built only with a CUDA-enabled LibTorch; see bench_fused_attention.cpp).
#pragma once

#include <string>
#include <vector>

namespace extrap::cli {

// Parses `args` (the arguments after `bench attention`; --help lists them), prints a table
// and appends one JSON line per measurement to --out. Returns the exit code.
int bench_attention_cuda(const std::vector<std::string>& args);

}  // namespace extrap::cli
