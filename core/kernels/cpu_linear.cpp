#include "core/kernels/cpu_linear.h"

#include "core/base/environment.h"
#include "core/kernels/cpu_vector_math.h"
#include "core/kernels/precision.h"
#include "core/runtime/cpu_isa.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cctype>
#include <cstdlib>

namespace extrap {

namespace {

// oneDNN's linear as LibTorch registers it (aten/src/ATen/native/mkldnn/Linear.cpp): dense
// float32 or bfloat16 tensors in and out, any strides; the plain overload (no post-op) or
// "binary" (an element-wise operation with a second tensor in the epilogue). Null where absent.
const c10::OperatorHandle* find_onednn_operator(const char* overload) {
  if (!at::hasMKLDNN()) return nullptr;
  const auto handle = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", overload});
  return handle ? new c10::OperatorHandle(*handle) : nullptr;
}

const c10::OperatorHandle* onednn_operator(bool binary = false) {
  static const c10::OperatorHandle* plain = find_onednn_operator("");
  static const c10::OperatorHandle* with_operand = find_onednn_operator("binary");
  return binary ? with_operand : plain;
}

// bfloat16 (N, M) -> its column sums (M) in float32: partial sums of fixed 64-row blocks, then
// the blocks in order (the same numbers for any thread count). LibTorch's sum would first cast
// g to float32 (a copy of g), or sum in bfloat16 and round the result.
constexpr int64_t kSumRows = 64;

EXTRAP_ISA_KERNEL(void, add_bf16_row, (const c10::BFloat16* row, float* sums, int64_t m), (row, sums, m)) {
#pragma omp simd
  for (int64_t j = 0; j < m; ++j) sums[j] += float(row[j]);
}

torch::Tensor bf16_column_sums(const torch::Tensor& g) {
  const int64_t N = g.size(0), M = g.size(1), blocks = (N + kSumRows - 1) / kSumRows;
  std::vector<float> partial(size_t(blocks * M), 0.0f);
  const auto* gp = g.data_ptr<at::BFloat16>();
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk)
      for (int64_t i = blk * kSumRows; i < std::min(N, (blk + 1) * kSumRows); ++i)
        add_bf16_row(gp + i * M, partial.data() + blk * M, M);
  });
  auto sums = torch::zeros({M}, g.options().dtype(torch::kFloat32));
  float* out = sums.data_ptr<float>();
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t j = 0; j < M; ++j) out[j] += partial[size_t(blk * M + j)];
  return sums;
}

// x W^T (+ b) with its gradients; kBias says whether b is an input (autograd takes no
// undefined tensors as inputs). The product runs in x's dtype: a float32 weight and bias are
// cast to bfloat16 inside for a bfloat16 x (as autocast would cast them), and their gradients
// come back in their own dtypes, the bias's summed in float32.
template <bool kBias>
class OnednnLinearFunction : public torch::autograd::Function<OnednnLinearFunction<kBias>> {
 public:
  template <typename... Bias>
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const Bias&... bias) {
    static_assert(sizeof...(Bias) == (kBias ? 1 : 0));
    const auto dtype = x.scalar_type();
    const auto w = weight.to(dtype);
    ctx->save_for_backward({x, w});
    ctx->saved_data["weight_dtype"] = int64_t(weight.scalar_type());
    if constexpr (kBias) ctx->saved_data["bias_dtype"] = int64_t(std::get<0>(std::forward_as_tuple(bias...)).scalar_type());
    return onednn_product(x, w, {bias.to(dtype)...});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // oneDNN's operator has no derivative of its own: a double backward would silently get
    // zero terms from autograd's fallback.
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "the oneDNN linear (core/kernels/cpu_linear.h) has no double backward (create_graph); "
                "run with EXTRAP_ONEDNN_LINEAR=0");
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1];
    const auto g = grads[0].contiguous();  // (N, M)
    torch::autograd::variable_list out(kBias ? 3 : 2);
    if (ctx->needs_input_grad(0)) out[0] = onednn_product(g, weight.t(), {});  // g W
    if (ctx->needs_input_grad(1))
      out[1] = onednn_weight_gradient(g, x).to(torch::ScalarType(ctx->saved_data["weight_dtype"].toInt()));
    if (kBias && ctx->needs_input_grad(2))
      out[2] = linear_bias_gradient(g).to(torch::ScalarType(ctx->saved_data["bias_dtype"].toInt()));
    return out;
  }
};

}  // namespace

