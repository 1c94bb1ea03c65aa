#include "core/attention/fused_cpu_attention.h"

#include "core/base/float_range.h"
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/cpu_vector_math.h"
#include "core/kernels/qkv_heads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
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

// MKL's MKL_Set_Num_Threads_Local (mkl_set_num_threads_local in mkl_service.h; libtorch_cpu exports
// it where MKL is its BLAS; the lower-case symbols are the Fortran interface), null elsewhere.
using SetThreadsFn = int (*)(int);
SetThreadsFn mkl_threads_local_function() {
  static const SetThreadsFn fn = reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  return fn;
}

// Row-major C (M x N) = alpha op(A) op(B) + beta C, op(A) M x K, op(B) K x N; lda, ldb, ldc
// are row strides. Column-major BLAS computes C^T = op(B)^T op(A)^T. Every call comes from a
// task of a parallel loop and runs on that task's thread alone: MKL chooses its kernel by the
// threads it may use even there (on AVX2 paths a 2-row product rounds differently with 1 and
// with 3), and one thread keeps a block's numbers the same whatever the thread count.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = transpose_a ? 'T' : 'N', tb = transpose_b ? 'T' : 'N';
  const int M = int(m), N = int(n), K = int(k), LDA = int(lda), LDB = int(ldb), LDC = int(ldc);
  const SetThreadsFn set_threads = mkl_threads_local_function();
  const int previous = set_threads ? set_threads(1) : 0;
  sgemm_function()(&tb, &ta, &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
  if (set_threads) set_threads(previous);
}

// The bias of head h as the kernel applies it: bias(i, j) = left * (i - j) for j < i,
// right * (j - i) for j > i, 0 on the diagonal; a head that may not look one way has
// -inf there (and causal attention masks j > i whatever the bias says).
struct HeadBias {
  float left = 0, right = 0;  // -slope, or -inf for a masked direction
};

// Zeros on each side of a head's biases by offset (Problem::offsets): a row's loops read whole
// groups of kLanes columns past its first and last visible keys.
constexpr int64_t kOffsetPad = 16;

struct Problem {
  int64_t batch = 0, heads = 0, length = 0, dim = 0;
  // Grouped-query attention: k and v have kv_heads heads, query head h reads key and value head
  // h / group (kv_heads == heads: one each).
  int64_t kv_heads = 0;
  int64_t group() const { return heads / kv_heads; }
  float scale = 1;
  bool causal = true;
  std::vector<HeadBias> bias;  // empty: no bias
  // The bias's options (core/attention/attention.h): masks by index, each head's sink logit (empty:
  // none), and the rows' logit factors c[h * T + i] (null: none; the caller keeps them alive).
  int64_t window = 0, chunk = 0;
  std::vector<float> sink;
  const float* logit_scale = nullptr;
  // attention.softcap C: the scores q.k / sqrt(d) become C tanh(q.k / (sqrt(d) C)) before the bias
  // and the masks (cap_rows; 0: none).
  float softcap = 0;
  // A bias of j - i alone (AttentionBias::by_offset): head h's bias at offset o = j - i is
  // offsets[h * offset_stride + kOffsetPad + o + length - 1]. Empty: none.
  std::vector<float> offsets;
  int64_t offset_stride = 0;

  // Head h's bias (none: both sides open, no slope).
  HeadBias head(int64_t h) const { return bias.empty() ? HeadBias{} : bias[size_t(h)]; }

  // Sizes and scale from q (B, H, T, D) and k (B, Hkv, T, D); no bias yet.
  static Problem of(const torch::Tensor& q, const torch::Tensor& k, bool causal) {
    Problem p;
    p.batch = q.size(0), p.heads = q.size(1), p.length = q.size(2), p.dim = q.size(3), p.kv_heads = k.size(1);
    p.scale = float(1.0 / std::sqrt(double(q.size(3))));
    p.causal = causal;
    return p;
  }
};

// The keys [first, last] that query i of head h sees: its bias's directions, the causal half,
// the window and the chunk. Both ends are nondecreasing in i, so a block of rows sees the keys
// from its first row's first to its last row's last.
struct KeyRange {
  int64_t first, last;
};
KeyRange row_keys(const Problem& p, int64_t h, int64_t i) {
  const HeadBias hb = p.head(h);
  int64_t first = hb.left == -kInf ? i : 0, last = p.causal || hb.right == -kInf ? i : p.length - 1;
  if (p.window > 0) {
    first = std::max(first, i - (p.window - 1));
    last = std::min(last, i + (p.window - 1));
  }
  if (p.chunk > 0) {
    first = std::max(first, i / p.chunk * p.chunk);
    last = std::min(last, i / p.chunk * p.chunk + p.chunk - 1);
  }
  return {first, last};
}

// The keys [begin, end) that the block of rows [i0, i0 + m) of head h attends to.
KeyRange block_keys(const Problem& p, int64_t h, int64_t i0, int64_t m) {
  return {row_keys(p, h, i0).first, row_keys(p, h, i0 + m - 1).last + 1};
}

// The rows of one (batch, head) as float32: row t starts at data + t * stride.
struct Rows {
  float* data;
  int64_t stride;
};

// A (B, H, T, Dh) input, float32 or bfloat16: the row of (b, h, t) starts at element
// b * sb + h * sh + t * st.
struct Operand {
  const void* data;
  bool bf16;
  int64_t sb, sh, st;
  explicit Operand(const torch::Tensor& x)
      : data(x.data_ptr()), bf16(x.scalar_type() == torch::kBFloat16),
        sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)) {}

  const c10::BFloat16* bf16_at(int64_t b, int64_t h) const {
    return static_cast<const c10::BFloat16*>(data) + b * sb + h * sh;
  }

  // The T rows of (b, h) as float32: in place for a float32 tensor, widened into `buffer`
  // (T x D, contiguous) for a bfloat16 one.
  Rows rows(int64_t b, int64_t h, int64_t T, int64_t D, std::vector<float>& buffer) const {
    if (!bf16) return {const_cast<float*>(static_cast<const float*>(data)) + b * sb + h * sh, st};
    buffer.resize(size_t(T * D));
    const auto* x = static_cast<const c10::BFloat16*>(data) + b * sb + h * sh;
    for (int64_t t = 0; t < T; ++t) widen(x + t * st, buffer.data() + t * D, D);
    return {buffer.data(), D};
  }
};

