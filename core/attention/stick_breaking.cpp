// Stick-breaking attention. See stick_breaking.h for the definition, the reference path
// (stick_breaking_attention, autograd over whole score matrices) and the row-blocked path with
// its own backward (stick_breaking_attention_blocked).
#include "core/attention/stick_breaking.h"

#include "core/kernels/cpu_vector_math.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

namespace extrap {
namespace {

void check_call(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
                const AttentionOptions& options) {
  TORCH_CHECK(bias.kind == AttentionBias::Kind::StickBreaking, "stick-breaking attention got a ", bias.describe(),
              " bias");
  TORCH_CHECK(options.causal, "stick-breaking attention is defined for causal attention only");
  TORCH_CHECK(!bias.sink.defined(), "stick-breaking attention has no softmax for a sink column to join "
              "(attention.sink); leave the sink out");
  TORCH_CHECK(bias.softcap == 0, "stick-breaking attention's logits feed no softmax for attention.softcap to cap; "
              "leave the softcap out");
  TORCH_CHECK(q.size(2) <= k.size(2), "stick-breaking attention: ", q.size(2), " queries for ", k.size(2), " keys");
}

// The call's queries (query row r is position Tk - Tq + r) against its keys, (B, H, Tq, Tk) each.
struct StickRows {
  torch::Tensor logits;   // q . k / sqrt(d), before the logit scale
  torch::Tensor z;        // the logits times the row's logit scale, if any
  torch::Tensor weights;  // A, 0 where a key is not visible
};

// log sigmoid(z_j) into lz and log sigmoid(-z_j) into ls, j < n, from one exp and one log each:
// with l = ln(1 + e^{-|z|}), log sigmoid(z) = min(z, 0) - l and log sigmoid(-z) = -max(z, 0) - l.
// Two loops: GCC 12 vectorises each, and not the two functions inlined into one.
EXTRAP_ISA_KERNEL(void, log_sigmoids, (const float* z, int64_t n, float* lz, float* ls), (z, n, lz, ls)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) ls[j] = exp_float(z[j] < 0 ? z[j] : -z[j]);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float x = z[j], l = log_float(1.0f + ls[j]);
    lz[j] = (x < 0 ? x : 0.0f) - l;
    ls[j] = (x > 0 ? -x : 0.0f) - l;
  }
}

EXTRAP_ISA_KERNEL(void, exp_in_place, (float* x, int64_t n), (x, n)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] = exp_float(x[j]);
}

// The weights of float32 CPU rows, a row at a time: its visible keys are one range [lo, hi)
// (the causal half, less the diagonal unless it is visible, cut by window and chunk:
// AttentionBias::option_span), log A_ij = log sigmoid(z_ij) + the sum of log sigmoid(-z_ik)
// over k in (j, hi), added from the query leftwards, then exp. Each row stays in cache through
// its three passes, where the tensor form makes ten passes over (B, H, Tq, Tk) tensors.
torch::Tensor cpu_weights(const torch::Tensor& z, const AttentionBias& bias) {
  const auto zc = z.contiguous();
  const int64_t tq = zc.size(2), keys = zc.size(3), first = keys - tq, rows = zc.numel() / std::max<int64_t>(keys, 1);
  auto weights = torch::zeros_like(zc);
  const float* zp = zc.data_ptr<float>();
  float* wp = weights.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> stay(static_cast<size_t>(keys));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = first + row % tq;
      const auto span = bias.option_span(i, keys, /*causal=*/true);
      const int64_t lo = span.first, hi = bias.stick_breaking_diagonal ? span.second + 1 : std::min(span.second + 1, i);
      if (lo >= hi) continue;
      const float* zr = zp + row * keys;
      float* wr = wp + row * keys;
      log_sigmoids(zr + lo, hi - lo, wr + lo, stay.data());
      float after = 0;  // sum of log sigmoid(-z_ik) over visible k > j
      for (int64_t j = hi - 1; j >= lo; --j) {
        wr[j] += after;
        after += stay[size_t(j - lo)];
      }
      exp_in_place(wr + lo, hi - lo);
    }
  });
  return weights;
}

