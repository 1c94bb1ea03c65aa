#include "core/runtime/cpu_isa.h"

#include <ATen/Version.h>

#include <string>

namespace extrap {

namespace {

CpuIsa choose() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  // "AVX512", "AVX2", or "NO AVX" / "DEFAULT": ATen's choice, after ATEN_CPU_CAPABILITY.
  const std::string aten = at::get_cpu_capability();
  __builtin_cpu_init();
  if (aten == "AVX512" && __builtin_cpu_supports("x86-64-v4")) return CpuIsa::avx512;
  if ((aten == "AVX512" || aten == "AVX2") && __builtin_cpu_supports("x86-64-v3")) return CpuIsa::avx2;
#endif
  return CpuIsa::baseline;
}

}  // namespace

namespace detail {

std::atomic<int> cpu_isa_decided{-1};

CpuIsa decide_cpu_isa() {
  // Threads that race here all compute the same answer.
  static const CpuIsa isa = choose();
  cpu_isa_decided.store(int(isa), std::memory_order_relaxed);
  return isa;
}

}  // namespace detail

bool intel_cpu_on_avx512() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel && cpu_isa() == CpuIsa::avx512;
#else
  return false;
#endif
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::baseline: break;
  }
  return "baseline";
}

}  // namespace extrap
