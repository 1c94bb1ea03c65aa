#include "core/fused_cpu_attention.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <cmath>
#include <limits>
#include <vector>

namespace extrap {

namespace {

constexpr int64_t kQueryBlock = 64;
constexpr float kInf = std::numeric_limits<float>::infinity();

// The Fortran BLAS sgemm_ (32-bit integers) that LibTorch's libtorch_cpu exports (MKL on x86,
// OpenBLAS elsewhere); looked up once at run time, null where there is none.
using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                         const float*, const int*, const float*, const int*, const float*, float*,
                         const int*);
SgemmFn sgemm_function() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

// Row-major C (M x N) = alpha op(A) op(B) + beta C, op(A) M x K, op(B) K x N; lda, ldb, ldc
// are row strides. Column-major BLAS computes C^T = op(B)^T op(A)^T.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = transpose_a ? 'T' : 'N', tb = transpose_b ? 'T' : 'N';
  const int M = int(m), N = int(n), K = int(k), LDA = int(lda), LDB = int(ldb), LDC = int(ldc);
  sgemm_function()(&tb, &ta, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
}

// A (B, H, T, Dh) operand: the row of (b, h, t) starts at data + b * sb + h * sh + t * st.
struct Operand {
  const float* data;
  int64_t sb, sh, st;
  explicit Operand(const torch::Tensor& x)
      : data(x.data_ptr<float>()), sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)) {}
  const float* at(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
};

// The bias of head h as the kernel applies it: bias(i, j) = left * (i - j) for j < i,
// right * (j - i) for j > i, 0 on the diagonal; a head that may not look one way has
// -inf there (and causal attention masks j > i whatever the bias says).
struct HeadBias {
  float left = 0, right = 0;  // -slope, or -inf for a masked direction
};

struct Problem {
  int64_t batch, heads, length, dim;
  float scale;
  bool causal;
  std::vector<HeadBias> bias;  // empty: no bias

  // Sizes and scale from q (B, H, T, D); no bias yet.
  static Problem of(const torch::Tensor& q, bool causal) {
    return {q.size(0), q.size(1), q.size(2), q.size(3), float(1.0 / std::sqrt(double(q.size(3)))), causal, {}};
  }
};

// The element-wise work of a score row, written as plain loops that GCC vectorises, compiled
// for AVX-512, AVX2 and the x86-64 baseline and picked at load time (target_clones); the
// ATen vector types would be compiled for the baseline only in this file. Measured on
// configs/train_quick.yaml (2026-11-23, 2-core AMD EPYC): with scalar expf calls the kernel
// was 8% slower than the reference path; see benchmarks/RESULTS.md for what this gave.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EXTRAP_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define EXTRAP_ISA_CLONES
#endif

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

// Row i of the scores (keys [0, n), the diagonal at i < n) with the head's bias added: the
// keys left of i by left * (i - j) and right of it by right * (j - i), or masked.
struct RowBias {
  float left, right;           // coefficients (-slope)
  bool left_open, right_open;  // whether the row sees those keys at all
};

EXTRAP_ISA_CLONES
float bias_and_max(float* row, int64_t i, int64_t n, RowBias rb) {
  float max = row[i];
  if (rb.left_open) {
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < i; ++j) {
      row[j] += rb.left * float(i - j);
      max = row[j] > max ? row[j] : max;
    }
  }
  if (rb.right_open) {
#pragma omp simd reduction(max : max)
    for (int64_t j = i + 1; j < n; ++j) {
      row[j] += rb.right * float(j - i);
      max = row[j] > max ? row[j] : max;
    }
  }
  return max;
}

// row <- exp(row - shift) where the row sees the key, 0 where masked; returns the sum.
EXTRAP_ISA_CLONES
float exp_row(float* row, int64_t i, int64_t n, RowBias rb, float shift) {
  float sum = 0;
  const int64_t first = rb.left_open ? 0 : i, last = rb.right_open ? n : i + 1;
  for (int64_t j = 0; j < first; ++j) row[j] = 0;
  for (int64_t j = last; j < n; ++j) row[j] = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = first; j < last; ++j) {
    row[j] = exp_float(row[j] - shift);
    sum += row[j];
  }
  return sum;
}

EXTRAP_ISA_CLONES
void scale_row(float* row, int64_t n, float factor) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] *= factor;
}

// dS = P (dP - delta), in place in dP.
EXTRAP_ISA_CLONES
void softmax_backward_row(float* dp, const float* prob, int64_t n, float delta) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dp[j] = prob[j] * (dp[j] - delta);
}

