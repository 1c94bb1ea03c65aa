#include "core/kernels/residual_norm.h"

#include "core/base/environment.h"
#include "core/kernels/cpu_vector_math.h"
#include "core/kernels/precision.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace extrap {

namespace {

constexpr int64_t kRowsPerBlock = 64;  // the unit of work, and of the weight-gradient sums

// y's element j as float32: a float32 row, a bfloat16 one (bits), or none (0).
struct RowOf {
  const float* f = nullptr;
  const uint16_t* b = nullptr;
};

EXTRAP_ISA_KERNEL(void, add_rows, (const float* x, RowOf y, float* h, int64_t n), (x, y, h, n)) {
  if (y.f) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) h[j] = x[j] + y.f[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) h[j] = x[j] + from_bf16_bits(y.b[j]);
  }
}

// Row h (D values) -> its mean and 1 / sqrt(variance + eps), and u = (h - mean) rstd gamma + beta.
EXTRAP_ISA_KERNEL(void, normalise_row, (const float* h, const float* gamma, const float* beta, float eps, int64_t D, float* u, float& mean_out, float& rstd_out), (h, gamma, beta, eps, D, u, mean_out, rstd_out)) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < D; ++j) sum += h[j];
  const float mean = sum / float(D);
  float squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < D; ++j) squares += (h[j] - mean) * (h[j] - mean);
  const float rstd = 1.0f / std::sqrt(squares / float(D) + eps);
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) u[j] = (h[j] - mean) * rstd * gamma[j] + beta[j];
  mean_out = mean;
  rstd_out = rstd;
}

// One row of LayerNorm's backward with the residual's gradient added: from du (float32), h,
// mean and rstd, dx = dh + rstd (g - mean(g) - xhat mean(g xhat)), g = du gamma, xhat = (h -
// mean) rstd; dgamma += du xhat, dbeta += du. `xhat` is D floats of scratch.
EXTRAP_ISA_KERNEL(void, backward_row, (const float* du, const float* h, float mean, float rstd, const float* dh, const float* gamma, int64_t D, float* dx, float* dgamma, float* dbeta, float* xhat), (du, h, mean, rstd, dh, gamma, D, dx, dgamma, dbeta, xhat)) {
  float sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < D; ++j) {
    xhat[j] = (h[j] - mean) * rstd;
    const float g = du[j] * gamma[j];
    sum_g += g;
    sum_gx += g * xhat[j];
    dgamma[j] += du[j] * xhat[j];
    dbeta[j] += du[j];
  }
  const float a = sum_g / float(D), b = sum_gx / float(D);
  if (dh) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) dx[j] = dh[j] + rstd * (du[j] * gamma[j] - a - xhat[j] * b);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) dx[j] = rstd * (du[j] * gamma[j] - a - xhat[j] * b);
  }
}

// What u is written as: float32, bfloat16, or float32 with a bfloat16 copy beside it (an extra
// output, for a float32 u whose one reader is a bf16 autocast product).
enum UMode : int64_t { kUFloat = 0, kUBFloat16 = 1, kUBoth = 2 };

