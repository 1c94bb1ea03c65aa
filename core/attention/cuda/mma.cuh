// Tensor-core and copy primitives for sm_80+ (used on sm_90): mma.sync m16n8k16 with fp32
// accumulators, ldmatrix, and cp.async 16-byte copies. Inline PTX, one instruction each.
//
// Fragment layouts of mma.sync.m16n8k16 (bf16/f16 inputs, f32 accumulators), PTX ISA
// "Matrix Fragments for mma.m16n8k16". For lane l of the warp let g = l / 4 (groupID) and
// t = l % 4 (thread in group). Each .b32 register holds two 16-bit elements, the lower
// column (or row, for B) index in the low half.
//   A (16 x 16, row-major, M x K), 4 registers:
//     a[0] = A[g    ][2t, 2t+1]      a[1] = A[g + 8][2t, 2t+1]
//     a[2] = A[g    ][2t+8, 2t+9]    a[3] = A[g + 8][2t+8, 2t+9]
//   B (16 x 8, "col", K x N), 2 registers:
//     b[0] = B[2t, 2t+1][g]          b[1] = B[2t+8, 2t+9][g]
//   C / D (16 x 8, fp32), 4 registers:
//     c[0] = C[g][2t]   c[1] = C[g][2t+1]   c[2] = C[g+8][2t]   c[3] = C[g+8][2t+1]
//
// ldmatrix.m8n8.x4 loads four 8 x 8 b16 matrices; lanes 8i .. 8i+7 give the addresses of the
// 8 rows of matrix i, and register i of lane l receives row l/4, columns 2(l%4), 2(l%4)+1
// of matrix i, i.e. exactly an A or B register above. With .trans, register i of lane l
// receives rows 2(l%4), 2(l%4)+1 of column l/4 instead (the transposed matrix).
//
// Consequences used by the kernels (row-major tiles in shared memory, rows = tokens,
// columns = head dimension, "X" a tile):
//   - A = X rows (tokens x D):  ldmatrix.x4 with lane l -> row l % 16, column (l / 16) * 8.
//   - B = X^T (B[k = d][n = token] = X[token][d]): ldmatrix.x4, no .trans; the four
//     matrices are (tokens n..n+7, d k..k+7), (n..n+7, k+8..), (n+8.., k..), (n+8.., k+8..),
//     giving b[0], b[1] of n-tile n and b[0], b[1] of n-tile n + 8.
//   - B = X (B[k = token][n = d] = X[token][d]): ldmatrix.x4.trans; matrices
//     (tokens k..k+7, d n..), (k+8.., n..), (k.., n+8..), (k+8.., n+8..).
//   - A = Y^T from a tile Y stored with rows = k (dS from the dS^T tile in the backward):
//     ldmatrix.x4.trans; matrices (k..k+7, m..m+7), (k.., m+8..), (k+8.., m..), (k+8.., m+8..).
//   - A from an accumulator: the C registers of n-tiles 2j and 2j+1 of a product are,
//     packed to 16 bits, the A registers of k-step j of the next product:
//     a[0] = C_{2j}[0,1], a[1] = C_{2j}[2,3], a[2] = C_{2j+1}[0,1], a[3] = C_{2j+1}[2,3].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace extrap::cuda {

// The two 16-bit input types and their mma / conversion spellings.
template <class Element>
struct ElementTraits;

template <>
struct ElementTraits<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo in the low half
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t r) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&r));
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct ElementTraits<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t r) {
    return __half22float2(*reinterpret_cast<__half2*>(&r));
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem_row)));
}

// 16 bytes global -> shared, asynchronous. When !valid nothing is read and the 16 bytes
// are zero-filled (src-size 0); `src` must still be a mapped address, so callers pass the
// tensor's base pointer then.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)),
               "l"(gmem_src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace extrap::cuda