// A (B, H, T, Dh) output with unit stride in Dh, float32 or bfloat16, written head by head: the
// row of (b, h, t) starts at element b * sb + h * sh + t * st. rows() gives the rows of (b, h)
// to write as float32 (the tensor's own for float32, `buffer` for bfloat16), and store() rounds
// a bfloat16 output's buffer into the tensor.
struct Destination {
  void* data;
  bool bf16;
  int64_t T, D, sb, sh, st;
  explicit Destination(const torch::Tensor& x)
      : data(x.data_ptr()), bf16(x.scalar_type() == torch::kBFloat16), T(x.size(2)), D(x.size(3)),
        sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)) {}
  int64_t offset(int64_t b, int64_t h) const { return b * sb + h * sh; }

  Rows rows(int64_t b, int64_t h, std::vector<float>& buffer) const {
    if (!bf16) return {static_cast<float*>(data) + offset(b, h), st};
    buffer.resize(size_t(T * D));
    return {buffer.data(), D};
  }
  void store(int64_t b, int64_t h, const std::vector<float>& buffer) const {
    if (bf16) store_rows(b, h, 0, T, buffer.data());
  }
  // Rows [t0, t0 + m) of (b, h) of a bfloat16 output from float32 rows (m x D).
  void store_rows(int64_t b, int64_t h, int64_t t0, int64_t m, const float* rows) const {
    narrow_rows(rows, m, D, static_cast<c10::BFloat16*>(data) + offset(b, h) + t0 * st, st);
  }
  // All rows of (b, h) of a bfloat16 output from its transpose (D x T, float32).
  void store_transposed(int64_t b, int64_t h, const float* transposed) const {
    auto* y = static_cast<c10::BFloat16*>(data) + offset(b, h);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) y[t * st + d] = c10::BFloat16(transposed[d * T + t]);
  }
};

// A row of scores in a buffer whose column c holds key k0 + c, for the query at column i (which
// may lie outside the buffer): the keys it sees are the columns [i + first, i + last], each with
// the head's bias added (left of the diagonal left * (i - j), right of it right * (j - i)) and the
// sum times the row's logit factor; the other columns are masked.
struct RowBias {
  float left, right;   // coefficients (-slope); 0 on a side the row does not see
  float first, last;   // the visible columns' offsets d = j - i, first <= last
  float factor = 1;    // the row's logit scale (1: none)
  int64_t begin, end;  // the columns the row's loops cover: whole groups of kLanes holding [first, last]
  const float* offsets = nullptr;  // a bias by offset: column c's (null: none; then left and right are 0)
};

// The softmax's row loops run over whole groups of kLanes floats (one AVX-512 vector), so that
// they compile to full vectors with no scalar remainder, and stop at the group of the row's last
// visible key: a causal row i costs about i + 1 entries, not n. Score buffers have rows of
// padded_keys(n) floats, so a row's last group is inside the buffer. Measured on
// configs/train_quick.yaml bf16 (T = 64): see benchmarks/RESULTS.md, part 6.
constexpr int64_t kLanes = 16;
static_assert(kOffsetPad >= kLanes, "a row's loops read up to kLanes - 1 columns past its visible keys");
int64_t padded_keys(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }


// bias_and_max's loop over the row's groups, lane maxima into max[kLanes]. kOffsets: the bias is
// read from rb.offsets (a bias by offset), else it is the linear one. The lane index is an int32:
// AVX2 has no vector conversion of int64 to float, and an int64 lane index kept this loop scalar
// on AVX2 paths (a third of the kernel's time at 8k; benchmarks/RESULTS.md). Each kind is its own
// kernel below, so that scripts/check_vectorised.py reads each one's code.
template <bool kOffsets>
[[gnu::always_inline]] inline void bias_and_max_groups(float* row, int64_t i, const RowBias& rb, float* max) {
  const float left = -rb.left, right = rb.right, first = rb.first, last = rb.last, factor = rb.factor;
  for (int64_t j0 = rb.begin; j0 < rb.end; j0 += kLanes) {
    float* group = row + j0;
    const float* offsets = kOffsets ? rb.offsets + j0 : nullptr;
    const float d0 = float(j0 - i);
#pragma omp simd
    for (int32_t l = 0; l < int32_t(kLanes); ++l) {
      const float d = d0 + float(l);
      const float bias = kOffsets ? offsets[l] : (d < 0.0f ? left : right) * d;
      const float wall = d < first || d > last ? -kInf : 0.0f;
      const float s = (group[l] + bias) * factor + wall;
      group[l] = s;
      max[l] = s > max[l] ? s : max[l];
    }
  }
}

// row[j] <- score + bias for the keys row i sees, -inf for the rest, j < end (keys past n are
// padding, unseen); lane maxima into max[kLanes]. Written with selects on float comparisons only,
// so that GCC vectorises it: with d = j - i, the bias is (-left) d left of the diagonal and
// right d right of it (the same products as left (i - j) and right (j - i)), or the bias by
// offset, and an unseen key gets a wall of -inf added instead.
EXTRAP_ISA_KERNEL(void, linear_bias_and_max, (float* row, int64_t i, const RowBias& rb, float* max), (row, i, rb, max)) {
  bias_and_max_groups<false>(row, i, rb, max);
}
EXTRAP_ISA_KERNEL(void, offset_bias_and_max, (float* row, int64_t i, const RowBias& rb, float* max), (row, i, rb, max)) {
  bias_and_max_groups<true>(row, i, rb, max);
}

// The two above by the row's bias; returns the row's maximum.
float bias_and_max(float* row, int64_t i, const RowBias& rb) {
  float max[kLanes];  // lane by lane across the groups, so that no group ends in a horizontal step
  std::fill(max, max + kLanes, -kInf);
  (rb.offsets ? offset_bias_and_max : linear_bias_and_max)(row, i, rb, max);
  return *std::max_element(max, max + kLanes);
}

// row[j] <- exp(row[j] - shift) for begin <= j < end (0 where bias_and_max masked it), 0 for
// the other j < n; returns the sum.
EXTRAP_ISA_KERNEL(float, exp_row, (float* row, int64_t n, int64_t begin, int64_t end, float shift), (row, n, begin, end, shift)) {
  float sum[kLanes] = {};  // lane by lane across the groups, as bias_and_max's maximum
  std::fill(row, row + std::min(begin, n), 0.0f);
  for (int64_t j0 = begin; j0 < end; j0 += kLanes) {
    float* group = row + j0;
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) {
      group[l] = exp_float(group[l] - shift);
      sum[l] += group[l];
    }
  }
  for (int64_t j = end; j < n; ++j) row[j] = 0;
  float total = 0;
  for (int64_t l = 0; l < kLanes; ++l) total += sum[l];
  return total;
}

EXTRAP_ISA_KERNEL(void, scale_row, (float* row, int64_t n, float factor), (row, n, factor)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) row[j] *= factor;
}

// dS = P (dP - delta), in place in dP.
EXTRAP_ISA_KERNEL(void, softmax_backward_row, (float* dp, const float* prob, int64_t n, float delta), (dp, prob, n, delta)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dp[j] = prob[j] * (dp[j] - delta);
}

EXTRAP_ISA_KERNEL(float, dot, (const float* a, const float* b, int64_t n), (a, b, n)) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += a[j] * b[j];
  return sum;
}

// dst[j] += src[j], j < n.
EXTRAP_ISA_KERNEL(void, add_row, (float* dst, const float* src, int64_t n), (dst, src, n)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
}

