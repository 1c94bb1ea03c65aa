#include "core/kernels/precision.h"

#include "core/runtime/cpu_isa.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

namespace extrap {

ComputePrecision::ComputePrecision(Precision precision, c10::DeviceType device) : device_(device) {
  if (precision == Precision::fp32) return;
  active_ = true;
  was_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_dtype(device, at::kBFloat16);
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
}

ComputePrecision::~ComputePrecision() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
  // The casts of weights are cached while a region is open; they go stale at the optimiser step.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

Float32Region::Float32Region(c10::DeviceType device)
    : device_(device), was_enabled_(at::autocast::is_autocast_enabled(device)) {
  if (was_enabled_) at::autocast::set_autocast_enabled(device_, false);
}

Float32Region::~Float32Region() {
  if (was_enabled_) at::autocast::set_autocast_enabled(device_, true);
}

bool cpu_autocast_bf16() { return autocast_bf16(at::kCPU); }

bool autocast_bf16(c10::DeviceType device) {
  return at::autocast::is_autocast_enabled(device) && at::autocast::get_autocast_dtype(device) == at::kBFloat16;
}

bool cpu_has_fast_bf16() {
  // Capped below AVX-512 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), no bf16 instruction is run.
  if (cpu_isa() != CpuIsa::avx512) return false;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string flag;
    while (words >> flag)
      if (flag == "avx512_bf16" || flag == "amx_bf16") return true;
    return false;
  }
  return false;
}

}  // namespace extrap
