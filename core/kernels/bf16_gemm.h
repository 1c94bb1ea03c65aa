// Small matrix products with bfloat16 inputs and float32 accumulation, for the CPU training
// attention (core/attention/fused_cpu_attention.cpp) under train.precision bf16, on CPUs with
// AVX512_BF16: C = alpha A B (+ C), A (M x K) and B (K x N).
//
// Why not the BLAS: LibTorch's exported BLAS (MKL) has no fast bfloat16 product on AMD CPUs
// (its cblas_gemm_bf16bf16f32 runs no faster than its float32 sgemm_ on the attention's
// 64 x 64 x 32 to 256 x 256 x 32 shapes; benchmarks/RESULTS.md, part 2), and oneDNN's, which
// LibTorch uses for its bfloat16 products, is reachable only through ATen operators whose
// output is bfloat16 (the scores must stay float32: they carry the position bias). The kernel
// here is VDPBF16PS on packed operands.
//
// Operands are packed first: A into rows of K values rounded up to an even count (zero
// padding), B into pairs of rows (B[2p][j], B[2p+1][j]) side by side, the layout VDPBF16PS
// reads, N rounded up to 16. Packing takes float32 (rounded to nearest even, as LibTorch's
// casts, except that values below 2^-126, float32's subnormals, become 0 on the AVX512_BF16
// path: the instructions treat them as zero) or bfloat16 sources, either way round (transposed or not). A product may use a prefix
// of a packed operand: the first M rows of A, the first N columns and K rows of B, provided A
// was packed with depth K exactly (its zero padding then covers an odd K).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

namespace extrap::bf16_gemm {

// Whether this CPU runs the kernel: AVX512_BF16 and AVX512BW, with the OS saving AVX-512 state.
bool supported();
// supported() and not switched off: EXTRAP_BF16_ATTENTION_KERNEL=0 in the environment (any
// value but 0 and 1 is refused, naming it), or set_enabled(false) (for benchmarks and tests that compare against the float32-products
// path). Callers choose the path with this; a product already under way (a backward pass whose
// forward used the kernel) still runs where supported().
bool available();
void set_enabled(bool enabled);

struct PackedA {
  std::vector<c10::BFloat16> data;
  int64_t rows = 0, depth = 0, ld = 0;  // ld: depth rounded up to even
};

struct PackedB {
  std::vector<c10::BFloat16> data;
  int64_t depth = 0, cols = 0, ld = 0;  // ld: pairs of values in a row of pairs (cols rounded up to 16)
};

// A(i, k) = src[i * ld + k], or src[k * ld + i] when transposed; i < rows, k < depth.
template <typename T>
void pack_a(const T* src, int64_t ld, bool transposed, int64_t rows, int64_t depth, PackedA& out);

// B(k, j) = src[k * ld + j], or src[j * ld + k] when transposed; k < depth, j < cols.
template <typename T>
void pack_b(const T* src, int64_t ld, bool transposed, int64_t depth, int64_t cols, PackedB& out);

// C(i, j) = alpha sum_k A(i, k) B(k, j) (+ C(i, j) when accumulate), i < m, j < n, k < depth,
// C row-major with row stride ldc. Needs supported(); m <= a.rows, n <= b.cols,
// depth == a.depth <= b.depth. Rows of B at or past depth never reach C, whatever they hold.
void multiply(const PackedA& a, const PackedB& b, int64_t m, int64_t n, float alpha, float* c,
              int64_t ldc, bool accumulate);

}  // namespace extrap::bf16_gemm