// kAdd: inputs x, weight, bias, eps, u_mode, y -> outputs {h, u[, u_low]}; otherwise inputs x,
// weight, bias, eps, u_mode -> outputs {u[, u_low]} (h is x). Autograd takes no undefined
// tensors as inputs.
template <bool kAdd>
class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction<kAdd>> {
 public:
  template <typename... Y>
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                                                int64_t u_mode, const Y&... y) {
    static_assert(sizeof...(Y) == (kAdd ? 1 : 0));
    const int64_t D = x.size(-1), N = x.numel() / D;
    const auto h = kAdd ? torch::empty_like(x) : x;
    auto u = torch::empty(x.sizes(), x.options().dtype(u_mode == kUBFloat16 ? torch::kBFloat16 : torch::kFloat32));
    const auto u_low = u_mode == kUBoth ? torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16)) : torch::Tensor();
    auto* lowp = u_low.defined() ? static_cast<c10::BFloat16*>(u_low.data_ptr()) : nullptr;
    auto mean = torch::empty({N}, x.options()), rstd = torch::empty({N}, x.options());
    RowOf yrow;  // y's rows where there is a y
    bool y_bf16 = false;
    if constexpr (kAdd) {
      const torch::Tensor& yt = std::get<0>(std::forward_as_tuple(y...));
      y_bf16 = yt.scalar_type() == torch::kBFloat16;
      yrow = y_bf16 ? RowOf{nullptr, static_cast<const uint16_t*>(yt.data_ptr())} : RowOf{yt.data_ptr<float>(), nullptr};
    }
    const float* xp = x.data_ptr<float>();
    float* hp = h.data_ptr<float>();
    const float *gamma = weight.data_ptr<float>(), *beta = bias.data_ptr<float>();
    float *mp = mean.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    const bool u_bf16 = u.scalar_type() == torch::kBFloat16;
    void* up = u.data_ptr();
    at::parallel_for(0, N, kRowsPerBlock, [&](int64_t begin, int64_t end) {
      std::vector<float> row(size_t(u_bf16 ? D : 0));
      for (int64_t i = begin; i < end; ++i) {
        if (kAdd) {
          const RowOf yi = yrow.f ? RowOf{yrow.f + i * D, nullptr} : RowOf{nullptr, yrow.b + i * D};
          add_rows(xp + i * D, yi, hp + i * D, D);
        }
        float* out = u_bf16 ? row.data() : static_cast<float*>(up) + i * D;
        normalise_row(hp + i * D, gamma, beta, float(eps), D, out, mp[i], rp[i]);
        if (u_bf16) narrow(out, static_cast<c10::BFloat16*>(up) + i * D, D);
        if (lowp) narrow(out, lowp + i * D, D);
      }
    });
    ctx->save_for_backward({h, weight, mean, rstd});
    ctx->saved_data["y_bf16"] = y_bf16;
    // An output nobody read (h after the last block; the float32 u where the position method
    // reads only the bfloat16 copy's product) gets no gradient, rather than a tensor of zeros
    // that autograd would fill and the backward would read: 4 MB a step at the quick shape.
    ctx->set_materialize_grads(false);
    torch::autograd::variable_list out;
    if (kAdd) out.push_back(h);
    out.push_back(u);
    if (u_low.defined()) out.push_back(u_low);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "the fused residual add and LayerNorm (core/kernels/residual_norm.h) has no double backward "
                "(create_graph); run with EXTRAP_FUSED_LAYER_NORM=0");
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const int64_t D = h.size(-1), N = h.numel() / D;
    const torch::Tensor dh = kAdd && grads[0].defined() ? grads[0].to(torch::kFloat32).contiguous() : torch::Tensor();
    // u's gradient: float32 or bfloat16 (u's dtype), plus the bfloat16 copy's where there is one;
    // the row loop adds them.
    const size_t first_u = kAdd ? 1 : 0;
    torch::Tensor du = grads[first_u];
    torch::Tensor du_low = grads.size() > first_u + 1 ? grads[first_u + 1] : torch::Tensor();
    if (du_low.defined()) du_low = du_low.to(torch::kBFloat16).contiguous();
    if (!du.defined() && !du_low.defined()) du = torch::zeros(h.sizes(), h.options());
    if (du.defined()) du = du.contiguous();
    const bool du_bf16 = du.defined() && du.scalar_type() == torch::kBFloat16;
    if (du.defined() && !du_bf16) du = du.to(torch::kFloat32);
    const bool y_bf16 = ctx->saved_data["y_bf16"].toBool();

    auto dx = torch::empty_like(h);
    torch::Tensor dy_bf16 = kAdd && y_bf16 ? torch::empty(h.sizes(), h.options().dtype(torch::kBFloat16))
                                           : torch::Tensor();
    const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    std::vector<float> partial(size_t(blocks * 2 * D), 0.0f);  // per block: dgamma, then dbeta
    const float *hp = h.data_ptr<float>(), *gamma = weight.data_ptr<float>();
    const float *mp = mean.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    const float* dhp = dh.defined() ? dh.data_ptr<float>() : nullptr;
    const void* dup = du.defined() ? du.data_ptr() : nullptr;
    const auto* dlowp = du_low.defined() ? static_cast<const c10::BFloat16*>(du_low.data_ptr()) : nullptr;
    float* dxp = dx.data_ptr<float>();
    auto* dyp = dy_bf16.defined() ? static_cast<c10::BFloat16*>(dy_bf16.data_ptr()) : nullptr;
    at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
      std::vector<float> xhat(static_cast<size_t>(D)), du_row(static_cast<size_t>(D)), low_row;
      for (int64_t blk = first; blk < last; ++blk) {
        float* dgamma = partial.data() + blk * 2 * D;
        for (int64_t i = blk * kRowsPerBlock; i < std::min(N, (blk + 1) * kRowsPerBlock); ++i) {
          const float* dui = dup ? static_cast<const float*>(dup) + i * D : nullptr;
          if (du_bf16) {
            widen(static_cast<const c10::BFloat16*>(dup) + i * D, du_row.data(), D);
            dui = du_row.data();
          }
          if (dlowp) {  // the bfloat16 copy's gradient, alone or added to u's
            if (!dui) {
              widen(dlowp + i * D, du_row.data(), D);
            } else {
              low_row.resize(size_t(D));
              widen(dlowp + i * D, low_row.data(), D);
              add_rows(dui, RowOf{low_row.data(), nullptr}, du_row.data(), D);
            }
            dui = du_row.data();
          }
          backward_row(dui, hp + i * D, mp[i], rp[i], dhp ? dhp + i * D : nullptr, gamma, D, dxp + i * D, dgamma,
                       dgamma + D, xhat.data());
          if (dyp) narrow(dxp + i * D, dyp + i * D, D);
        }
      }
    });
    auto dweight = torch::zeros({D}, h.options()), dbias = torch::zeros({D}, h.options());
    float *dw = dweight.data_ptr<float>(), *db = dbias.data_ptr<float>();
    for (int64_t blk = 0; blk < blocks; ++blk)  // in block order, whatever the thread count
      for (int64_t j = 0; j < D; ++j) {
        dw[j] += partial[size_t(blk * 2 * D + j)];
        db[j] += partial[size_t(blk * 2 * D + D + j)];
      }
    torch::autograd::variable_list out = {dx, dweight, dbias, torch::Tensor(), torch::Tensor()};
    if (kAdd) out.push_back(dy_bf16.defined() ? dy_bf16 : dx);
    return out;
  }
};

}  // namespace