// sum_j dz[j] (raw[j] + bias(j - i)) over columns [begin, end): the logit-scale gradient of a row
// (softmax_backward_block), with the bias left * d left of the diagonal and right * d right of it
// (d = j - i, as bias_and_max). dz is 0 wherever the row sees nothing, so no mask is needed.
EXTRAP_ISA_KERNEL(float, biased_dot, (const float* dz, const float* raw, int64_t i, int64_t begin, int64_t end, float left, float right), (dz, raw, i, begin, end, left, right)) {
  // The offsets counted in int32: AVX2 has no vector conversion of int64 to float.
  float sum = 0;
  const int32_t first = int32_t(begin - i), count = int32_t(end - begin);
  dz += begin;
  raw += begin;
#pragma omp simd reduction(+ : sum)
  for (int32_t t = 0; t < count; ++t) {
    const float d = float(first + t);
    sum += dz[t] * (raw[t] + (d < 0.0f ? left : right) * d);
  }
  return sum;
}

// The soft cap (Problem::softcap) on the m rows of a block's scores, n columns `stride` apart:
// s <- C tanh(s / C), as the reference computes it (core/attention/attention.cpp), before the
// bias and the masks are added. Every column is capped, the masked ones too (they are masked
// after).
EXTRAP_ISA_KERNEL(void, cap_rows, (float* rows, int64_t m, int64_t n, int64_t stride, float cap), (rows, m, n, stride, cap)) {
  const float inverse = 1.0f / cap;
  for (int64_t r = 0; r < m; ++r) {
    float* row = rows + r * stride;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = cap * tanh_float(row[j] * inverse);
  }
}

// The gradient through the cap, in place: dS <- dS (1 - (c / C)^2) for the capped scores c
// (d/ds C tanh(s / C) = 1 - tanh^2(s / C)), the m rows of n columns `stride` apart.
EXTRAP_ISA_KERNEL(void, cap_backward_rows, (float* grads, const float* capped, int64_t m, int64_t n, int64_t stride, float cap), (grads, capped, m, n, stride, cap)) {
  const float inverse = 1.0f / cap;
  for (int64_t r = 0; r < m; ++r) {
    float* g = grads + r * stride;
    const float* c = capped + r * stride;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float t = c[j] * inverse;
      g[j] *= 1.0f - t * t;
    }
  }
}

// cap_rows where the problem has a soft cap.
void cap_block(const Problem& p, float* rows, int64_t m, int64_t n, int64_t stride) {
  if (p.softcap > 0) cap_rows(rows, m, n, stride, p.softcap);
}

// Row i of head h in a buffer of n columns holding keys [k0, k0 + n): its bias, the columns it
// sees and its logit factor. A row that sees none of them gets begin == end.
RowBias row_bias(const Problem& p, int64_t h, int64_t i, int64_t k0, int64_t n) {
  const HeadBias hb = p.head(h);
  const KeyRange keys = row_keys(p, h, i);
  const int64_t first = std::max(keys.first, k0) - i, last = std::min(keys.last, k0 + n - 1) - i;  // d = j - i
  RowBias rb{first < 0 ? hb.left : 0.0f, last > 0 ? hb.right : 0.0f, float(first), float(last), 1.0f, 0, 0};
  if (p.logit_scale) rb.factor = p.logit_scale[h * p.length + i];
  if (!p.offsets.empty())  // column c is key k0 + c: offset k0 + c - i
    rb.offsets = p.offsets.data() + h * p.offset_stride + kOffsetPad + (k0 - i) + (p.length - 1);
  if (first <= last) {
    rb.begin = (i + first - k0) / kLanes * kLanes;  // column of the first visible key, its group
    rb.end = padded_keys(i + last - k0 + 1);
  }
  return rb;
}

// Adds the bias and masks to a row of the scores (n columns, keys from k0) of query i, then turns
// it into softmax probabilities in place, the head's sink taking its share; returns the row's
// log-sum-exp (the sink's term included).
float softmax_row(float* row, int64_t i, int64_t k0, int64_t n, const Problem& p, int64_t h) {
  const RowBias rb = row_bias(p, h, i, k0, n);
  float max = bias_and_max(row, i - k0, rb);
  if (!p.sink.empty()) max = std::max(max, p.sink[size_t(h)]);
  float sum = exp_row(row, n, rb.begin, rb.end, max);
  if (!p.sink.empty()) sum += std::exp(p.sink[size_t(h)] - max);
  scale_row(row + rb.begin, std::min(rb.end, n) - rb.begin, 1.0f / sum);
  return max + std::log(sum);
}

// Recomputes a row's probabilities from its scores and log-sum-exp (backward).
void probabilities_row(float* row, int64_t i, int64_t k0, int64_t n, const Problem& p, int64_t h, float lse) {
  const RowBias rb = row_bias(p, h, i, k0, n);
  bias_and_max(row, i - k0, rb);
  exp_row(row, n, rb.begin, rb.end, lse);
}

// softmax_row for the m rows (queries i0, i0 + 1, ...) of a block's scores, n columns each (keys
// from k0), rows padded_keys(n) apart; their log-sum-exps into lse[i0 ...].
void softmax_block(float* scores, int64_t i0, int64_t m, int64_t k0, int64_t n, const Problem& p, int64_t h,
                   float* lse) {
  const int64_t stride = padded_keys(n);
  for (int64_t r = 0; r < m; ++r) lse[i0 + r] = softmax_row(scores + r * stride, i0 + r, k0, n, p, h);
}

// probabilities_row for the m rows of a block, from their saved log-sum-exps.
void probabilities_block(float* scores, int64_t i0, int64_t m, int64_t k0, int64_t n, const Problem& p, int64_t h,
                         const float* lse) {
  const int64_t stride = padded_keys(n);
  for (int64_t r = 0; r < m; ++r) probabilities_row(scores + r * stride, i0 + r, k0, n, p, h, lse[i0 + r]);
}

// Where the backward pass puts the gradients of the sink and the logit scale of one (batch, head):
// d sink += sum_i -P_sink(i) delta_i, and dc[i] for each row (null: not wanted).
struct OptionGradients {
  float* sink = nullptr;     // one float
  float* scale = nullptr;    // T floats
  float* offsets = nullptr;  // a bias by offset's: offset_stride floats, indexed as Problem::offsets
};

