#include "core/kernels/bf16_gemm.h"

#include "core/base/environment.h"
#include "core/kernels/cpu_vector_math.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EXTRAP_BF16_KERNEL 1
#define EXTRAP_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#endif

namespace extrap::bf16_gemm {

namespace {

// The switch: unset (on) until set_enabled() or the environment says otherwise.
std::atomic<int> switched{-1};  // -1: from EXTRAP_BF16_ATTENTION_KERNEL, 0: off, 1: on

bool enabled_by_environment() {
  return environment_switch("EXTRAP_BF16_ATTENTION_KERNEL", "the bfloat16 attention products off",
                            "on, the default");
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

c10::BFloat16 to_bf16(float x) { return c10::BFloat16(x); }  // round to nearest even

#ifdef EXTRAP_BF16_KERNEL

// One tile of C: MR rows (at most 8) by 16 NV columns (NV 1 or 2; the last tile of a row may be
// narrower: n), over `pairs` pairs of depth. acc(r, j) += A(r, 2p) B(2p, j) + A(r, 2p+1) B(2p+1, j)
// is one VDPBF16PS of A's pair broadcast against B's packed pair row. 16 accumulators at most,
// so the tile lives in registers.
//
// With an odd depth the last pair's second row of B is past the product's depth (the next
// row of a B packed deeper, or padding): its lanes are zeroed, so that whatever it holds
// (inf, NaN) cannot reach C through A's zero padding (0 x inf is NaN).
template <int MR, int NV>
EXTRAP_AVX512_BF16 void tile(const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, int64_t ldb,
                             int64_t pairs, bool odd_depth, int64_t n, float alpha, float* c, int64_t ldc,
                             bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const __m512i first_row_only = _mm512_set1_epi32(0x0000FFFF);  // a pair's low half is row 2p
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = _mm512_loadu_si512(b + 2 * (p * ldb + 16 * v));
      if (odd_depth && p == pairs - 1) bv[v] = _mm512_and_si512(bv[v], first_row_only);
    }
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, sizeof pair);
      const __m512i av = _mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int v = 0; v < NV; ++v) {
    const int64_t width = std::min<int64_t>(16, n - 16 * v);
    const __mmask16 mask = width >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << width) - 1);
    for (int r = 0; r < MR; ++r) {
      float* out = c + r * ldc + 16 * v;
      __m512 x = _mm512_mul_ps(acc[r][v], scale);
      if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, out));
      _mm512_mask_storeu_ps(out, mask, x);
    }
  }
}

using TileFn = void (*)(const c10::BFloat16*, int64_t, const c10::BFloat16*, int64_t, int64_t, bool, int64_t,
                        float, float*, int64_t, bool);

template <int NV>
TileFn tile_for(int64_t rows) {
  switch (rows) {
    case 1: return tile<1, NV>;
    case 2: return tile<2, NV>;
    case 3: return tile<3, NV>;
    case 4: return tile<4, NV>;
    case 5: return tile<5, NV>;
    case 6: return tile<6, NV>;
    case 7: return tile<7, NV>;
    default: return tile<8, NV>;
  }
}

// 32 float32 values to bfloat16 (round to nearest even), `count` of them (tail masked).
EXTRAP_AVX512_BF16 void narrow32(const float* from, c10::BFloat16* to, int64_t count) {
  const __mmask16 lo = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  const __mmask16 hi = count >= 32 ? __mmask16(0xFFFF) : count > 16 ? __mmask16((1u << (count - 16)) - 1) : 0;
  const __m512 x0 = _mm512_maskz_loadu_ps(lo, from), x1 = _mm512_maskz_loadu_ps(hi, from + 16);
  const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);  // x0 in the low half
  const __mmask32 mask = count >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << count) - 1);
  _mm512_mask_storeu_epi16(to, mask, packed);
}