bool fused_layer_norm_switched_on() {
  static const bool on = environment_switch("EXTRAP_FUSED_LAYER_NORM",
                                            "residual adds and LayerNorms as LibTorch runs them",
                                            "each residual add fused with the LayerNorm after it, the default");
  return on;
}

bool add_layer_norm_fused_takes(const torch::Tensor& x, const torch::Tensor& y, const torch::nn::LayerNorm& norm) {
  if (!fused_layer_norm_switched_on() || !torch::GradMode::is_enabled()) return false;
  const auto& weight = norm->weight;
  const auto& bias = norm->bias;
  if (!weight.defined() || !bias.defined() || norm->options.normalized_shape().size() != 1) return false;
  const auto cpu_float = [](const torch::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
  };
  if (!cpu_float(x) || !cpu_float(weight) || !cpu_float(bias) || x.dim() < 1 || x.numel() == 0 ||
      x.size(-1) != weight.numel() || bias.numel() != weight.numel())
    return false;
  if (y.defined() && (!y.device().is_cpu() || y.sizes() != x.sizes() ||
                      (y.scalar_type() != torch::kFloat32 && y.scalar_type() != torch::kBFloat16)))
    return false;
  return x.requires_grad() || (y.defined() && y.requires_grad()) || weight.requires_grad() ||
         bias.requires_grad();
}

namespace {

// {h, u, u_low} through the fused path, u_low only for kUBoth.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> fused_add_layer_norm(const torch::Tensor& x,
                                                                            const torch::Tensor& y,
                                                                            const torch::nn::LayerNorm& norm,
                                                                            UMode mode) {
  const double eps = norm->options.eps();
  const auto m = int64_t(mode);
  const auto out = y.defined() ? AddLayerNormFunction<true>::apply(x, norm->weight, norm->bias, eps, m, y.contiguous())
                               : AddLayerNormFunction<false>::apply(x, norm->weight, norm->bias, eps, m);
  const size_t u = y.defined() ? 1 : 0;
  return {y.defined() ? out[0] : x, out[u], mode == kUBoth ? out[u + 1] : torch::Tensor()};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& y,
                                                       const torch::nn::LayerNorm& norm, torch::ScalarType u_dtype) {
  if (!add_layer_norm_fused_takes(x, y, norm)) {
    const auto h = y.defined() ? x + y : x;
    return {h, norm.ptr()->forward(h)};
  }
  TORCH_CHECK(u_dtype == torch::kFloat32 || u_dtype == torch::kBFloat16,
              "add_layer_norm: u in float32 or bfloat16, not ", u_dtype);
  const auto [h, u, unused] = fused_add_layer_norm(x, y, norm, u_dtype == torch::kBFloat16 ? kUBFloat16 : kUFloat);
  return {h, u};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> add_layer_norm_with_copy(const torch::Tensor& x,
                                                                                const torch::Tensor& y,
                                                                                const torch::nn::LayerNorm& norm) {
  if (!add_layer_norm_fused_takes(x, y, norm) || !cpu_autocast_bf16()) {
    auto [h, u] = add_layer_norm(x, y, norm);
    return {h, u, torch::Tensor()};
  }
  return fused_add_layer_norm(x, y, norm, kUBoth);
}

}  // namespace extrap
