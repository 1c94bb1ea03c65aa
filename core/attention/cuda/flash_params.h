// The parameters of the fused attention kernels: plain pointers, strides and flags.
//
// Plain C++ (no CUDA or torch headers), so that the LibTorch wrapper, the kernels and the
// benchmark all share one description of a call. Invariants the caller keeps:
//   - q, k, v, o, do, dq, dk, dv are (B, H, T, D) bf16 or fp16 views with unit stride on D,
//     every other stride a multiple of 8 elements and every base pointer 16-byte aligned
//     (the kernels move 16-byte vectors);
//   - D is 64 or 128; T >= 1 is any length (tiles past T are predicated);
//   - lse is (B, H, T) fp32, contiguous; delta and dq_accum are fp32 workspaces
//     (see flash_bwd_workspace_floats in flash_dispatch.h);
//   - scores are (q . k) * softmax_scale + bias(i, j), the bias NOT scaled (ALiBi paper).
#pragma once

#include <cstdint>

namespace extrap::cuda {

enum class ElementType : int { BFloat16, Float16 };

// What is added to the scores and which keys each head may see. One template parameter of
// the kernels; see alibi.cuh for the exact per-head rule of each mode.
enum class BiasMode : int {
  None,               // no bias; keys j > i masked when causal
  AlibiCausal,        // -m_h (i - j), keys j > i masked (whatever `causal` says)
  AlibiSymmetric,     // -m_left (i - j) for j <= i, -m_right (j - i) for j > i, both sides seen
  AlibiNonsymmetric,  // heads h < H/2 see only j <= i, the others only j >= i; slope per head
  Linear,             // per-head slopes AND per-head direction bits; slope gradients on request
  Offsets,            // any bias of j - i alone (T5, KERPLE, Sandwich), read from a per-head table
                      // of offsets; the table's gradient on request
};

// Heads whose direction bits fit in FlashBias (BiasMode::Linear only).
constexpr int kMaxLinearHeads = 256;

struct FlashBias {
  BiasMode mode = BiasMode::None;
  // (H,) fp32 device arrays of positive slopes. For the three Alibi modes both may be null:
  // the kernels then compute the paper's geometric slopes from the head index (alibi.cuh);
  // Nonsymmetric uses the slopes of H/2 heads twice. Linear requires both.
  const float* slopes_left = nullptr;
  const float* slopes_right = nullptr;
  // Linear only: head h may look left (j < i) iff bit h%64 of look_left_bits[h/64] is set,
  // right (j > i) likewise. j == i is always visible. `causal` masks j > i on top.
  uint64_t look_left_bits[kMaxLinearHeads / 64] = {};
  uint64_t look_right_bits[kMaxLinearHeads / 64] = {};
  // Offsets only: an (H, offsets_len) fp32 device array; head h's bias at (i, j) is
  //   offsets[h * offsets_len + offsets_origin + (j - i)],
  // which the caller fills for every offset a visible score reaches: j - i in [-(T - 1), 0] for
  // a causal call, [-(T - 1), T - 1] otherwise. Both sides are seen (the causal flag masks j > i).
  const float* offsets = nullptr;
  int offsets_len = 0;
  int offsets_origin = 0;
};

// A (B, H, T, D) tensor: base pointer and element strides (the D stride is 1).
struct TensorView {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;
};

struct FlashFwdParams {
  TensorView q, k, v;
  TensorView o;           // written
  float* lse = nullptr;   // (B, H, T) natural-log log-sum-exp of each score row, written
  int batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  float softmax_scale = 0.f;  // usually 1 / sqrt(head_dim)
  bool causal = true;
  ElementType dtype = ElementType::BFloat16;
  FlashBias bias;
};

struct FlashBwdParams {
  FlashFwdParams fwd;       // q, k, v, o and lse of the forward call (o and lse read here)
  TensorView dout;          // dL/do, read
  TensorView dq, dk, dv;    // written
  float* delta = nullptr;     // workspace (B, H, T): rowsum(do * o)
  float* dq_accum = nullptr;  // workspace (B, H, T, D) fp32, zeroed by the entry point
  // BiasMode::Linear only, may be null: (H,) fp32 device arrays that the kernel ADDS
  // dL/dslope_left and dL/dslope_right into (the caller zeroes them).
  float* dslopes_left = nullptr;
  float* dslopes_right = nullptr;
  // BiasMode::Offsets only, may be null: (H, offsets_len) fp32, laid out as FlashBias::offsets,
  // that the kernel ADDS dL/d(offsets) into (the caller zeroes it).
  float* doffsets = nullptr;
  // Floats a dQ atomic adds into dq_accum: 1, 2 or 4 (sm_90's float2 and float4 atomicAdd).
  // Set by the dispatcher (flash_bwd_atomic_width(), flash_dispatch.h); every width sums the
  // same products.
  int dq_atomic_width = 4;
};

}  // namespace extrap::cuda