// The keys rows [first, keys) see, (keys - first, keys) bool: the causal half (the diagonal too
// where the bias sees it), less what window and chunk hide.
torch::Tensor visible_keys(const AttentionBias& bias, int64_t first, int64_t keys, const torch::Device& device) {
  const auto index = torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto i = torch::arange(first, keys, index).view({-1, 1}), j = torch::arange(0, keys, index).view({1, -1});
  auto visible = bias.stick_breaking_diagonal ? j <= i : j < i;
  if (bias.masks_some(first, keys, 0, keys))
    visible = visible.logical_and(bias.option_mask(first, keys, 0, keys, device).logical_not());
  return visible;
}

StickRows rows_of(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias) {
  const int64_t tq = q.size(2), keys = k.size(2), first = keys - tq;  // position of row 0
  StickRows rows;
  rows.logits = torch::matmul(q * (1.0 / std::sqrt(double(q.size(3)))), k.transpose(-2, -1));
  rows.z = bias.logit_scale.defined()
               ? rows.logits * bias.logit_scale.to(rows.logits.scalar_type()).unsqueeze(0).unsqueeze(-1)
               : rows.logits;
  // float32 on the CPU without autograd (inference, and the row-blocked path's own passes): one
  // row at a time, each row's visible keys a range (no mask). The reference path's autograd
  // takes the tensor form below.
  if (rows.z.scalar_type() == torch::kFloat32 && rows.z.is_cpu() && !rows.z.requires_grad()) {
    rows.weights = cpu_weights(rows.z, bias);
    return rows;
  }
  // Sum over visible k > j of log(1 - sigmoid(z_ik)), added from the query leftwards (flip,
  // inclusive cumsum, flip, then shifted one key to the right).
  const auto hidden = visible_keys(bias, first, keys, q.device()).logical_not();
  const auto log_stay = torch::log_sigmoid(-rows.z).masked_fill(hidden, 0);
  const auto after = torch::cat({log_stay.flip(-1).cumsum(-1).flip(-1).narrow(-1, 1, keys - 1),
                                 torch::zeros_like(log_stay.narrow(-1, 0, 1))}, -1);
  rows.weights = torch::exp(torch::log_sigmoid(rows.z) + after).masked_fill(hidden, 0);
  return rows;
}

// Rows [r, r + n) of the call's queries against the keys they can see (the first Tk - Tq + r + n).
StickRows block_rows(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias, int64_t r, int64_t n) {
  const int64_t keys = k.size(2) - q.size(2) + r + n;
  AttentionBias rows = bias;
  if (bias.logit_scale.defined()) rows.logit_scale = bias.logit_scale.narrow(1, r, n);
  return rows_of(q.narrow(2, r, n), k.narrow(2, 0, keys), rows);
}