EXTRAP_ISA_CLONES
float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

RowBias row_bias(const Problem& p, int64_t h) {
  const HeadBias hb = p.bias.empty() ? HeadBias{} : p.bias[size_t(h)];
  return {hb.left, hb.right, hb.left != -kInf, !p.causal && hb.right != -kInf};
}

// Adds the bias and masks to row i of the scores (keys 0..n-1), then turns it into softmax
// probabilities in place; returns the row's log-sum-exp.
float softmax_row(float* row, int64_t i, int64_t n, const Problem& p, int64_t h) {
  const RowBias rb = row_bias(p, h);
  const float max = bias_and_max(row, i, n, rb);
  const float sum = exp_row(row, i, n, rb, max);
  scale_row(row, n, 1.0f / sum);
  return max + std::log(sum);
}

// Recomputes row i's probabilities from its scores and log-sum-exp (backward).
void probabilities_row(float* row, int64_t i, int64_t n, const Problem& p, int64_t h, float lse) {
  const RowBias rb = row_bias(p, h);
  bias_and_max(row, i, n, rb);
  exp_row(row, i, n, rb, lse);
}

// Keys that block [i0, i0 + m) attends to: [0, n).
int64_t visible_keys(const Problem& p, int64_t i0, int64_t m) { return p.causal ? i0 + m : p.length; }

void forward_kernel(const Problem& p, const Operand& q, const Operand& k, const Operand& v, float* out,
                    float* lse) {
  const int64_t T = p.length, D = p.dim, H = p.heads, out_row = H * D;
  at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(size_t(std::min(kQueryBlock, T) * T));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float *qb = q.at(b, h), *kb = k.at(b, h), *vb = v.at(b, h);
      float* ob = out + b * T * out_row + h * D;  // (B, T, H, D)
      float* lb = lse + bh * T;
      for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, T - i0), n = visible_keys(p, i0, m);
        gemm(false, true, m, n, D, p.scale, qb + i0 * q.st, q.st, kb, k.st, 0.0f, scores.data(), n);
        for (int64_t r = 0; r < m; ++r) lb[i0 + r] = softmax_row(scores.data() + r * n, i0 + r, n, p, h);
        gemm(false, false, m, D, n, 1.0f, scores.data(), n, vb, v.st, 0.0f, ob + i0 * out_row, out_row);
      }
    }
  });
}

void backward_kernel(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const float* out,
                     const float* lse, const Operand& dout, float* dq, float* dk, float* dv) {
  const int64_t T = p.length, D = p.dim, H = p.heads, row = H * D;  // dq, dk, dv: (B, T, H, D)
  at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(kQueryBlock, T);
    std::vector<float> probs(size_t(block * T)), dscores(size_t(block * T)), delta(static_cast<size_t>(block));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float *qb = q.at(b, h), *kb = k.at(b, h), *vb = v.at(b, h), *gb = dout.at(b, h);
      const float* ob = out + b * T * row + h * D;
      const float* lb = lse + bh * T;
      float *dqb = dq + b * T * row + h * D, *dkb = dk + b * T * row + h * D, *dvb = dv + b * T * row + h * D;
      for (int64_t t = 0; t < T; ++t) {
        std::fill(dkb + t * row, dkb + t * row + D, 0.0f);
        std::fill(dvb + t * row, dvb + t * row + D, 0.0f);
      }
      for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, T - i0), n = visible_keys(p, i0, m);
        const float* go = gb + i0 * dout.st;
        gemm(false, true, m, n, D, p.scale, qb + i0 * q.st, q.st, kb, k.st, 0.0f, probs.data(), n);
        for (int64_t r = 0; r < m; ++r) {
          probabilities_row(probs.data() + r * n, i0 + r, n, p, h, lb[i0 + r]);
          delta[size_t(r)] = dot(ob + (i0 + r) * row, go + r * dout.st, D);
        }
        gemm(true, false, n, D, m, 1.0f, probs.data(), n, go, dout.st, 1.0f, dvb, row);        // dV += P^T dO
        gemm(false, true, m, n, D, 1.0f, go, dout.st, vb, v.st, 0.0f, dscores.data(), n);       // dP = dO V^T
        for (int64_t r = 0; r < m; ++r)  // dS = P (dP - delta)
          softmax_backward_row(dscores.data() + r * n, probs.data() + r * n, n, delta[size_t(r)]);
        gemm(false, false, m, D, n, p.scale, dscores.data(), n, kb, k.st, 0.0f, dqb + i0 * row, row);  // dQ
        gemm(true, false, n, D, m, p.scale, dscores.data(), n, qb + i0 * q.st, q.st, 1.0f, dkb, row);  // dK +=
      }
    }
  });
}

