// The fused CUDA attention benchmark as a program of its own (what scripts/gpu runs);
// `extrap bench attention --device cuda` calls the same function.
#include "core/cuda/bench_fused_attention.h"

#include <exception>
#include <iostream>

int main(int argc, char** argv) {
  try {
    return extrap::cli::bench_attention_cuda(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "bench attention (cuda): " << e.what() << "\n";
    return 1;
  }
}