// Rows 2p and 2p + 1 of a float32 B, 16 columns, into 16 packed pairs (tail masked; zeros
// where masked or where the second row is absent).
EXTRAP_AVX512_BF16 void pair16(const float* row0, const float* row1, c10::BFloat16* to, int64_t count) {
  const __mmask16 mask = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  const __m512 x0 = _mm512_maskz_loadu_ps(mask, row0);
  const __m512 x1 = row1 ? _mm512_maskz_loadu_ps(mask, row1) : _mm512_setzero_ps();
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);  // x0[0..16) then x1[0..16)
  // Interleave: lane 2j takes x0[j] (16-bit lane j), lane 2j + 1 takes x1[j] (lane 16 + j).
  alignas(64) static const int16_t order[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                8,  24, 9,  25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  _mm512_storeu_si512(to, _mm512_permutexvar_epi16(_mm512_load_si512(order), both));
}

bool cpu_supports() {
  __builtin_cpu_init();
  return cpu_isa() == CpuIsa::avx512 && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("avx512bw");
}

#endif  // EXTRAP_BF16_KERNEL

}  // namespace

// Whether this CPU runs the AVX512_BF16 code (the products and the fast packing paths),
// whether or not the kernel is switched off: not when cpu_isa() is capped below AVX-512.
bool supported() {
#ifdef EXTRAP_BF16_KERNEL
  static const bool yes = cpu_supports();
  return yes;
#else
  return false;
#endif
}

bool available() {
  if (!supported()) return false;
  const int state = switched.load();
  return state < 0 ? enabled_by_environment() : state == 1;
}

void set_enabled(bool on) { switched.store(on ? 1 : 0); }

namespace {

// Packing from bfloat16 sources: the values are copied as they are, in loops without
// conversions or branches, so that GCC vectorises them (the pair interleave) or at least moves
// whole 32-bit pairs.
uint16_t* bits(c10::BFloat16* x) { return reinterpret_cast<uint16_t*>(x); }
const uint16_t* bits(const c10::BFloat16* x) { return reinterpret_cast<const uint16_t*>(x); }

// out[2j] = first[j], out[2j + 1] = second[j] (0 without a second row), j < n.
EXTRAP_ISA_KERNEL(void, interleave_pair, (const uint16_t* first, const uint16_t* second, uint16_t* out, int64_t n), (first, second, out, n)) {
  if (second) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      out[2 * j] = first[j];
      out[2 * j + 1] = second[j];
    }
  } else {
    for (int64_t j = 0; j < n; ++j) out[2 * j] = first[j];  // the second halves stay 0
  }
}

// A's rows from a bfloat16 source: rows of it, or its columns (transposed).
void pack_a_bf16(const c10::BFloat16* src, int64_t ld, bool transposed, int64_t rows, int64_t depth, PackedA& out) {
  for (int64_t i = 0; i < rows; ++i) {
    uint16_t* row = bits(out.data.data() + i * out.ld);
    if (!transposed) {
      std::memcpy(row, src + i * ld, size_t(depth) * sizeof(uint16_t));
    } else {
      const uint16_t* column = bits(src) + i;
      for (int64_t k = 0; k < depth; ++k) row[k] = column[k * ld];
    }
  }
}

// B's pairs of rows from a bfloat16 source. Transposed, a pair (B(k, j), B(k + 1, j)) =
// (src[j][k], src[j][k + 1]) is one 32-bit word of the source.
void pack_b_bf16(const c10::BFloat16* src, int64_t ld, bool transposed, int64_t depth, int64_t cols, PackedB& out) {
  const int64_t pairs = (depth + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    uint16_t* row = bits(out.data.data() + 2 * p * out.ld);
    const int64_t k = 2 * p;
    const bool second = k + 1 < depth;
    if (!transposed) {
      interleave_pair(bits(src + k * ld), second ? bits(src + (k + 1) * ld) : nullptr, row, cols);
    } else if (second) {
      for (int64_t j = 0; j < cols; ++j) std::memcpy(row + 2 * j, bits(src + j * ld + k), 2 * sizeof(uint16_t));
    } else {
      for (int64_t j = 0; j < cols; ++j) row[2 * j] = bits(src + j * ld + k)[0];
    }
  }
}

// Whether packing float32 runs the AVX512_BF16 conversion (rows read in order).
bool fast_packing(bool transposed) { return !transposed && supported(); }

}  // namespace

