// Which vector instruction set extrap's own CPU kernels run, and the one mechanism that picks it.
//
// Each kernel loop is compiled for AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and the x86-64
// baseline, and a call runs the variant for cpu_isa(): the capability ATen reports
// (at::native::get_cpu_capability(), which honours ATEN_CPU_CAPABILITY), never more than this
// CPU has. So one switch,
//     ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
// puts extrap, ATen, oneDNN and MKL on their AVX2 paths together, and an AVX-512 machine can
// test and time what an AVX2-only one runs. (GCC's target_clones would pick by the CPU alone.)
#pragma once

#include <atomic>

namespace extrap {

enum class CpuIsa { baseline = 0, avx2 = 1, avx512 = 2 };

namespace detail {
// -1 until decided; then the CpuIsa. A kernel calls cpu_isa() once a row, so the decided
// value is one relaxed load (a plain load on x86), not a call.
extern std::atomic<int> cpu_isa_decided;
CpuIsa decide_cpu_isa();
}  // namespace detail

// Decided once, at the first call, from ATen's capability and the CPU's features.
inline CpuIsa cpu_isa() {
  const int decided = detail::cpu_isa_decided.load(std::memory_order_relaxed);
  return decided >= 0 ? CpuIsa(decided) : detail::decide_cpu_isa();
}
// "avx512", "avx2", "baseline".
const char* cpu_isa_name(CpuIsa isa);

// An Intel CPU on the AVX-512 path: where MKL's float32 products run AVX-512 kernels too (on AMD
// CPUs MKL takes its AVX2 path whatever they support; core/kernels/cpu_linear.h).
bool intel_cpu_on_avx512();

}  // namespace extrap

// EXTRAP_ISA_KERNEL(ret, name, (params), (args)) { body }
//
// Defines `ret name(params)`, which runs `body` compiled for the instruction set cpu_isa()
// names. The body is written once (as name_body, always inlined into one wrapper per ISA, so
// GCC vectorises it for that ISA) and the dispatch is one load and compare a call. `args` are
// the parameter names in order. Every function it defines is inline: it may stand in a header
// or in an anonymous namespace.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EXTRAP_ISA_KERNEL(ret, name, params, args)                                       \
  [[gnu::always_inline]] inline ret name##_body params;                                  \
  __attribute__((target("arch=x86-64-v4"))) inline ret name##_avx512 params {            \
    return name##_body args;                                                              \
  }                                                                                       \
  __attribute__((target("arch=x86-64-v3"))) inline ret name##_avx2 params {              \
    return name##_body args;                                                              \
  }                                                                                       \
  inline ret name##_baseline params { return name##_body args; }                          \
  inline ret name params {                                                                \
    switch (::extrap::cpu_isa()) {                                                        \
      case ::extrap::CpuIsa::avx512: return name##_avx512 args;                           \
      case ::extrap::CpuIsa::avx2: return name##_avx2 args;                               \
      default: return name##_baseline args;                                               \
    }                                                                                     \
  }                                                                                       \
  [[gnu::always_inline]] inline ret name##_body params
#else
#define EXTRAP_ISA_KERNEL(ret, name, params, args) inline ret name params
#endif