Problem make_problem(const torch::Tensor& q, const AttentionBias& bias, bool causal) {
  Problem p = Problem::of(q, causal);
  if (bias.kind == AttentionBias::Kind::Linear) {
    const auto left = bias.slopes_left.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const auto right = bias.slopes_right.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const auto look_left = bias.look_left.contiguous(), look_right = bias.look_right.contiguous();
    for (int64_t h = 0; h < p.heads; ++h) {
      HeadBias hb;
      hb.left = look_left[h].item<bool>() ? -left[h].item<float>() : -kInf;
      hb.right = look_right[h].item<bool>() ? -right[h].item<float>() : -kInf;
      p.bias.push_back(hb);
    }
  }
  return p;
}

class FusedCpuAttentionFunction : public torch::autograd::Function<FusedCpuAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, const Problem* problem) {
    const Problem& p = *problem;
    auto out = torch::empty({p.batch, p.length, p.heads, p.dim}, q.options());
    auto lse = torch::empty({p.batch, p.heads, p.length}, q.options());
    forward_kernel(p, Operand(q), Operand(k), Operand(v), out.data_ptr<float>(), lse.data_ptr<float>());
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["causal"] = p.causal;
    std::vector<double> left, right;
    for (const auto& hb : p.bias) {
      left.push_back(hb.left);
      right.push_back(hb.right);
    }
    ctx->saved_data["left"] = left;
    ctx->saved_data["right"] = right;
    return out.permute({0, 2, 1, 3});  // (B, H, T, D) view
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    Problem p = Problem::of(q, ctx->saved_data["causal"].toBool());
    const auto left = ctx->saved_data["left"].toDoubleVector(), right = ctx->saved_data["right"].toDoubleVector();
    for (size_t h = 0; h < left.size(); ++h) p.bias.push_back({float(left[h]), float(right[h])});
    auto dout = grads[0];
    if (dout.stride(3) != 1) dout = dout.contiguous();
    auto dq = torch::empty({p.batch, p.length, p.heads, p.dim}, q.options());
    auto dk = torch::empty_like(dq), dv = torch::empty_like(dq);
    backward_kernel(p, Operand(q), Operand(k), Operand(v), out.data_ptr<float>(), lse.data_ptr<float>(),
                    Operand(dout), dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>());
    return {dq.permute({0, 2, 1, 3}), dk.permute({0, 2, 1, 3}), dv.permute({0, 2, 1, 3}), torch::Tensor()};
  }
};

}  // namespace

std::string fused_cpu_attention_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, const AttentionBias& bias,
                                                   const AttentionOptions& options) {
  if (!sgemm_function()) return "LibTorch exports no BLAS sgemm_";
  for (const auto* x : {&q, &k, &v}) {
    if (!x->device().is_cpu()) return "not a CPU tensor";
    if (x->scalar_type() != torch::kFloat32) return "not float32";
    if (x->dim() != 4 || x->sizes() != q.sizes()) return "q, k and v of different shapes";
    if (x->stride(3) != 1) return "head dimension not contiguous";
  }
  if (q.size(2) * std::max<int64_t>(q.stride(2), 1) > std::numeric_limits<int>::max() / 2)
    return "too long for 32-bit BLAS strides";
  if (options.training && options.dropout > 0) return "attention dropout";
  if (bias.kind != AttentionBias::Kind::None && bias.kind != AttentionBias::Kind::Linear)
    return "bias kind " + bias.describe();
  if (bias.kind == AttentionBias::Kind::Linear) {
    if (bias.positions.defined()) return "sampled positions";
    if (bias.slopes_left.requires_grad() || bias.slopes_right.requires_grad()) return "learned slopes";
    if (bias.slopes_left.size(0) != q.size(1)) return "slopes for another head count";
  }
  return "";
}

torch::Tensor fused_cpu_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const AttentionBias& bias, const AttentionOptions& options) {
  const std::string reason = fused_cpu_attention_unsupported_reason(q, k, v, bias, options);
  TORCH_CHECK(reason.empty(), "attention: the fused CPU kernel does not take this call (", reason, ")");
  const Problem problem = make_problem(q, bias, options.causal);
  return FusedCpuAttentionFunction::apply(q, k, v, &problem);
}

}  // namespace extrap
