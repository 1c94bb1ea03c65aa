// Element-wise float32 helpers (and bfloat16 conversions) for the CPU kernels (core/attention/fused_cpu_attention.cpp,
// core/kernels/fused_cpu_loss.cpp): loops written so that GCC vectorises them, compiled for AVX-512,
// AVX2 and the x86-64 baseline and picked by cpu_isa() (EXTRAP_ISA_KERNEL,
// core/runtime/cpu_isa.h, which ATEN_CPU_CAPABILITY caps); the ATen vector types would be
// compiled for the baseline only in extrap's files. exp has its own vectorisable form here
// (exp_float) because scalar expf calls would keep the softmax loops scalar, and the exps are
// much of the attention kernel's element-wise work; log_float likewise, for entropies.
#pragma once

#include "core/runtime/cpu_isa.h"

#include <c10/util/BFloat16.h>

#include <cmath>

#include <cstdint>


namespace extrap {

// e^x for float x: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial
// (relative error below 2e-7 on that range), times 2^n built in the exponent bits; 0 below
// -87 (e^-87 is the edge of float's normal range). Branch-free, so loops over it vectorise.
inline float exp_float(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (no libm call, so loops vectorise).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts (Cody-Waite)
  float poly = 1.0f / 720;
  poly = poly * r + 1.0f / 120;
  poly = poly * r + 1.0f / 24;
  poly = poly * r + 1.0f / 6;
  poly = poly * r + 0.5f;
  poly = poly * r + 1.0f;
  poly = poly * r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return x <= -87.0f ? 0.0f : poly * scale;
}

// ln x for float x > 0 (and a finite value for x = 0, so that x ln x is 0 there): x = m 2^e with
// m in [sqrt(1/2), sqrt(2)), ln(m) by Cephes' degree-9 polynomial in m - 1 (relative error
// about 1e-7), plus e ln 2 in two parts. Subnormal x are read as 2^-127 m (their x ln x is
// below 1e-36). Branch-free, so loops over it vectorise.
inline float log_float(float x) {
  int32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  const int32_t mantissa = (bits & 0x7fffff) | 0x3f800000;  // m in [1, 2)
  float m;
  __builtin_memcpy(&m, &mantissa, sizeof m);
  const bool high = m > 1.41421356f;
  m = high ? m * 0.5f : m;
  e += high ? 1 : 0;
  const float f = m - 1.0f, z = f * f, fe = float(e);
  float poly = 7.0376836292e-2f;
  poly = poly * f - 1.1514610310e-1f;
  poly = poly * f + 1.1676998740e-1f;
  poly = poly * f - 1.2420140846e-1f;
  poly = poly * f + 1.4249322787e-1f;
  poly = poly * f - 1.6668057665e-1f;
  poly = poly * f + 2.0000714765e-1f;
  poly = poly * f - 2.4999993993e-1f;
  poly = poly * f + 3.3333331174e-1f;
  float y = poly * f * z;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  return f + y + 0.693359375f * fe;
}

// gelu(x) = x Phi(x) and gelu'(x) = Phi(x) + x phi(x), Phi(x) = erfc(-x / sqrt 2) / 2,
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi). erfc(z) for z >= 0 by Abramowitz and Stegun 7.1.26:
// t (a1 + t (a2 + ...)) exp(-z^2), t = 1 / (1 + p z); one exp serves erfc and phi.
inline void gelu_and_slope(float x, float& value, float& slope) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float e = exp_float(-z * z);  // exp(-x^2 / 2)
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float lower = 0.5f * poly * e;  // Phi(-|x|)
  const float cdf = x >= 0.0f ? 1.0f - lower : lower;
  value = x * cdf;
  slope = cdf + x * e * 0.39894228040143268f;
}