template <typename T>
void pack_a(const T* src, int64_t ld, bool transposed, int64_t rows, int64_t depth, PackedA& out) {
  out.rows = rows;
  out.depth = depth;
  out.ld = round_up(depth, 2);
  out.data.resize(size_t(rows * out.ld));
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    pack_a_bf16(src, ld, transposed, rows, depth, out);
  } else {
    const bool fast = fast_packing(transposed);
    for (int64_t i = 0; i < rows; ++i) {
      c10::BFloat16* row = out.data.data() + i * out.ld;
#ifdef EXTRAP_BF16_KERNEL
      if (fast)
        for (int64_t k = 0; k < depth; k += 32) narrow32(src + i * ld + k, row + k, std::min<int64_t>(32, depth - k));
#endif
      if (!fast)
        for (int64_t k = 0; k < depth; ++k) row[k] = to_bf16(transposed ? src[k * ld + i] : src[i * ld + k]);
    }
  }
  if (depth % 2)
    for (int64_t i = 0; i < rows; ++i) out.data[size_t(i * out.ld + depth)] = c10::BFloat16(0.0f);
}

template <typename T>
void pack_b(const T* src, int64_t ld, bool transposed, int64_t depth, int64_t cols, PackedB& out) {
  out.depth = depth;
  out.cols = cols;
  out.ld = round_up(cols, 16);
  const int64_t pairs = (depth + 1) / 2;
  out.data.assign(size_t(pairs * out.ld * 2), c10::BFloat16(0.0f));
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    pack_b_bf16(src, ld, transposed, depth, cols, out);
  } else {
    const bool fast = fast_packing(transposed);
    for (int64_t p = 0; p < pairs; ++p) {
      c10::BFloat16* row = out.data.data() + 2 * p * out.ld;
      const int64_t k = 2 * p;
      const bool second = k + 1 < depth;
#ifdef EXTRAP_BF16_KERNEL
      if (fast)
        for (int64_t j = 0; j < cols; j += 16)
          pair16(src + k * ld + j, second ? src + (k + 1) * ld + j : nullptr, row + 2 * j,
                 std::min<int64_t>(16, cols - j));
#endif
      if (!fast) {
        for (int64_t j = 0; j < cols; ++j) {
          row[2 * j] = to_bf16(transposed ? src[j * ld + k] : src[k * ld + j]);
          if (second) row[2 * j + 1] = to_bf16(transposed ? src[j * ld + k + 1] : src[(k + 1) * ld + j]);
        }
      }
    }
  }
}

template void pack_a<float>(const float*, int64_t, bool, int64_t, int64_t, PackedA&);
template void pack_a<c10::BFloat16>(const c10::BFloat16*, int64_t, bool, int64_t, int64_t, PackedA&);
template void pack_b<float>(const float*, int64_t, bool, int64_t, int64_t, PackedB&);
template void pack_b<c10::BFloat16>(const c10::BFloat16*, int64_t, bool, int64_t, int64_t, PackedB&);

void multiply(const PackedA& a, const PackedB& b, int64_t m, int64_t n, float alpha, float* c, int64_t ldc,
              bool accumulate) {
  TORCH_CHECK(supported(), "bf16_gemm::multiply: this CPU has no AVX512_BF16");
  TORCH_CHECK(m <= a.rows && n <= b.cols && a.depth <= b.depth, "bf16_gemm::multiply: ", m, " x ", a.depth,
              " by ", a.depth, " x ", n, " from operands packed as ", a.rows, " x ", a.depth, " and ", b.depth,
              " x ", b.cols);
#ifdef EXTRAP_BF16_KERNEL
  const int64_t pairs = (a.depth + 1) / 2;
  // Column panels of 32 outer (B's panel stays in L1 across the row tiles), rows of 8 inner.
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const int64_t width = std::min<int64_t>(32, n - j0);
    for (int64_t i0 = 0; i0 < m; i0 += 8) {
      const int64_t rows = std::min<int64_t>(8, m - i0);
      const TileFn fn = width > 16 ? tile_for<2>(rows) : tile_for<1>(rows);
      fn(a.data.data() + i0 * a.ld, a.ld, b.data.data() + 2 * j0, b.ld, pairs, a.depth % 2 == 1, width, alpha,
         c + i0 * ldc + j0, ldc, accumulate);
    }
  }
#endif
}

}  // namespace extrap::bf16_gemm
