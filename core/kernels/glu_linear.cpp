#include "core/kernels/glu_linear.h"

#include "core/base/environment.h"
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/cpu_linear.h"
#include "core/kernels/cpu_vector_math.h"
#include "core/kernels/precision.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>

namespace extrap {

namespace {

template <GluGate kGate>
[[gnu::always_inline]] inline void gate_and_slope(float x, float& value, float& slope) {
  if constexpr (kGate == GluGate::silu)
    silu_and_slope(x, value, slope);
  else if constexpr (kGate == GluGate::gelu)
    gelu_and_slope(x, value, slope);
  else
    gelu_tanh_and_slope(x, value, slope);
}

// s[j] = act(g[j]) u[j] over one row of F values.
template <GluGate kGate>
[[gnu::always_inline]] inline void forward_values(const float* g, const float* u, float* s, int64_t F) {
#pragma omp simd
  for (int64_t j = 0; j < F; ++j) {
    float value, slope;
    gate_and_slope<kGate>(g[j], value, slope);
    s[j] = value * u[j];
  }
}

// dg[j] = ds[j] u[j] act'(g[j]), du[j] = ds[j] act(g[j]) over one row of F values.
template <GluGate kGate>
[[gnu::always_inline]] inline void backward_values(const float* g, const float* u, const float* ds, float* dg,
                                                   float* du, int64_t F) {
#pragma omp simd
  for (int64_t j = 0; j < F; ++j) {
    float value, slope;
    gate_and_slope<kGate>(g[j], value, slope);
    dg[j] = ds[j] * u[j] * slope;
    du[j] = ds[j] * value;
  }
}

EXTRAP_ISA_KERNEL(void, glu_forward_rows, (const float* a, float* s, int64_t rows, int64_t F, GluGate gate), (a, s, rows, F, gate)) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = a + r * 2 * F;
    if (gate == GluGate::gelu)
      forward_values<GluGate::gelu>(g, g + F, s + r * F, F);
    else if (gate == GluGate::gelu_tanh)
      forward_values<GluGate::gelu_tanh>(g, g + F, s + r * F, F);
    else
      forward_values<GluGate::silu>(g, g + F, s + r * F, F);
  }
}

EXTRAP_ISA_KERNEL(void, glu_backward_rows, (const float* a, const float* ds, float* da, int64_t rows, int64_t F, GluGate gate), (a, ds, da, rows, F, gate)) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = a + r * 2 * F;
    float* dg = da + r * 2 * F;
    if (gate == GluGate::gelu)
      backward_values<GluGate::gelu>(g, g + F, ds + r * F, dg, dg + F, F);
    else if (gate == GluGate::gelu_tanh)
      backward_values<GluGate::gelu_tanh>(g, g + F, ds + r * F, dg, dg + F, F);
    else
      backward_values<GluGate::silu>(g, g + F, ds + r * F, dg, dg + F, F);
  }
}

// A row block of a bfloat16 a, widened, evaluated in float32 and narrowed: one row at a time (F
// values each), so that the float32 buffers stay in cache.
void forward_bf16(const c10::BFloat16* a, c10::BFloat16* s, int64_t begin, int64_t end, int64_t F, GluGate gate) {
  std::vector<float> row(static_cast<size_t>(2 * F)), out(static_cast<size_t>(F));
  for (int64_t r = begin; r < end; ++r) {
    widen(a + r * 2 * F, row.data(), 2 * F);
    glu_forward_rows(row.data(), out.data(), 1, F, gate);
    narrow(out.data(), s + r * F, F);
  }
}

void backward_bf16(const c10::BFloat16* a, const c10::BFloat16* ds, c10::BFloat16* da, int64_t begin, int64_t end,
                   int64_t F, GluGate gate) {
  std::vector<float> row(static_cast<size_t>(2 * F)), grad(static_cast<size_t>(F)), out(static_cast<size_t>(2 * F));
  for (int64_t r = begin; r < end; ++r) {
    widen(a + r * 2 * F, row.data(), 2 * F);
    widen(ds + r * F, grad.data(), F);
    glu_backward_rows(row.data(), grad.data(), out.data(), 1, F, gate);
    narrow(out.data(), da + r * 2 * F, 2 * F);
  }
}

// Rows a parallel task takes: about 64k values.
int64_t row_grain(int64_t F) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(2 * F, 1)); }

// s = act(g) o u for a (N, 2F) contiguous, float32 or bfloat16 -> (N, F) of a's dtype.
torch::Tensor gated_values(const torch::Tensor& a, GluGate gate) {
  const int64_t N = a.size(0), F = a.size(1) / 2;
  auto s = torch::empty({N, F}, a.options());
  const bool bf16 = a.scalar_type() == torch::kBFloat16;
  at::parallel_for(0, N, row_grain(F), [&](int64_t begin, int64_t end) {
    if (bf16)
      forward_bf16(a.data_ptr<c10::BFloat16>(), s.data_ptr<c10::BFloat16>(), begin, end, F, gate);
    else
      glu_forward_rows(a.data_ptr<float>() + begin * 2 * F, s.data_ptr<float>() + begin * F, end - begin, F, gate);
  });
  return s;
}