// The backward of the softmax for the m rows of a block (queries from i0, n columns of keys from
// k0, rows `stride` apart), in place in dP: dZ = P (dP - delta), delta = rowsum(P dP), the
// gradient of the logits z (rowsum(P dP) is the softmax backward's shift rowsum(dO o O), with O =
// P V and dP = dO V^T, so O is not needed; the sink's column has no value, so dP is 0 there and it
// adds nothing to delta). With a sink: d sink -= P_sink delta, P_sink = exp(sink - lse). With a
// logit scale c (z = c x, x = the scores with their bias): dc_i = sum_j dZ_ij x_ij, from the rows'
// scores and bias as they were before the softmax (`raw`, the block's q k^T / sqrt(d)), and the
// gradient of x, c dZ, left in dP for the products that follow. With a bias by offset, that
// gradient summed along each diagonal is the gradient of the bias at its offset j - i.
void softmax_backward_block(float* dp, const float* prob, int64_t i0, int64_t m, int64_t k0, int64_t n,
                            int64_t stride, const Problem& p, int64_t h, const float* lse, const float* raw,
                            OptionGradients grads) {
  for (int64_t r = 0; r < m; ++r) {
    float* row = dp + r * stride;
    const float delta = dot(prob + r * stride, row, n);
    softmax_backward_row(row, prob + r * stride, n, delta);
    if (grads.sink) *grads.sink -= std::exp(p.sink[size_t(h)] - lse[i0 + r]) * delta;
    if (!p.logit_scale && !grads.offsets) continue;
    const int64_t i = i0 + r;
    const RowBias rb = row_bias(p, h, i, k0, n);
    const int64_t begin = std::min(rb.begin, n), end = std::min(rb.end, n);  // dZ is 0 outside
    if (p.logit_scale) {
      if (grads.scale) {
        const float* x = raw + r * stride;
        grads.scale[i] += rb.offsets ? dot(row + begin, x + begin, end - begin) +
                                           dot(row + begin, rb.offsets + begin, end - begin)
                                     : biased_dot(row, x, i - k0, begin, end, -rb.left, rb.right);
      }
      scale_row(row, n, rb.factor);
    }
    // Column c holds offset k0 + c - i, as rb.offsets reads it.
    if (grads.offsets) add_row(grads.offsets + kOffsetPad + (k0 - i) + (p.length - 1) + begin, row + begin, end - begin);
  }
}

void forward_kernel(const Problem& p, const Operand& q, const Operand& k, const Operand& v,
                    const Destination& out, float* lse) {
  const int64_t T = p.length, D = p.dim, H = p.heads;
  at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(size_t(std::min(kQueryBlock, T) * padded_keys(T))), qbuf, kbuf, vbuf, obuf;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const int64_t kvh = h / p.group();
      const Rows qr = q.rows(b, h, T, D, qbuf), kr = k.rows(b, kvh, T, D, kbuf), vr = v.rows(b, kvh, T, D, vbuf);
      const Rows o = out.rows(b, h, obuf);
      float* lb = lse + bh * T;
      for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, T - i0);
        const KeyRange keys = block_keys(p, h, i0, m);
        const int64_t k0 = keys.first, n = keys.last - k0, ns = padded_keys(n);
        gemm(false, true, m, n, D, p.scale, qr.data + i0 * qr.stride, qr.stride, kr.data + k0 * kr.stride, kr.stride,
             0.0f, scores.data(), ns);
        cap_block(p, scores.data(), m, n, ns);
        softmax_block(scores.data(), i0, m, k0, n, p, h, lb);
        gemm(false, false, m, D, n, 1.0f, scores.data(), ns, vr.data + k0 * vr.stride, vr.stride, 0.0f,
             o.data + i0 * o.stride, o.stride);
      }
      out.store(b, h, obuf);
    }
  });
}

// Inference (no gradient, float32): the forward alone, as FlashAttention computes it. Each task
// is one (batch, head, block of queries): long evaluations run one window at a time (B = 1),
// and B x H tasks would leave cores idle. A causal block costs in proportion to its index, so
// tasks alternate between a head's first and last blocks, and the equal ranges
// at::parallel_for hands the threads carry about equal work. A task walks the keys it sees in
// tiles with an online softmax, so that its scores stay in cache at any length; nothing is kept
// for a backward pass.
//
// A linear bias makes far keys negligible, and a tile of them is skipped when that is certain
// (negligible_distance, fused_cpu_attention.h). The result is the same number, to rounding.
//
// The tiles' sizes (InferenceTiles): where tiles may be skipped, blocks of 64 queries and tiles
// of 256 keys, so that little is computed past the negligible distance; where none can be (no
// bias, or a logit scale), blocks of 256 queries and tiles of 512 keys, whose products MKL runs
// faster (each key tile packed once for 256 rows instead of 64) while the tile's scores (512 KB)
// stay in a core's L2. Measured (`extrap bench attention`, H 12, D 64, causal, 2 cores, Intel
// Xeon AVX-512, 2026-11-29): without a bias, 8k tokens 797-811 ms with 64 x 256 against 678-735
// ms with 256 x 512 (PyTorch's SDPA 688-760 ms in the same runs); with ALiBi 64 x 256 stays
// faster (391-410 ms against 413-470 ms). Below kLargeTilesFrom queries the small tiles stay
// (a large block would leave few tasks). The choice depends on the problem alone, never on the
// thread count, so that a row's numbers are the same bits on any machine's threads.
constexpr int64_t kKeyTile = 256;
constexpr int64_t kLargeQueryBlock = 256, kLargeKeyTile = 512, kLargeTilesFrom = 1024;
static_assert(kQueryBlock <= kLargeQueryBlock, "forward_inference_kernel sizes its row arrays by the larger block");
constexpr double kNegligible = 64.0;  // in logits: e^-64 of the row's largest

// |k_t| of every key row of every (batch, key head), for the bound above: (B * Hkv, T).
std::vector<float> key_norms(const Problem& p, const Operand& k) {
  const int64_t T = p.length, D = p.dim;
  std::vector<float> norms(size_t(p.batch * p.kv_heads * T));
  at::parallel_for(0, p.batch * p.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> unused;
    for (int64_t bh = begin; bh < end; ++bh) {
      const Rows kr = k.rows(bh / p.kv_heads, bh % p.kv_heads, T, D, unused);
      for (int64_t t = 0; t < T; ++t)
        norms[size_t(bh * T + t)] = std::sqrt(dot(kr.data + t * kr.stride, kr.data + t * kr.stride, D));
    }
  });
  return norms;
}

// What a task needs to decide whether a tile of keys is negligible (see above).
struct NegligibleBound {
  float reach;          // scale * max |q_i| * (max |k| of the tile + max |k_i| of the block's own keys)
  float coefficient;    // the bias per unit of distance on the tile's side (-slope), or 0
  int64_t distance;     // the nearest distance between the block's queries and the tile's keys
  bool negligible() const { return double(distance) > negligible_distance(reach, -coefficient); }
};

// The online softmax's step for one row of a tile: adds the bias and masks, folds the tile into
// the row's running maximum and sum, and leaves the tile's weights exp(score - new maximum) in
// place (0 for keys the row does not see). Returns the factor the row's output so far is to be
// scaled by (1 when the row saw nothing new).
float online_softmax_row(float* row, int64_t relative_i, int64_t keys, RowBias rb, float& max, float& sum) {
  const float tile_max = rb.begin < rb.end ? bias_and_max(row, relative_i, rb) : -kInf;
  const float new_max = std::max(max, tile_max);
  if (new_max == -kInf) {  // nothing seen yet: no weights, no rescaling
    exp_row(row, keys, 0, 0, 0.0f);
    return 1.0f;
  }
  const float factor = std::exp(max - new_max);
  sum = sum * factor + exp_row(row, keys, rb.begin, rb.end, new_max);
  max = new_max;
  return factor;
}

