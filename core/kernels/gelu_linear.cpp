#include "core/kernels/gelu_linear.h"

#include "core/base/environment.h"
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/cpu_linear.h"
#include "core/kernels/cpu_vector_math.h"
#include "core/kernels/precision.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>

namespace extrap {

namespace {

EXTRAP_ISA_KERNEL(void, gelu_with_slope_float, (const float* x, float* value, float* slope, int64_t n), (x, value, slope, n)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) gelu_and_slope(x[j], value[j], slope[j]);
}

EXTRAP_ISA_KERNEL(void, gelu_with_slope_bf16, (const uint16_t* x, uint16_t* value, uint16_t* slope, int64_t n), (x, value, slope, n)) {
  constexpr int64_t kChunk = 256;  // widened, evaluated and narrowed in separate loops: each vectorises
  float xs[kChunk], vs[kChunk], ss[kChunk];
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t m = std::min(kChunk, n - begin);
    for (int64_t j = 0; j < m; ++j) xs[j] = from_bf16_bits(x[begin + j]);
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) gelu_and_slope(xs[j], vs[j], ss[j]);
    for (int64_t j = 0; j < m; ++j) value[begin + j] = to_bf16_bits(vs[j]);
    for (int64_t j = 0; j < m; ++j) slope[begin + j] = to_bf16_bits(ss[j]);
  }
}

// gelu(a) and gelu'(a), a contiguous float32 or bfloat16.
std::pair<torch::Tensor, torch::Tensor> gelu_value_and_slope(const torch::Tensor& a) {
  auto value = torch::empty_like(a), slope = torch::empty_like(a);
  const bool bf16 = a.scalar_type() == torch::kBFloat16;
  const void* x = a.data_ptr();
  void *v = value.data_ptr(), *s = slope.data_ptr();
  at::parallel_for(0, a.numel(), 16384, [&](int64_t begin, int64_t end) {
    if (bf16)
      gelu_with_slope_bf16(static_cast<const uint16_t*>(x) + begin, static_cast<uint16_t*>(v) + begin,
                           static_cast<uint16_t*>(s) + begin, end - begin);
    else
      gelu_with_slope_float(static_cast<const float*>(x) + begin, static_cast<float*>(v) + begin,
                            static_cast<float*>(s) + begin, end - begin);
  });
  return {value, slope};
}

// The products run in the dtype of a (float32, or bfloat16 under autocast), with autocast kept
// out: the operands are cast here, as autocast's linear casts them.
template <bool kBias>
class GeluLinearFunction : public torch::autograd::Function<GeluLinearFunction<kBias>> {
 public:
  template <typename... Bias>
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& weight, const Bias&... bias) {
    static_assert(sizeof...(Bias) == (kBias ? 1 : 0));
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto dtype = a.scalar_type();
    auto [value, slope] = gelu_value_and_slope(a);
    const auto w = weight.to(dtype);
    ctx->save_for_backward({value, slope, w});
    return onednn_product(value, w, {bias.to(dtype)...});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "the fused GELU and linear layer (core/kernels/gelu_linear.h) has no double backward (create_graph); "
                "run with EXTRAP_FUSED_GELU=0");
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto saved = ctx->get_saved_variables();
    const auto &value = saved[0], &slope = saved[1], &w = saved[2];
    const auto g = grads[0].to(value.scalar_type()).contiguous();  // (N, M)
    torch::autograd::variable_list out(kBias ? 3 : 2);
    if (ctx->needs_input_grad(0)) out[0] = onednn_product(g, w.t(), {}, slope);  // (g W) o gelu'(a)
    if (ctx->needs_input_grad(1)) out[1] = onednn_weight_gradient(g, value).to(torch::kFloat32);
    if (kBias && ctx->needs_input_grad(2)) out[2] = linear_bias_gradient(g).to(torch::kFloat32);
    return out;
  }
};

}  // namespace

void gelu_with_slope(const float* x, float* value, float* slope, int64_t n) {
  gelu_with_slope_float(x, value, slope, n);
}

bool fused_gelu_switched_on() {
  static const bool on = environment_switch("EXTRAP_FUSED_GELU", "GELU and its backward as LibTorch runs them",
                                            "GELU's backward folded into the next product, the default");
  return on;
}

bool gelu_linear_fused_takes(const torch::Tensor& a, const torch::Tensor& weight) {
  if (!fused_gelu_switched_on() || !torch::GradMode::is_enabled() || !onednn_products_available()) return false;
  if (!a.device().is_cpu() || !weight.device().is_cpu() || weight.scalar_type() != torch::kFloat32 ||
      a.numel() == 0 || !(a.requires_grad() || weight.requires_grad()))
    return false;
  if (a.scalar_type() == torch::kBFloat16)
    return cpu_autocast_bf16() && bf16_gemm::supported();
  return onednn_linear_takes(a, weight);
}

torch::Tensor gelu_linear(const torch::Tensor& a, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!gelu_linear_fused_takes(a, weight)) return linear(torch::gelu(a), weight, bias);
  auto sizes = a.sizes().vec();
  const auto rows = a.reshape({-1, a.size(-1)}).contiguous();
  const auto y = bias.defined() ? GeluLinearFunction<true>::apply(rows, weight, bias)
                                : GeluLinearFunction<false>::apply(rows, weight);
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

}  // namespace extrap
