#include "core/cpu_linear.h"

#include "core/environment.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>

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

// x W^T (+ b) with its gradients; kBias says whether b is an input (autograd takes no
// undefined tensors as inputs).
template <bool kBias>
class OnednnLinearFunction : public torch::autograd::Function<OnednnLinearFunction<kBias>> {
 public:
  template <typename... Bias>
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const Bias&... bias) {
    static_assert(sizeof...(Bias) == (kBias ? 1 : 0));
    ctx->save_for_backward({x, weight});
    return onednn_product(x, weight, {bias...});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // oneDNN's operator has no derivative of its own: a double backward would silently get
    // zero terms from autograd's fallback.
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "the oneDNN float32 linear (core/cpu_linear.h) has no double backward (create_graph); "
                "run with EXTRAP_ONEDNN_LINEAR=0");
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1];
    const auto g = grads[0].contiguous();  // (N, M)
    torch::autograd::variable_list out(kBias ? 3 : 2);
    if (ctx->needs_input_grad(0)) out[0] = onednn_product(g, weight.t(), {});  // g W
    if (ctx->needs_input_grad(1)) {
      out[1] = onednn_weight_gradient(g, x);
    }
    if (kBias && ctx->needs_input_grad(2)) out[2] = g.sum(0);
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
  // g^T x (M, K), deep in N: oneDNN runs it well with the smaller size as the output's rows,
  // and no better than MKL for a square output (1.3-1.8x against 0.9-1.0x, in float32).
  const int64_t M = g.size(1), K = x.size(1);
  return M == K  ? g.t().mm(x)
         : M < K ? onednn_product(g.t(), x.t(), {})
                 : onednn_product(x.t(), g.t(), {}).t().contiguous();
}

bool onednn_products_available() { return onednn_operator() != nullptr && onednn_operator(/*binary=*/true) != nullptr; }

bool onednn_linear_switched_on() {
  static const bool on =
      environment_switch("EXTRAP_ONEDNN_LINEAR", "float32 linear layers through MKL, as LibTorch runs them",
                         "through oneDNN, the default");
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

bool onednn_linear_takes(const torch::Tensor& x, const torch::Tensor& weight) {
  return onednn_linear_switched_on() && onednn_keeps_float32() && x.device().is_cpu() &&
         x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
         weight.device().is_cpu() && !at::autocast::is_autocast_enabled(at::kCPU) &&
         onednn_operator() != nullptr && x.numel() > 0;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!onednn_linear_takes(x, weight)) return torch::linear(x, weight, bias);
  auto sizes = x.sizes().vec();
  const auto rows = x.reshape({-1, x.size(-1)}).contiguous();  // the weight of g^T x: plain strides
  const auto y = bias.defined() ? OnednnLinearFunction<true>::apply(rows, weight, bias)
                                : OnednnLinearFunction<false>::apply(rows, weight);
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

}  // namespace extrap