// The query block and key tile of forward_inference_kernel (see above).
struct InferenceTiles {
  int64_t query_block, key_tile;
};
InferenceTiles inference_tiles(const Problem& p, bool may_skip) {
  if (may_skip || p.length < kLargeTilesFrom) return {kQueryBlock, kKeyTile};
  return {kLargeQueryBlock, kLargeKeyTile};
}

void forward_inference_kernel(const Problem& p, const Operand& q, const Operand& k, const Operand& v,
                              const Destination& out) {
  const int64_t T = p.length, D = p.dim, H = p.heads;
  // (No bound under a logit scale: a factor below 1, or not positive, would undo it.)
  const std::vector<float> norms = p.bias.empty() || p.logit_scale ? std::vector<float>() : key_norms(p, k);
  const InferenceTiles tiles = inference_tiles(p, /*may_skip=*/!norms.empty());
  const int64_t QB = tiles.query_block, KT = tiles.key_tile, blocks = (T + QB - 1) / QB;
  at::parallel_for(0, p.batch * H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(size_t(std::min(QB, T) * padded_keys(std::min(KT, T)))), unused;
    float max[kLargeQueryBlock], sum[kLargeQueryBlock], factor[kLargeQueryBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, turn = task % blocks;
      const int64_t block = turn % 2 == 0 ? turn / 2 : blocks - 1 - turn / 2;
      const int64_t b = bh / H, h = bh % H, i0 = block * QB, kvh = h / p.group();
      const int64_t bkv = b * p.kv_heads + kvh;  // the key head's row of `norms`
      const Rows qr = q.rows(b, h, T, D, unused), kr = k.rows(b, kvh, T, D, unused), vr = v.rows(b, kvh, T, D, unused);
      const Rows o = out.rows(b, h, unused);
      const int64_t m = std::min(QB, T - i0);
      const KeyRange keys = block_keys(p, h, i0, m);
      const HeadBias hb = p.head(h);
      float q_reach = 0, own_keys = 0;  // scale * max |q_i| and max |k_i| over the block
      if (!norms.empty())
        for (int64_t r = 0; r < m; ++r) {
          const float* qi = qr.data + (i0 + r) * qr.stride;
          q_reach = std::max(q_reach, p.scale * std::sqrt(dot(qi, qi, D)));
          own_keys = std::max(own_keys, norms[size_t(bkv * T + i0 + r)]);
        }
      // A sink is a first column with the head's logit and no value: the running maximum starts
      // at it, the running sum at its e^0.
      std::fill(max, max + m, p.sink.empty() ? -kInf : p.sink[size_t(h)]);
      std::fill(sum, sum + m, p.sink.empty() ? 0.0f : 1.0f);
      float* acc = o.data + i0 * o.stride;  // the output rows, accumulated unnormalised
      bool first = true;
      for (int64_t k0 = keys.first; k0 < keys.last; k0 += KT) {
        const int64_t w = std::min(KT, keys.last - k0), ws = padded_keys(w);
        if (!norms.empty() && (k0 + w <= i0 || k0 >= i0 + m)) {
          const bool left = k0 + w <= i0;
          const float* tile_norms = norms.data() + bkv * T + k0;
          // A soft cap C bounds each score by C, so that no two differ by more than 2C.
          float reach = q_reach * (*std::max_element(tile_norms, tile_norms + w) + own_keys);
          if (p.softcap > 0) reach = std::min(reach, 2 * p.softcap);
          const NegligibleBound bound{reach, left ? hb.left : hb.right, left ? i0 - (k0 + w - 1) : k0 - (i0 + m - 1)};
          if (bound.negligible()) continue;
        }
        gemm(false, true, m, w, D, p.scale, qr.data + i0 * qr.stride, qr.stride, kr.data + k0 * kr.stride,
             kr.stride, 0.0f, scores.data(), ws);
        cap_block(p, scores.data(), m, w, ws);
        for (int64_t r = 0; r < m; ++r)
          factor[r] = online_softmax_row(scores.data() + r * ws, i0 + r - k0, w, row_bias(p, h, i0 + r, k0, w), max[r],
                                         sum[r]);
        if (!first)
          for (int64_t r = 0; r < m; ++r)
            if (factor[r] != 1.0f) scale_row(acc + r * o.stride, D, factor[r]);
        gemm(false, false, m, D, w, 1.0f, scores.data(), ws, vr.data + k0 * vr.stride, vr.stride,
             first ? 0.0f : 1.0f, acc, o.stride);
        first = false;
      }
      for (int64_t r = 0; r < m; ++r) scale_row(acc + r * o.stride, D, 1.0f / sum[r]);
    }
  });
}

// The gradients of the bias's options, per (batch, head): `sink` B x H floats, `scale` B x H x T,
// `offsets` B x H x offset_stride (each null when not wanted), summed over the batch by the caller.
struct OptionGradientBuffers {
  float* sink = nullptr;
  float* scale = nullptr;
  float* offsets = nullptr;
  int64_t offset_stride = 0;
  OptionGradients of(int64_t bh, int64_t T) const {
    return {sink ? sink + bh : nullptr, scale ? scale + bh * T : nullptr,
            offsets ? offsets + bh * offset_stride : nullptr};
  }
};

// One task a (batch, key head): its key and value rows are read once for the query heads of its
// group, whose dK and dV it adds up in place (no two tasks write one key head's gradients).
void backward_kernel(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const float* lse,
                     const Operand& dout, const Destination& dq, const Destination& dk, const Destination& dv,
                     OptionGradientBuffers option_grads) {
  const int64_t T = p.length, D = p.dim, H = p.heads, Hkv = p.kv_heads, G = p.group();
  at::parallel_for(0, p.batch * Hkv, 1, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(kQueryBlock, T);
    std::vector<float> probs(size_t(block * padded_keys(T))), dscores(size_t(block * padded_keys(T)));
    // The scores before the softmax, for the logit scale's gradient and the cap's.
    std::vector<float> raw(p.logit_scale || p.softcap > 0 ? probs.size() : 0);
    std::vector<float> qbuf, kbuf, vbuf, gbuf, dqbuf, dkbuf, dvbuf;
    for (int64_t bkv = begin; bkv < end; ++bkv) {
      const int64_t b = bkv / Hkv, kvh = bkv % Hkv;
      const Rows kr = k.rows(b, kvh, T, D, kbuf), vr = v.rows(b, kvh, T, D, vbuf);
      const Rows dkr = dk.rows(b, kvh, dkbuf), dvr = dv.rows(b, kvh, dvbuf);
      for (int64_t t = 0; t < T; ++t) {
        std::fill(dkr.data + t * dkr.stride, dkr.data + t * dkr.stride + D, 0.0f);
        std::fill(dvr.data + t * dvr.stride, dvr.data + t * dvr.stride + D, 0.0f);
      }
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        const int64_t bh = b * H + h;
        const Rows qr = q.rows(b, h, T, D, qbuf), go = dout.rows(b, h, T, D, gbuf);
        const Rows dqr = dq.rows(b, h, dqbuf);
        const float* lb = lse + bh * T;
        for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
          const int64_t m = std::min(kQueryBlock, T - i0);
          const KeyRange keys = block_keys(p, h, i0, m);
          const int64_t k0 = keys.first, n = keys.last - k0, ns = padded_keys(n);
          const float *qi = qr.data + i0 * qr.stride, *gi = go.data + i0 * go.stride;
          const float *kj = kr.data + k0 * kr.stride, *vj = vr.data + k0 * vr.stride;
          gemm(false, true, m, n, D, p.scale, qi, qr.stride, kj, kr.stride, 0.0f, probs.data(), ns);
          cap_block(p, probs.data(), m, n, ns);
          if (!raw.empty()) std::copy(probs.begin(), probs.begin() + m * ns, raw.begin());
          probabilities_block(probs.data(), i0, m, k0, n, p, h, lb);
          gemm(true, false, n, D, m, 1.0f, probs.data(), ns, gi, go.stride, 1.0f, dvr.data + k0 * dvr.stride,
               dvr.stride);                                                                         // dV += P^T dO
          gemm(false, true, m, n, D, 1.0f, gi, go.stride, vj, vr.stride, 0.0f, dscores.data(), ns);  // dP = dO V^T
          softmax_backward_block(dscores.data(), probs.data(), i0, m, k0, n, ns, p, h, lb, raw.data(),
                                 option_grads.of(bh, T));  // dS
          if (p.softcap > 0) cap_backward_rows(dscores.data(), raw.data(), m, n, ns, p.softcap);  // dS of the uncapped scores
          gemm(false, false, m, D, n, p.scale, dscores.data(), ns, kj, kr.stride, 0.0f, dqr.data + i0 * dqr.stride,
               dqr.stride);  // dQ
          gemm(true, false, n, D, m, p.scale, dscores.data(), ns, qi, qr.stride, 1.0f, dkr.data + k0 * dkr.stride,
               dkr.stride);  // dK +=
        }
        dq.store(b, h, dqbuf);
      }
      dk.store(b, kvh, dkbuf);
      dv.store(b, kvh, dvbuf);
    }
  });
}

