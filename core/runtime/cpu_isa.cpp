#include "core/runtime/cpu_isa.h"

#include <ATen/Version.h>

#include <string>

namespace extrap {

namespace {

CpuIsa decide_cpu_isa() {
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

CpuIsa cpu_isa() {
  static const CpuIsa isa = decide_cpu_isa();
  return isa;
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
