#include "core/kernels/residual_norm.h"

#include "core/base/environment.h"
#include "core/base/late_registration.h"
#include "core/kernels/cpu_vector_math.h"
#include "core/kernels/cuda/residual_norm_params.h"
#include "core/kernels/precision.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

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

// Row h (D values) -> its mean (0 for an RMSNorm) and 1 / sqrt(variance + eps) (RMSNorm: the
// mean square for the variance), and u = (h - mean) rstd gamma + beta (beta null: none).
EXTRAP_ISA_KERNEL(void, normalise_row, (const float* h, const float* gamma, const float* beta, float eps, bool rms, int64_t D, float* u, float& mean_out, float& rstd_out), (h, gamma, beta, eps, rms, D, u, mean_out, rstd_out)) {
  float sum = 0;
  if (!rms) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < D; ++j) sum += h[j];
  }
  const float mean = sum / float(D);
  float squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < D; ++j) squares += (h[j] - mean) * (h[j] - mean);
  const float rstd = 1.0f / std::sqrt(squares / float(D) + eps);
  if (beta) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) u[j] = (h[j] - mean) * rstd * gamma[j] + beta[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) u[j] = (h[j] - mean) * rstd * gamma[j];
  }
  mean_out = mean;
  rstd_out = rstd;
}

// One row of the norm's backward with the residual's gradient added: from du (float32), h,
// mean and rstd, dx = dh + rstd (g - mean(g) - xhat mean(g xhat)), g = du gamma, xhat = (h -
// mean) rstd (an RMSNorm's mean is 0 and has no mean(g) term: `rms`); dgamma += du xhat, dbeta +=
// du (dbeta null: no bias). `xhat` is D floats of scratch.
EXTRAP_ISA_KERNEL(void, backward_row, (const float* du, const float* h, float mean, float rstd, bool rms, const float* dh, const float* gamma, int64_t D, float* dx, float* dgamma, float* dbeta, float* xhat), (du, h, mean, rstd, rms, dh, gamma, D, dx, dgamma, dbeta, xhat)) {
  float sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < D; ++j) {
    xhat[j] = (h[j] - mean) * rstd;
    const float g = du[j] * gamma[j];
    sum_g += g;
    sum_gx += g * xhat[j];
    dgamma[j] += du[j] * xhat[j];
  }
  if (dbeta) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) dbeta[j] += du[j];
  }
  const float a = rms ? 0.0f : sum_g / float(D), b = sum_gx / float(D);
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

// The forward's operands and outputs, for either device's row loop. y and u_low are undefined
// where absent; h is x itself without a y; u is float32 or bfloat16.
struct ForwardRows {
  torch::Tensor x, y, weight, bias, h, u, u_low, mean, rstd;  // bias undefined: none
  float eps;
  bool rms;
};

void forward_rows_cpu(const ForwardRows& f) {
  const int64_t D = f.x.size(-1), N = f.x.numel() / D;
  RowOf yrow;  // y's rows where there is a y
  if (f.y.defined())
    yrow = f.y.scalar_type() == torch::kBFloat16 ? RowOf{nullptr, static_cast<const uint16_t*>(f.y.data_ptr())}
                                                 : RowOf{f.y.data_ptr<float>(), nullptr};
  auto* lowp = f.u_low.defined() ? static_cast<c10::BFloat16*>(f.u_low.data_ptr()) : nullptr;
  const float* xp = f.x.data_ptr<float>();
  float* hp = f.h.data_ptr<float>();
  const float *gamma = f.weight.data_ptr<float>(), *beta = f.bias.defined() ? f.bias.data_ptr<float>() : nullptr;
  float *mp = f.mean.data_ptr<float>(), *rp = f.rstd.data_ptr<float>();
  const bool u_bf16 = f.u.scalar_type() == torch::kBFloat16;
  void* up = f.u.data_ptr();
  at::parallel_for(0, N, kRowsPerBlock, [&](int64_t begin, int64_t end) {
    std::vector<float> row(size_t(u_bf16 ? D : 0));
    for (int64_t i = begin; i < end; ++i) {
      if (yrow.f || yrow.b) {
        const RowOf yi = yrow.f ? RowOf{yrow.f + i * D, nullptr} : RowOf{nullptr, yrow.b + i * D};
        add_rows(xp + i * D, yi, hp + i * D, D);
      }
      float* out = u_bf16 ? row.data() : static_cast<float*>(up) + i * D;
      normalise_row(hp + i * D, gamma, beta, f.eps, f.rms, D, out, mp[i], rp[i]);
      if (u_bf16) narrow(out, static_cast<c10::BFloat16*>(up) + i * D, D);
      if (lowp) narrow(out, lowp + i * D, D);
    }
  });
}