// Queries a block in the bfloat16 kernels. A causal block sees the keys up to its last row, so
// the masked half of its diagonal square is multiplied for nothing: at T = 64 one 64-row block
// computes 4,096 scores a head for 2,080 seen, four 16-row blocks 2,560. The float32 path
// keeps 64 rows: each of its products is a BLAS call, so fewer, larger products suit it.
int64_t bf16_query_block(const Problem& p) { return p.causal ? 16 : kQueryBlock; }

// Under train.precision bf16 on a CPU with AVX512_BF16: the same algorithm with the products in
// bfloat16 (core/kernels/bf16_gemm.h), accumulated in float32. The scores, the bias, the softmax and
// its backward stay float32; P and dS are rounded to bfloat16 for the products that take them,
// as FlashAttention does in bfloat16. The backward accumulates dK^T and dV^T (D x T, float32)
// so that every product's B operand is packed from rows: dV^T += dO^T P, dK^T += Q^T dS.
void forward_kernel_bf16(const Problem& p, const Operand& q, const Operand& k, const Operand& v,
                         const Destination& out, float* lse) {
  using namespace bf16_gemm;
  const int64_t T = p.length, D = p.dim, H = p.heads, Hkv = p.kv_heads, G = p.group(), query_block = bf16_query_block(p);
  at::parallel_for(0, p.batch * Hkv, 1, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(query_block, T);
    std::vector<float> scores(size_t(block * padded_keys(T))), obuf(size_t(block * D));
    PackedA qa, pa;
    PackedB kt, vb;
    for (int64_t bkv = begin; bkv < end; ++bkv) {  // a key head, packed once for its group
      const int64_t b = bkv / Hkv, kvh = bkv % Hkv;
      const auto *kb = k.bf16_at(b, kvh), *vsrc = v.bf16_at(b, kvh);
      pack_b(kb, k.st, true, D, T, kt);     // B(d, t) = k[t][d]
      pack_b(vsrc, v.st, false, T, D, vb);  // B(t, d) = v[t][d]
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        const int64_t bh = b * H + h;
        const auto* qb = q.bf16_at(b, h);
        float* lb = lse + bh * T;
        for (int64_t i0 = 0; i0 < T; i0 += query_block) {
          // Keys from 0 (a product takes a prefix of a packed operand): a window's or chunk's
          // earlier keys are masked in the rows, not left out of the products.
          const int64_t m = std::min(query_block, T - i0), n = block_keys(p, h, i0, m).last, ns = padded_keys(n);
          pack_a(qb + i0 * q.st, q.st, false, m, D, qa);
          multiply(qa, kt, m, n, p.scale, scores.data(), ns, false);
          cap_block(p, scores.data(), m, n, ns);
          softmax_block(scores.data(), i0, m, 0, n, p, h, lb);
          pack_a(scores.data(), ns, false, m, n, pa);
          multiply(pa, vb, m, D, 1.0f, obuf.data(), D, false);
          out.store_rows(b, h, i0, m, obuf.data());
        }
      }
    }
  });
}