torch::Tensor onednn_product(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                             const torch::Tensor& multiplier) {
  torch::jit::Stack stack;
  stack.emplace_back(x);
  if (multiplier.defined()) stack.emplace_back(multiplier);
  stack.emplace_back(w);
  stack.emplace_back(b.defined() ? c10::IValue(b) : c10::IValue());
  if (multiplier.defined()) {
    stack.emplace_back(std::string("mul"));
    onednn_operator(/*binary=*/true)->callBoxed(&stack);
  } else {
    stack.emplace_back(std::string("none"));
    stack.emplace_back(c10::List<std::optional<at::Scalar>>());
    stack.emplace_back(std::string(""));
    onednn_operator()->callBoxed(&stack);
  }
  return stack.back().toTensor();
}

torch::Tensor onednn_weight_gradient(const torch::Tensor& g, const torch::Tensor& x) {
  const int64_t M = g.size(1), K = x.size(1);
  // In bfloat16, LibTorch's mm (oneDNN's matmul, which takes the transposed operands as they
  // are) with the larger size as the output's rows: the linear operator would first copy g^T
  // (N-deep) into a contiguous tensor, a copy as large as the gradient.
  if (g.scalar_type() == torch::kBFloat16) return M < K ? x.t().mm(g).t().contiguous() : g.t().mm(x);
  // g^T x (M, K), deep in N. On an Intel CPU MKL's AVX-512 mm takes g^T as it lies and runs it
  // faster than oneDNN, which also needs a copy of the transposed operand (benchmarks/RESULTS.md,
  // "Llama-style blocks"). On AMD CPUs (MKL's AVX2 path) oneDNN runs it well with the smaller size
  // as the output's rows, and no better than MKL for a square output.
  if (intel_cpu_on_avx512()) return g.t().mm(x);
  return M == K  ? g.t().mm(x)
         : M < K ? onednn_product(g.t(), x.t(), {})
                 : onednn_product(x.t(), g.t(), {}).t().contiguous();
}

torch::Tensor linear_bias_gradient(const torch::Tensor& g) {
  return g.scalar_type() == torch::kBFloat16 && g.is_contiguous() && g.device().is_cpu() ? bf16_column_sums(g)
                                                                                          : g.sum(0);
}

bool onednn_products_available() { return onednn_operator() != nullptr && onednn_operator(/*binary=*/true) != nullptr; }

bool onednn_linear_switched_on() {
  static const bool on =
      environment_switch("EXTRAP_ONEDNN_LINEAR",
                         "linear layers as LibTorch runs them: MKL in float32, autocast in bfloat16",
                         "through oneDNN where extrap's kernels run AVX-512, the default");
  return on;
}

bool onednn_keeps_float32() {
  // ONEDNN_DEFAULT_FPMATH_MODE=BF16 (TF32, ANY), which some CPU tuning guides suggest, would
  // let oneDNN round float32 products' inputs; MKL ignores it.
  static const bool strict = [] {
    const char* mode = std::getenv("ONEDNN_DEFAULT_FPMATH_MODE");
    if (!mode || !*mode) return true;
    std::string upper(mode);
    for (auto& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    return upper == "STRICT";
  }();
  return strict;
}

bool onednn_bf16_linear_takes(const torch::Tensor& x, const torch::Tensor& weight) {
  static const bool fast_bf16 = cpu_has_fast_bf16();
  return onednn_linear_switched_on() && fast_bf16 && x.device().is_cpu() && weight.device().is_cpu() &&
         (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
         (weight.scalar_type() == torch::kFloat32 || weight.scalar_type() == torch::kBFloat16) &&
         cpu_autocast_bf16() && onednn_operator() != nullptr && x.numel() > 0;
}

bool onednn_linear_takes(const torch::Tensor& x, const torch::Tensor& weight) {
  // On AVX2 paths (an AVX2-only CPU, or capped: core/runtime/cpu_isa.h) MKL's float32 products
  // run the model faster than oneDNN's (benchmarks/RESULTS.md, "Per capability").
  return onednn_linear_switched_on() && cpu_isa() == CpuIsa::avx512 && onednn_keeps_float32() && x.device().is_cpu() &&
         x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
         weight.device().is_cpu() && !at::autocast::is_autocast_enabled(at::kCPU) &&
         onednn_operator() != nullptr && x.numel() > 0;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  torch::Tensor rows;
  if (onednn_bf16_linear_takes(x, weight)) {
    // The cast of x autocast would make; the weight and bias are cast inside the product.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    rows = x.reshape({-1, x.size(-1)}).to(torch::kBFloat16).contiguous();
  } else if (onednn_linear_takes(x, weight)) {
    rows = x.reshape({-1, x.size(-1)}).contiguous();  // the weight of g^T x: plain strides
  } else {
    return torch::linear(x, weight, bias);
  }
  auto sizes = x.sizes().vec();
  const auto y = bias.defined() ? OnednnLinearFunction<true>::apply(rows, weight, bias)
                                : OnednnLinearFunction<false>::apply(rows, weight);
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

}  // namespace extrap