torch::ScalarType compute_type(const torch::Tensor& q) {
  return q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

AttentionBias stick_bias(bool diagonal, int64_t window, int64_t chunk, const torch::Tensor& logit_scale) {
  auto bias = AttentionBias::stick_breaking(diagonal);
  bias.window = window;
  bias.chunk = chunk;
  if (logit_scale.numel() > 0) bias.logit_scale = logit_scale;
  return bias;
}

class StickBreakingFunction : public torch::autograd::Function<StickBreakingFunction> {
 public:
  // logit_scale: the bias's (H, Tq), or an empty tensor (autograd takes no undefined inputs).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& logit_scale, bool diagonal, int64_t window,
                               int64_t chunk, int64_t block) {
    const auto bias = stick_bias(diagonal, window, chunk, logit_scale);
    const auto c = compute_type(q);
    const auto qf = q.to(c), kf = k.to(c), vf = v.to(c);
    const int64_t tq = q.size(2), first = k.size(2) - tq;
    auto out = torch::empty(q.sizes(), q.options());
    for (int64_t r = 0; r < tq; r += block) {
      const int64_t n = std::min(block, tq - r), keys = first + r + n;
      const auto a = block_rows(qf, kf, bias, r, n).weights;
      const auto remaining = 1 - a.sum(-1, /*keepdim=*/true);
      out.narrow(2, r, n).copy_(torch::matmul(a, vf.narrow(2, 0, keys)) + remaining * vf.narrow(2, first + r, n));
    }
    ctx->save_for_backward({q, k, v, logit_scale});
    ctx->saved_data["diagonal"] = diagonal;
    ctx->saved_data["window"] = window;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["block"] = block;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &logit_scale = saved[3];
    const auto bias = stick_bias(ctx->saved_data["diagonal"].toBool(), ctx->saved_data["window"].toInt(),
                                 ctx->saved_data["chunk"].toInt(), logit_scale);
    const int64_t block = ctx->saved_data["block"].toInt();
    const auto c = compute_type(q);
    const auto qf = q.to(c), kf = k.to(c), vf = v.to(c), g = grads[0].to(c);
    const int64_t tq = q.size(2), first = k.size(2) - tq;
    const double scale = 1.0 / std::sqrt(double(q.size(3)));
    auto dq = torch::empty_like(qf), dk = torch::zeros_like(kf), dv = torch::zeros_like(vf);
    const bool scale_grad = bias.logit_scale.defined() && logit_scale.requires_grad();
    auto dscale = scale_grad ? torch::zeros(logit_scale.sizes(), logit_scale.options().dtype(c)) : torch::Tensor();
    for (int64_t r = 0; r < tq; r += block) {
      const int64_t n = std::min(block, tq - r), keys = first + r + n;
      const auto rows = block_rows(qf, kf, bias, r, n);
      const auto gb = g.narrow(2, r, n), kb = kf.narrow(2, 0, keys), vb = vf.narrow(2, 0, keys);
      const auto own = vf.narrow(2, first + r, n);  // v_i of each row
      // o_i = v_i + sum_j A_ij (v_j - v_i): w_ij = A_ij g_i . (v_j - v_i) is the gradient of log A_ij.
      const auto w = rows.weights * (torch::matmul(gb, vb.transpose(-2, -1)) - (gb * own).sum(-1, true));
      const auto hidden = visible_keys(bias, keys - n, keys, qf.device()).logical_not();
      auto dz = (w - torch::sigmoid(rows.z) * w.cumsum(-1)).masked_fill(hidden, 0);
      dv.narrow(2, 0, keys).add_(torch::matmul(rows.weights.transpose(-2, -1), gb));
      dv.narrow(2, first + r, n).add_(gb * (1 - rows.weights.sum(-1, true)));
      if (bias.logit_scale.defined()) {  // z = c_i x logits: dc_i = sum_j dz_ij logits_ij, over the batch too
        if (scale_grad) dscale.narrow(1, r, n).add_((dz * rows.logits).sum(-1).sum(0));
        dz = dz * bias.logit_scale.narrow(1, r, n).to(c).unsqueeze(0).unsqueeze(-1);
      }
      dq.narrow(2, r, n).copy_(torch::matmul(dz, kb) * scale);
      dk.narrow(2, 0, keys).add_(torch::matmul(dz.transpose(-2, -1), qf.narrow(2, r, n)) * scale);
    }
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
            scale_grad ? dscale.to(logit_scale.scalar_type()) : torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor stick_breaking_weights(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias) {
  check_call(q, k, bias, AttentionOptions());
  return rows_of(q, k, bias).weights;
}

// sum_j A_ij v_j plus the remaining mass times v_i.
torch::Tensor stick_breaking_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const AttentionBias& bias, const AttentionOptions& options) {
  check_call(q, k, bias, options);
  auto weights = rows_of(q, k, bias).weights;                          // A
  const auto remaining = 1 - weights.sum(-1, /*keepdim=*/true);        // (B, H, Tq, 1)
  if (options.training && options.dropout > 0) weights = torch::dropout(weights, options.dropout, true);
  return torch::matmul(weights, v) + remaining * v.narrow(2, k.size(2) - q.size(2), q.size(2));
}

torch::Tensor stick_breaking_attention_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                               const AttentionBias& bias, const AttentionOptions& options,
                                               int64_t query_block) {
  check_call(q, k, bias, options);
  TORCH_CHECK(query_block > 0, "stick-breaking attention in row blocks: query block ", query_block);
  TORCH_CHECK(!(options.training && options.dropout > 0), "stick-breaking attention in row blocks has no attention "
              "dropout (", options.dropout, "); the reference backend has");
  bias.check_logit_scale(q.size(1), q.size(2), "stick-breaking attention");
  const auto scale = bias.logit_scale.defined() ? bias.logit_scale : torch::empty({0}, q.options());
  return StickBreakingFunction::apply(q, k, v, scale, bias.stick_breaking_diagonal, bias.window, bias.chunk,
                                      query_block);
}

}  // namespace extrap