void backward_kernel_bf16(const Problem& p, const Operand& q, const Operand& k, const Operand& v, const float* lse,
                          const Operand& dout, const Destination& dq, const Destination& dk, const Destination& dv,
                          OptionGradientBuffers option_grads) {
  using namespace bf16_gemm;
  const int64_t T = p.length, D = p.dim, H = p.heads, Hkv = p.kv_heads, G = p.group(), query_block = bf16_query_block(p);
  at::parallel_for(0, p.batch * Hkv, 1, [&](int64_t begin, int64_t end) {
    const int64_t block = std::min(query_block, T);
    const size_t scores_size = size_t(block * padded_keys(T));
    std::vector<float> probs(scores_size), dscores(scores_size), dqbuf(size_t(block * D));
    std::vector<float> raw(p.logit_scale || p.softcap > 0 ? scores_size : 0);  // as backward_kernel's
    std::vector<float> dkt(size_t(D * T)), dvt(size_t(D * T));
    PackedA qa, ga, qt, gt, sa;
    PackedB kt, vt, kb, pb, sb;
    for (int64_t bkv = begin; bkv < end; ++bkv) {  // a key head: packed once, dK and dV summed over its group
      const int64_t b = bkv / Hkv, kvh = bkv % Hkv;
      const auto *ksrc = k.bf16_at(b, kvh), *vsrc = v.bf16_at(b, kvh);
      pack_b(ksrc, k.st, true, D, T, kt);   // B(d, t) = k[t][d], for S = q k^T
      pack_b(vsrc, v.st, true, D, T, vt);   // B(d, t) = v[t][d], for dP = dO v^T
      pack_b(ksrc, k.st, false, T, D, kb);  // B(t, d) = k[t][d], for dQ = dS k
      std::fill(dkt.begin(), dkt.end(), 0.0f);
      std::fill(dvt.begin(), dvt.end(), 0.0f);
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        const int64_t bh = b * H + h;
        const auto *qsrc = q.bf16_at(b, h), *gsrc = dout.bf16_at(b, h);
        const float* lb = lse + bh * T;
        for (int64_t i0 = 0; i0 < T; i0 += query_block) {
          const int64_t m = std::min(query_block, T - i0), n = block_keys(p, h, i0, m).last, ns = padded_keys(n);
          const auto *qi = qsrc + i0 * q.st, *gi = gsrc + i0 * dout.st;
          pack_a(qi, q.st, false, m, D, qa);
          multiply(qa, kt, m, n, p.scale, probs.data(), ns, false);
          cap_block(p, probs.data(), m, n, ns);
          if (!raw.empty()) std::copy(probs.begin(), probs.begin() + m * ns, raw.begin());
          probabilities_block(probs.data(), i0, m, 0, n, p, h, lb);
          pack_a(gi, dout.st, false, m, D, ga);
          multiply(ga, vt, m, n, 1.0f, dscores.data(), ns, false);  // dP = dO v^T
          softmax_backward_block(dscores.data(), probs.data(), i0, m, 0, n, ns, p, h, lb, raw.data(),
                                 option_grads.of(bh, T));  // dS
          if (p.softcap > 0) cap_backward_rows(dscores.data(), raw.data(), m, n, ns, p.softcap);  // as backward_kernel
          pack_a(gi, dout.st, true, D, m, gt);  // dO^T
          pack_b(probs.data(), ns, false, m, n, pb);
          multiply(gt, pb, D, n, 1.0f, dvt.data(), T, true);  // dV^T += dO^T P
          pack_a(qi, q.st, true, D, m, qt);  // q^T
          pack_b(dscores.data(), ns, false, m, n, sb);
          multiply(qt, sb, D, n, p.scale, dkt.data(), T, true);  // dK^T += q^T dS / sqrt(d)
          pack_a(dscores.data(), ns, false, m, n, sa);
          multiply(sa, kb, m, D, p.scale, dqbuf.data(), D, false);  // dQ = dS k / sqrt(d)
          dq.store_rows(b, h, i0, m, dqbuf.data());
        }
      }
      dk.store_transposed(b, kvh, dkt.data());
      dv.store_transposed(b, kvh, dvt.data());
    }
  });
}

// A sink's logits as the kernels read them (empty without one).
std::vector<float> sink_values(const torch::Tensor& sink) {
  if (!sink.defined()) return {};
  const auto values = sink.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  return {values.data_ptr<float>(), values.data_ptr<float>() + values.numel()};
}

// The offsets -(T - 1) .. reach - 1 of a bias by offset (reach 1 causal, T not), as the kernels
// read them (Problem::offsets).
void set_offsets(Problem& p, const torch::Tensor& by_offset) {
  const int64_t T = p.length, reach = p.causal ? 1 : T;
  const auto values = by_offset.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  TORCH_CHECK(values.dim() == 2 && values.size(0) == p.heads && values.size(1) == T - 1 + reach,
              "fused CPU attention: a bias by offset gave ", values.sizes(), " for ", p.heads, " heads and ",
              T - 1 + reach, " offsets");
  p.offset_stride = 2 * kOffsetPad + 2 * T - 1;
  p.offsets.assign(size_t(p.heads * p.offset_stride), 0.0f);
  for (int64_t h = 0; h < p.heads; ++h)
    std::copy(values.data_ptr<float>() + h * values.size(1), values.data_ptr<float>() + (h + 1) * values.size(1),
              p.offsets.begin() + h * p.offset_stride + kOffsetPad);
}

// `by_offset`: the bias's values by offset (AttentionBias::by_offset) where it is a dense one.
Problem make_problem(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias, bool causal,
                     const torch::Tensor& by_offset) {
  Problem p = Problem::of(q, k, causal);
  if (bias.kind == AttentionBias::Kind::Linear) {
    // Read through data pointers (an indexing select and an item() for each head, side and
    // tensor were 8 operator calls a head and layer; no measurable change in the step's time).
    const auto left = bias.slopes_left.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const auto right = bias.slopes_right.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const auto look_left = bias.look_left.to(torch::kCPU, torch::kBool).contiguous();
    const auto look_right = bias.look_right.to(torch::kCPU, torch::kBool).contiguous();
    const float *lp = left.data_ptr<float>(), *rp = right.data_ptr<float>();
    const bool *llp = look_left.data_ptr<bool>(), *lrp = look_right.data_ptr<bool>();
    for (int64_t h = 0; h < p.heads; ++h) p.bias.push_back({llp[h] ? -lp[h] : -kInf, lrp[h] ? -rp[h] : -kInf});
  }
  if (by_offset.defined()) set_offsets(p, by_offset);
  p.window = bias.window;
  p.chunk = bias.chunk;
  p.sink = sink_values(bias.sink);
  p.softcap = float(bias.softcap);
  return p;
}

// The logit scale as the kernels read it, (H, T) float32 contiguous; undefined without one.
torch::Tensor kernel_logit_scale(const torch::Tensor& logit_scale) {
  return logit_scale.defined() ? logit_scale.detach().to(torch::kCPU, torch::kFloat32).contiguous() : torch::Tensor();
}