// GELU's tanh form (GPT-2, Gemma): gelu_tanh(x) = x (1 + tanh(y)) / 2, y = sqrt(2 / pi) (x +
// 0.044715 x^3), and its slope (1 + t) / 2 + x (1 - t^2) sqrt(2 / pi) (1 + 3 0.044715 x^2) / 2,
// t = tanh(y) = 1 - 2 / (e^(2y) + 1) with exp_float (clamped: t is -1 or 1 far out, never NaN).
// Branch-free.
inline void gelu_tanh_and_slope(float x, float& value, float& slope) {
  const float k = 0.79788456080286536f, c = 0.044715f;
  const float x2 = x * x;
  const float t = 1.0f - 2.0f / (exp_float(2.0f * k * x * (1.0f + c * x2)) + 1.0f);
  value = 0.5f * x * (1.0f + t);
  slope = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x2);
}

// tanh x for float x, relative error about 3e-7: for |x| < 0.5 its odd Taylor series through
// x^15 (the first term left out is below 1e-8 of tanh there), beyond it (1 - e) / (1 + e) with
// e = exp_float(-2 |x|) <= e^-1, so that 1 - e loses no digits; the sign put back. Both arms are
// computed and one selected: branch-free, so loops over it vectorise; 1 or -1 far out, never NaN
// for a finite x. (The attention's soft cap, core/attention/fused_cpu_attention.cpp.)
inline float tanh_float(float x) {
  const float a = std::fabs(x), y = x * x;
  const float e = exp_float(-2.0f * a);
  const float far = (1.0f - e) / (1.0f + e);
  float poly = -929569.0f / 638512875.0f;
  poly = poly * y + 21844.0f / 6081075.0f;
  poly = poly * y - 1382.0f / 155925.0f;
  poly = poly * y + 62.0f / 2835.0f;
  poly = poly * y - 17.0f / 315.0f;
  poly = poly * y + 2.0f / 15.0f;
  poly = poly * y - 1.0f / 3.0f;
  poly = poly * y + 1.0f;
  const float t = a < 0.5f ? a * poly : far;
  return x < 0.0f ? -t : t;
}

// silu(x) = x sigma(x) and silu'(x) = sigma(x) (1 + x (1 - sigma(x))), sigma(x) = 1 / (1 + e^-x)
// with exp_float (clamped, so that sigma is 0 or 1 far out, never NaN). Branch-free.
inline void silu_and_slope(float x, float& value, float& slope) {
  const float sigma = 1.0f / (1.0f + exp_float(-x));
  value = x * sigma;
  slope = sigma * (1.0f + x * (1.0f - sigma));
}

// float32 -> bfloat16 bits, rounding to nearest even, NaN kept NaN (c10::BFloat16's rounding),
// and back: written without branches, so that loops over them vectorise.
inline uint16_t to_bf16_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = 0u - uint32_t(f != f);  // all ones for NaN
  return uint16_t((rounded & ~nan) | (0x7fc0u & nan));
}

inline float from_bf16_bits(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 <-> float32 for kernels that take bfloat16 (train.precision bf16) and compute in
// float32; narrowing rounds to nearest even, as LibTorch's casts do.
EXTRAP_ISA_KERNEL(void, widen, (const c10::BFloat16* from, float* to, int64_t n), (from, to, n)) {
  for (int64_t j = 0; j < n; ++j) to[j] = float(from[j]);
}

// `rows` rows of n values, `from` contiguous, `to` rows to_stride apart: one call a block, as the
// attention stores its 32-value head rows (a call a row cost more than the rounding). Stored as
// the bits: GCC does not vectorise a loop of c10::BFloat16 constructions.
EXTRAP_ISA_KERNEL(void, narrow_rows, (const float* from, int64_t rows, int64_t n, c10::BFloat16* to, int64_t to_stride), (from, rows, n, to, to_stride)) {
  for (int64_t r = 0; r < rows; ++r) {
    auto* bits = reinterpret_cast<uint16_t*>(to + r * to_stride);
    const float* row = from + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) bits[j] = to_bf16_bits(row[j]);
  }
}

inline void narrow(const float* from, c10::BFloat16* to, int64_t n) { narrow_rows(from, 1, n, to, n); }

}  // namespace extrap