cuda::RowType row_type(const torch::Tensor& t) {
  if (!t.defined()) return cuda::RowType::none;
  return t.scalar_type() == torch::kBFloat16 ? cuda::RowType::bfloat16 : cuda::RowType::float32;
}

void forward_rows_cuda(const ForwardRows& f) {
  cuda::AddLayerNormForward p;
  p.width = f.x.size(-1);
  p.rows = f.x.numel() / p.width;
  p.eps = f.eps;
  p.rms = f.rms;
  p.x = f.x.data_ptr<float>();
  if (f.y.defined()) {
    p.y = f.y.data_ptr();
    p.y_type = row_type(f.y);
    p.h = f.h.data_ptr<float>();
  }
  p.gamma = f.weight.data_ptr<float>();
  p.beta = f.bias.defined() ? f.bias.data_ptr<float>() : nullptr;
  if (f.u.scalar_type() == torch::kBFloat16) p.u_bf16 = f.u.data_ptr();
  else p.u = f.u.data_ptr<float>();
  if (f.u_low.defined()) p.u_bf16 = f.u_low.data_ptr();
  p.mean = f.mean.data_ptr<float>();
  p.rstd = f.rstd.data_ptr<float>();
  const c10::DeviceGuard guard(f.x.device());
  cuda_add_layer_norm()->forward(p);
}

// The backward's operands and outputs. dh, du (float32 or bfloat16, u's dtype) and du_low
// (bfloat16) are undefined where nothing read that output; dy_bf16 is defined for a bfloat16 y.
struct BackwardRows {
  torch::Tensor h, weight, mean, rstd, dh, du, du_low, dx, dy_bf16, dweight, dbias;  // dbias undefined: no bias
  bool rms;
};

void backward_rows_cpu(const BackwardRows& b) {
  const int64_t D = b.h.size(-1), N = b.h.numel() / D;
  const bool du_bf16 = b.du.defined() && b.du.scalar_type() == torch::kBFloat16;
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<float> partial(size_t(blocks * 2 * D), 0.0f);  // per block: dgamma, then dbeta
  const bool with_bias = b.dbias.defined();
  const float *hp = b.h.data_ptr<float>(), *gamma = b.weight.data_ptr<float>();
  const float *mp = b.mean.data_ptr<float>(), *rp = b.rstd.data_ptr<float>();
  const float* dhp = b.dh.defined() ? b.dh.data_ptr<float>() : nullptr;
  const void* dup = b.du.defined() ? b.du.data_ptr() : nullptr;
  const auto* dlowp = b.du_low.defined() ? static_cast<const c10::BFloat16*>(b.du_low.data_ptr()) : nullptr;
  float* dxp = b.dx.data_ptr<float>();
  auto* dyp = b.dy_bf16.defined() ? static_cast<c10::BFloat16*>(b.dy_bf16.data_ptr()) : nullptr;
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
        if (!dui) {  // nothing read u: its gradient is zero
          std::fill(du_row.begin(), du_row.end(), 0.0f);
          dui = du_row.data();
        }
        backward_row(dui, hp + i * D, mp[i], rp[i], b.rms, dhp ? dhp + i * D : nullptr, gamma, D, dxp + i * D, dgamma,
                     with_bias ? dgamma + D : nullptr, xhat.data());
        if (dyp) narrow(dxp + i * D, dyp + i * D, D);
      }
    }
  });
  float *dw = b.dweight.data_ptr<float>(), *db = with_bias ? b.dbias.data_ptr<float>() : nullptr;
  std::fill(dw, dw + D, 0.0f);
  if (db) std::fill(db, db + D, 0.0f);
  for (int64_t blk = 0; blk < blocks; ++blk)  // in block order, whatever the thread count
    for (int64_t j = 0; j < D; ++j) {
      dw[j] += partial[size_t(blk * 2 * D + j)];
      if (db) db[j] += partial[size_t(blk * 2 * D + D + j)];
    }
}

void backward_rows_cuda(const BackwardRows& b) {
  const CudaAddLayerNorm* kernels = cuda_add_layer_norm();
  cuda::AddLayerNormBackward p;
  p.width = b.h.size(-1);
  p.rows = b.h.numel() / p.width;
  p.h = b.h.data_ptr<float>();
  p.mean = b.mean.data_ptr<float>();
  p.rstd = b.rstd.data_ptr<float>();
  p.gamma = b.weight.data_ptr<float>();
  p.rms = b.rms;
  p.du = b.du.defined() ? b.du.data_ptr() : nullptr;
  p.du_type = row_type(b.du);
  p.du_copy = b.du_low.defined() ? b.du_low.data_ptr() : nullptr;
  p.dh = b.dh.defined() ? b.dh.data_ptr<float>() : nullptr;
  p.dx = b.dx.data_ptr<float>();
  p.dy_bf16 = b.dy_bf16.defined() ? b.dy_bf16.data_ptr() : nullptr;
  const c10::DeviceGuard guard(b.h.device());
  p.blocks = kernels->backward_blocks(p.rows, b.h.get_device());
  const auto partial = torch::empty({p.blocks, 2, p.width}, b.h.options());
  p.partial = partial.data_ptr<float>();
  p.dgamma = b.dweight.data_ptr<float>();
  p.dbeta = b.dbias.defined() ? b.dbias.data_ptr<float>() : nullptr;
  kernels->backward(p);
}