class FusedCpuAttentionFunction : public torch::autograd::Function<FusedCpuAttentionFunction> {
 public:
  // sink (H,), logit_scale (H, T) and by_offset (H, offsets): the bias's, or empty tensors where
  // it has none (autograd takes no undefined inputs); `problem` reads them already (make_problem,
  // kernel_logit_scale).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& sink,
                               const torch::Tensor& logit_scale, const torch::Tensor& by_offset,
                               const Problem* problem) {
    const Problem& p = *problem;
    auto out = empty_heads_major(q);
    auto lse = torch::empty({p.batch, p.heads, p.length}, q.options().dtype(torch::kFloat32));
    const bool bf16_products = q.scalar_type() == torch::kBFloat16 && bf16_gemm::available();
    (bf16_products ? forward_kernel_bf16 : forward_kernel)(p, Operand(q), Operand(k), Operand(v), Destination(out),
                                                           lse.data_ptr<float>());
    ctx->save_for_backward({q, k, v, lse, sink, logit_scale, by_offset});
    ctx->saved_data["bf16_products"] = bf16_products;
    ctx->saved_data["causal"] = p.causal;
    ctx->saved_data["window"] = p.window;
    ctx->saved_data["chunk"] = p.chunk;
    ctx->saved_data["softcap"] = double(p.softcap);
    std::vector<double> left, right;
    for (const auto& hb : p.bias) {
      left.push_back(hb.left);
      right.push_back(hb.right);
    }
    ctx->saved_data["left"] = left;
    ctx->saved_data["right"] = right;
    return out;  // (B, H, T, D) view of (B, T, H, D)
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &lse = saved[3];
    const auto given = [](const torch::Tensor& x) { return x.numel() > 0 ? x : torch::Tensor(); };
    const auto sink = given(saved[4]), logit_scale = given(saved[5]), by_offset = given(saved[6]);
    Problem p = Problem::of(q, k, ctx->saved_data["causal"].toBool());
    if (by_offset.defined()) set_offsets(p, by_offset);
    const auto left = ctx->saved_data["left"].toDoubleVector(), right = ctx->saved_data["right"].toDoubleVector();
    for (size_t h = 0; h < left.size(); ++h) p.bias.push_back({float(left[h]), float(right[h])});
    p.window = ctx->saved_data["window"].toInt();
    p.chunk = ctx->saved_data["chunk"].toInt();
    p.softcap = float(ctx->saved_data["softcap"].toDouble());
    p.sink = sink_values(sink);
    const auto scale = kernel_logit_scale(logit_scale);
    if (scale.defined()) p.logit_scale = scale.data_ptr<float>();
    // The options' gradients per (batch, head), summed over the batch below.
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    const bool sink_grad = sink.defined() && sink.requires_grad(), scale_grad = scale.defined() && logit_scale.requires_grad();
    const bool offset_grad = by_offset.defined() && by_offset.requires_grad();
    const auto dsink = sink_grad ? torch::zeros({p.batch, p.heads}, f32) : torch::Tensor();
    const auto dscale = scale_grad ? torch::zeros({p.batch, p.heads, p.length}, f32) : torch::Tensor();
    const auto doffsets = offset_grad ? torch::zeros({p.batch, p.heads, p.offset_stride}, f32) : torch::Tensor();
    const OptionGradientBuffers option_grads{sink_grad ? dsink.data_ptr<float>() : nullptr,
                                             scale_grad ? dscale.data_ptr<float>() : nullptr,
                                             offset_grad ? doffsets.data_ptr<float>() : nullptr, p.offset_stride};
    auto dout = grads[0].to(q.scalar_type());
    if (dout.stride(3) != 1) dout = dout.contiguous();
    // dQ, dK and dV as (B, H, T, D) views: of one (B, T, 3, H, D) buffer when q, k and v are
    // such slices (split_heads() then hands the buffer on as the projection's gradient, with no
    // copy), else of (B, T, H, D) tensors.
    const auto [dq, dk, dv] = empty_head_gradients(q, k, v);
    const bool bf16_products = ctx->saved_data["bf16_products"].toBool();
    (bf16_products ? backward_kernel_bf16 : backward_kernel)(p, Operand(q), Operand(k), Operand(v),
                                                             lse.data_ptr<float>(), Operand(dout), Destination(dq),
                                                             Destination(dk), Destination(dv), option_grads);
    // The offsets' gradients sit where the kernels read the offsets: kOffsetPad in, as many as given.
    const auto offsets_grad = [&] {
      return doffsets.sum(0).narrow(1, kOffsetPad, by_offset.size(1)).to(by_offset.scalar_type());
    };
    return {dq,
            dk,
            dv,
            sink_grad ? dsink.sum(0).to(sink.scalar_type()) : torch::Tensor(),
            scale_grad ? dscale.sum(0).to(logit_scale.scalar_type()) : torch::Tensor(),
            offset_grad ? offsets_grad() : torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

void softcap_scores(float* rows, int64_t m, int64_t n, int64_t stride, float cap) {
  cap_rows(rows, m, n, stride, cap);
}

double negligible_distance(double reach, double slope) {
  return slope > 0 ? (reach + kNegligible) / slope : std::numeric_limits<double>::infinity();
}

std::string fused_cpu_attention_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, const AttentionBias& bias,
                                                   const AttentionOptions& options) {
  if (!sgemm_function()) return "LibTorch exports no BLAS sgemm_";
  for (const auto* x : {&q, &k, &v}) {
    if (!x->device().is_cpu()) return "not a CPU tensor";
    if (x->scalar_type() != q.scalar_type()) return "q, k and v of different dtypes";
    if (x->scalar_type() != torch::kFloat32 && x->scalar_type() != torch::kBFloat16)
      return "not float32 or bfloat16";
    // k and v: q's shape, or fewer heads that divide q's (grouped-query attention)
    if (x->dim() != 4 || x->size(0) != q.size(0) || x->size(2) != q.size(2) || x->size(3) != q.size(3))
      return "q, k and v of different shapes";
    if (x != &q && (x->size(1) != k.size(1) || k.size(1) < 1 || q.size(1) % k.size(1) != 0))
      return "q, k and v of different shapes";
    if (x->stride(3) != 1) return "head dimension not contiguous";
  }
  if (q.size(2) * std::max<int64_t>({q.stride(2), (q.size(1) + 2 * k.size(1)) * q.size(3), 1}) >
      std::numeric_limits<int>::max() / 2)
    return "too long for 32-bit BLAS strides";
  if (options.training && options.dropout > 0) return "attention dropout";
  if (bias.kind == AttentionBias::Kind::Dense) {
    if (!bias.by_offset) return "bias kind " + bias.describe() + " (a dense bias that is not one of j - i alone)";
  } else if (bias.kind != AttentionBias::Kind::None && bias.kind != AttentionBias::Kind::Linear) {
    return "bias kind " + bias.describe();
  }
  if (bias.far_queries.defined()) return "Self-Extend's far queries and keys";
  if (bias.softcap > 0 && !normal_float32(bias.softcap))
    return "a softcap of " + c10::str(bias.softcap) + ", outside float32's normal range";
  if (bias.sink.defined() && (bias.sink.dim() != 1 || bias.sink.size(0) != q.size(1)))
    return "a sink of shape " + c10::str(bias.sink.sizes()) + " for " + std::to_string(q.size(1)) + " heads";
  if (bias.logit_scale.defined() &&
      (bias.logit_scale.dim() != 2 || bias.logit_scale.size(0) != q.size(1) || bias.logit_scale.size(1) != q.size(2)))
    return "a logit scale of shape " + c10::str(bias.logit_scale.sizes()) + " for " + std::to_string(q.size(1)) +
           " heads and " + std::to_string(q.size(2)) + " queries";
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
  const int64_t T = q.size(2);
  const auto by_offset = bias.kind == AttentionBias::Kind::Dense ? bias.by_offset(-(T - 1), options.causal ? 1 : T)
                                                                 : torch::Tensor();
  Problem problem = make_problem(q, k, bias, options.causal, by_offset);
  const auto scale = kernel_logit_scale(bias.logit_scale);  // kept alive for the kernels
  if (scale.defined()) problem.logit_scale = scale.data_ptr<float>();
  const auto needs = [](const torch::Tensor& x) { return x.defined() && x.requires_grad(); };
  const bool wants_gradient = torch::GradMode::is_enabled() && (needs(q) || needs(k) || needs(v) || needs(bias.sink) ||
                                                                needs(bias.logit_scale) || needs(by_offset));
  if (!wants_gradient && q.scalar_type() == torch::kFloat32) {
    auto out = empty_heads_major(q);
    forward_inference_kernel(problem, Operand(q), Operand(k), Operand(v), Destination(out));
    return out;
  }
  const auto or_empty = [](const torch::Tensor& x) { return x.defined() ? x : torch::empty({0}); };
  return FusedCpuAttentionFunction::apply(q, k, v, or_empty(bias.sink), or_empty(bias.logit_scale), or_empty(by_offset),
                                          &problem);
}

}  // namespace extrap