// dA (N, 2F) from a and dS (N, F), a's dtype.
torch::Tensor gated_gradient(const torch::Tensor& a, const torch::Tensor& ds, GluGate gate) {
  const int64_t N = a.size(0), F = a.size(1) / 2;
  auto da = torch::empty_like(a);
  const bool bf16 = a.scalar_type() == torch::kBFloat16;
  at::parallel_for(0, N, row_grain(F), [&](int64_t begin, int64_t end) {
    if (bf16)
      backward_bf16(a.data_ptr<c10::BFloat16>(), ds.data_ptr<c10::BFloat16>(), da.data_ptr<c10::BFloat16>(), begin,
                    end, F, gate);
    else
      glu_backward_rows(a.data_ptr<float>() + begin * 2 * F, ds.data_ptr<float>() + begin * F,
                        da.data_ptr<float>() + begin * 2 * F, end - begin, F, gate);
  });
  return da;
}

// The products run in the dtype of a (float32, or bfloat16 under autocast), with autocast kept
// out: the operands are cast here, as autocast's linear casts them.
template <bool kBias>
class GluLinearFunction : public torch::autograd::Function<GluLinearFunction<kBias>> {
 public:
  template <typename... Bias>
  // (`gate` first, as its int: ctx->needs_input_grad counts the tensor inputs alone, a, weight and bias.)
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, int64_t gate, const torch::Tensor& a,
                               const torch::Tensor& weight, const Bias&... bias) {
    static_assert(sizeof...(Bias) == (kBias ? 1 : 0));
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto dtype = a.scalar_type();
    const auto s = gated_values(a, GluGate(gate));
    const auto w = weight.to(dtype);
    // float32 products through oneDNN where extrap's linear layers take it, else LibTorch's (MKL).
    const bool onednn = dtype == torch::kBFloat16 || onednn_linear_takes(s, w);
    ctx->save_for_backward({a, s, w});
    ctx->saved_data["gate"] = gate;
    ctx->saved_data["onednn"] = onednn;
    if (!onednn) return torch::linear(s, w, bias...);
    return onednn_product(s, w, {bias.to(dtype)...});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "the fused gated feed-forward (core/kernels/glu_linear.h) has no double backward (create_graph); "
                "run with EXTRAP_FUSED_GLU=0");
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &s = saved[1], &w = saved[2];
    const auto g = grads[0].to(a.scalar_type()).contiguous();  // (N, M)
    torch::autograd::variable_list out(kBias ? 4 : 3);  // gate's (none), a's, weight's, bias's
    const bool onednn = ctx->saved_data["onednn"].toBool();
    if (ctx->needs_input_grad(0)) {
      const auto ds = onednn ? onednn_product(g, w.t(), {}).contiguous() : g.mm(w);
      out[1] = gated_gradient(a, ds, GluGate(ctx->saved_data["gate"].toInt()));
    }
    if (ctx->needs_input_grad(1)) out[2] = (onednn ? onednn_weight_gradient(g, s) : g.t().mm(s)).to(torch::kFloat32);
    if (kBias && ctx->needs_input_grad(2)) out[3] = linear_bias_gradient(g).to(torch::kFloat32);
    return out;
  }
};

}  // namespace

torch::Tensor glu_reference(const torch::Tensor& a, GluGate gate) {
  const int64_t F = a.size(-1) / 2;
  const auto g = a.narrow(-1, 0, F), u = a.narrow(-1, F, F);
  const auto act = gate == GluGate::silu ? torch::silu(g) : torch::gelu(g, gate == GluGate::gelu_tanh ? "tanh" : "none");
  return act * u;
}

bool fused_glu_switched_on() {
  static const bool on = environment_switch("EXTRAP_FUSED_GLU", "the gated feed-forward as LibTorch runs it",
                                            "the gate and its product in one pass each way, the default");
  return on;
}

bool glu_linear_fused_takes(const torch::Tensor& a, const torch::Tensor& weight) {
  if (!fused_glu_switched_on() || !torch::GradMode::is_enabled()) return false;
  if (!a.device().is_cpu() || !weight.device().is_cpu() || weight.scalar_type() != torch::kFloat32 ||
      a.numel() == 0 || a.size(-1) != 2 * weight.size(1) || !(a.requires_grad() || weight.requires_grad()))
    return false;
  if (a.scalar_type() == torch::kBFloat16)
    return onednn_products_available() && cpu_autocast_bf16() && bf16_gemm::supported();
  return a.scalar_type() == torch::kFloat32 && !at::autocast::is_autocast_enabled(at::kCPU);
}

torch::Tensor glu_linear(const torch::Tensor& a, GluGate gate, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(a.size(-1) == 2 * weight.size(1), "glu_linear: a (..., 2F) = ", a.sizes(), " for a weight (M, F) = ",
              weight.sizes());
  if (!glu_linear_fused_takes(a, weight)) return linear(glu_reference(a, gate), weight, bias);
  auto sizes = a.sizes().vec();
  const auto rows = a.reshape({-1, a.size(-1)}).contiguous();
  const auto y = bias.defined() ? GluLinearFunction<true>::apply(int64_t(gate), rows, weight, bias)
                                : GluLinearFunction<false>::apply(int64_t(gate), rows, weight);
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

}  // namespace extrap