// kAdd: inputs x, weight, bias, eps, rms, u_mode, y -> outputs {h, u[, u_low]}; otherwise inputs x,
// weight, bias, eps, rms, u_mode -> outputs {u[, u_low]} (h is x). Autograd takes no undefined
// tensors as inputs: a norm without a bias passes an empty one (no elements). The row loops run
// on x's device: the CPU loops above, or the CUDA kernels
// (core/kernels/cuda/residual_norm_kernels.cuh), the same arithmetic.
template <bool kAdd>
class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction<kAdd>> {
 public:
  template <typename... Y>
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                                                bool rms, int64_t u_mode, const Y&... y) {
    static_assert(sizeof...(Y) == (kAdd ? 1 : 0));
    const int64_t N = x.numel() / x.size(-1);
    ForwardRows f;
    f.x = x;
    if constexpr (kAdd) f.y = std::get<0>(std::forward_as_tuple(y...));
    f.weight = weight;
    if (bias.numel() > 0) f.bias = bias;
    f.eps = float(eps);
    f.rms = rms;
    f.h = kAdd ? torch::empty_like(x) : x;
    f.u = torch::empty(x.sizes(), x.options().dtype(u_mode == kUBFloat16 ? torch::kBFloat16 : torch::kFloat32));
    if (u_mode == kUBoth) f.u_low = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
    f.mean = torch::empty({N}, x.options());
    f.rstd = torch::empty({N}, x.options());
    if (x.is_cuda()) forward_rows_cuda(f);
    else forward_rows_cpu(f);
    ctx->save_for_backward({f.h, weight, f.mean, f.rstd});
    ctx->saved_data["y_bf16"] = f.y.defined() && f.y.scalar_type() == torch::kBFloat16;
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["bias"] = f.bias.defined();
    // An output nobody read (h after the last block; the float32 u where the position method
    // reads only the bfloat16 copy's product) gets no gradient, rather than a tensor of zeros
    // that autograd would fill and the backward would read: 4 MB a step at the quick shape.
    ctx->set_materialize_grads(false);
    torch::autograd::variable_list out;
    if (kAdd) out.push_back(f.h);
    out.push_back(f.u);
    if (f.u_low.defined()) out.push_back(f.u_low);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "the fused residual add and LayerNorm (core/kernels/residual_norm.h) has no double backward "
                "(create_graph); run with EXTRAP_FUSED_LAYER_NORM=0");
    const auto saved = ctx->get_saved_variables();
    BackwardRows b;
    b.h = saved[0];
    b.weight = saved[1];
    b.mean = saved[2];
    b.rstd = saved[3];
    if (kAdd && grads[0].defined()) b.dh = grads[0].to(torch::kFloat32).contiguous();
    // u's gradient: float32 or bfloat16 (u's dtype), plus the bfloat16 copy's where there is one;
    // the row loop adds them.
    const size_t first_u = kAdd ? 1 : 0;
    b.du = grads[first_u];
    if (b.du.defined()) {
      b.du = b.du.contiguous();
      if (b.du.scalar_type() != torch::kBFloat16) b.du = b.du.to(torch::kFloat32);
    }
    if (grads.size() > first_u + 1 && grads[first_u + 1].defined())
      b.du_low = grads[first_u + 1].to(torch::kBFloat16).contiguous();
    b.dx = torch::empty_like(b.h);
    if (kAdd && ctx->saved_data["y_bf16"].toBool())
      b.dy_bf16 = torch::empty(b.h.sizes(), b.h.options().dtype(torch::kBFloat16));
    b.dweight = torch::empty({b.h.size(-1)}, b.h.options());
    if (ctx->saved_data["bias"].toBool()) b.dbias = torch::empty({b.h.size(-1)}, b.h.options());
    b.rms = ctx->saved_data["rms"].toBool();
    if (b.h.is_cuda()) backward_rows_cuda(b);
    else backward_rows_cpu(b);
    torch::autograd::variable_list out = {b.dx, b.dweight, b.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    if (kAdd) out.push_back(b.dy_bf16.defined() ? b.dy_bf16 : b.dx);
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

namespace {

LateRegistration<CudaAddLayerNorm> registered_add_layer_norm;

}  // namespace

void register_cuda_add_layer_norm(const CudaAddLayerNorm& entry) { registered_add_layer_norm.set(entry); }

const CudaAddLayerNorm* cuda_add_layer_norm() { return registered_add_layer_norm.get(); }

torch::Tensor norm_reference(const torch::Tensor& x, const RowNorm& norm) {
  if (!norm.rms) {
    const std::vector<int64_t> shape{x.size(-1)};
    return torch::layer_norm(x, shape, norm.weight, norm.bias, norm.eps);
  }
  // RMSNorm in x's dtype (float32 in float32 models; float64 in the float64 references).
  auto u = x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + norm.eps);
  if (norm.weight.defined()) u = u * norm.weight;
  return norm.bias.defined() ? u + norm.bias : u;
}

