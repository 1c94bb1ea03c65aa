// Training precision (train.precision).
//
// fp32: every operation in float32 (the default; what evaluation always uses).
// bf16: mixed precision as torch.autocast does it. While a ComputePrecision guard is alive on a
// device, LibTorch's autocast runs matrix products (linear layers, matmul) with bfloat16
// inputs and float32 accumulation; weights, gradients, the optimiser, LayerNorm, softmax and
// the loss stay float32 (autocast's own lists). extrap adds one rule of its own: attention
// scores and softmax (core/attention/attention.cpp) are float32 under bf16, because the scores carry the
// position bias (an ALiBi bias of -0.5 * 1000 is 8 apart from its neighbours in bfloat16's
// 8-bit mantissa). The reference paths get float32 copies of q, k, v; the fused CPU training
// kernel takes them in bfloat16 and runs its products in bfloat16 with float32 accumulation
// where the CPU has AVX512_BF16 (core/attention/fused_cpu_attention.h).
// The backward pass follows the forward's dtypes; it needs no guard.
//
// bf16 pays off on a CPU with AVX512_BF16, whose matrix products run natively in bfloat16; on
// one without it they are emulated and slower than fp32 (figures in benchmarks/RESULTS.md).
#pragma once

#include "core/base/yaml_options.h"

#include <c10/core/DeviceType.h>

namespace extrap {

// Training arithmetic (train.precision): fp32 throughout, or bf16 matrix products.
enum class Precision { fp32, bf16 };
template <>
struct EnumNames<Precision> {
  static constexpr std::array<std::pair<const char*, Precision>, 2> table{
      {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}}};
};

class ComputePrecision {
 public:
  // Nothing happens for Precision::fp32.
  ComputePrecision(Precision precision, c10::DeviceType device);
  ~ComputePrecision();
  ComputePrecision(const ComputePrecision&) = delete;
  ComputePrecision& operator=(const ComputePrecision&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
};

// While alive: autocast off on `device` (restored after), for code that must run in float32
// inside a bf16 region. Does nothing when autocast is off.
class Float32Region {
 public:
  explicit Float32Region(c10::DeviceType device);
  ~Float32Region();
  Float32Region(const Float32Region&) = delete;
  Float32Region& operator=(const Float32Region&) = delete;
  bool was_autocast() const { return was_enabled_; }

 private:
  c10::DeviceType device_;
  bool was_enabled_;
};

// Whether bfloat16 autocast is on for CPU tensors now (a ComputePrecision of bf16 on the CPU is
// open): the fused CPU paths that produce autocast's dtypes themselves ask this.
bool cpu_autocast_bf16();
// The same for tensors of `device` (a bf16 ComputePrecision open on it).
bool autocast_bf16(c10::DeviceType device);

// Whether matrix products run in bf16 on this machine's CPU at hardware speed (AVX512_BF16 or
// AMX) and cpu_isa() is not capped below AVX-512.
bool cpu_has_fast_bf16();

}  // namespace extrap
