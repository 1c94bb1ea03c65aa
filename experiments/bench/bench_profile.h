// `extrap bench train --profile`: where a training step's time goes, by operator.
//
// Runs the step under LibTorch's profiler (Kineto, CPU activities, input shapes recorded) and
// prints the operators grouped by name and input shapes, ordered by self time (an operator's
// time minus that of the operators it called, per thread), per step. Autograd's backward
// nodes appear under their own names (e.g. "MmBackward0"), their kernels under the ATen
// operators they call.
#pragma once

#include <cstdint>
#include <functional>

namespace extrap::bench {

// Profiles `steps` calls of `step` (after the caller's warm-up) and prints the `top` heaviest
// operator groups, each with its share of the profiled time.
void print_operator_profile(const std::function<void()>& step, int64_t steps, int top);

}  // namespace extrap::bench