bool add_layer_norm_fused_takes(const torch::Tensor& x, const torch::Tensor& y, const RowNorm& norm) {
  if (!fused_layer_norm_switched_on() || !torch::GradMode::is_enabled()) return false;
  const auto& weight = norm.weight;
  const auto& bias = norm.bias;
  const bool weighted = weight.defined();  // a norm without parameters runs with a weight of ones
  if ((weighted && weight.dim() != 1) || x.dim() < 1 || x.numel() == 0) return false;
  // The CPU loops take any width; the CUDA kernels rows of up to kAddLayerNormMaxWidth, where
  // libextrap_cuda.so has loaded and the GPU paths not yet run on a GPU are asked for.
  const auto device = x.device();
  if (device.is_cuda() && (!cuda_add_layer_norm() || !gpu_new_routes_on() || x.size(-1) > cuda::kAddLayerNormMaxWidth))
    return false;
  if (!device.is_cpu() && !device.is_cuda()) return false;
  const auto float_here = [&](const torch::Tensor& t) {
    return t.device() == device && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
  };
  if (!float_here(x) || (weighted && (!float_here(weight) || x.size(-1) != weight.numel())) ||
      (bias.defined() && (!float_here(bias) || bias.numel() != x.size(-1))))
    return false;
  if (y.defined() && (y.device() != device || y.sizes() != x.sizes() ||
                      (y.scalar_type() != torch::kFloat32 && y.scalar_type() != torch::kBFloat16)))
    return false;
  return x.requires_grad() || (y.defined() && y.requires_grad()) || (weighted && weight.requires_grad()) ||
         (bias.defined() && bias.requires_grad());
}

namespace {

// {h, u, u_low} through the fused path, u_low only for kUBoth.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> fused_add_layer_norm(const torch::Tensor& x,
                                                                            const torch::Tensor& y,
                                                                            const RowNorm& norm,
                                                                            UMode mode) {
  const auto m = int64_t(mode);
  // A norm without parameters: the kernels' weight is ones (its gradient is computed and dropped).
  const auto weight = norm.weight.defined() ? norm.weight : torch::ones({x.size(-1)}, x.options());
  const auto bias = norm.bias.defined() ? norm.bias : torch::empty({0}, weight.options());
  const auto out = y.defined()
                       ? AddLayerNormFunction<true>::apply(x, weight, bias, norm.eps, norm.rms, m, y.contiguous())
                       : AddLayerNormFunction<false>::apply(x, weight, bias, norm.eps, norm.rms, m);
  const size_t u = y.defined() ? 1 : 0;
  return {y.defined() ? out[0] : x, out[u], mode == kUBoth ? out[u + 1] : torch::Tensor()};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& y,
                                                       const RowNorm& norm, torch::ScalarType u_dtype) {
  if (!add_layer_norm_fused_takes(x, y, norm)) {
    const auto h = y.defined() ? x + y : x;
    return {h, norm_reference(h, norm)};
  }
  TORCH_CHECK(u_dtype == torch::kFloat32 || u_dtype == torch::kBFloat16,
              "add_layer_norm: u in float32 or bfloat16, not ", u_dtype);
  const auto [h, u, unused] = fused_add_layer_norm(x, y, norm, u_dtype == torch::kBFloat16 ? kUBFloat16 : kUFloat);
  return {h, u};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> add_layer_norm_with_copy(const torch::Tensor& x,
                                                                                const torch::Tensor& y,
                                                                                const RowNorm& norm) {
  if (!add_layer_norm_fused_takes(x, y, norm) || !autocast_bf16(x.device().type())) {
    auto [h, u] = add_layer_norm(x, y, norm);
    return {h, u, torch::Tensor()};
  }
  return fused_add_layer_norm(x, y, norm, kUBoth);
}

}  // namespace extrap
