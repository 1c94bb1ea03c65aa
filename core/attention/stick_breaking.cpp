// Stick-breaking attention. See stick_breaking.h for the definition; long evaluations run it a
// block of query rows at a time through attention_reference_blocked() (core/attention/attention.h).
#include "core/attention/stick_breaking.h"

#include <cmath>
#include <limits>

namespace extrap {
namespace {

void check_call(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
                const AttentionOptions& options) {
  TORCH_CHECK(bias.kind == AttentionBias::Kind::StickBreaking, "stick-breaking attention got a ", bias.describe(),
              " bias");
  TORCH_CHECK(options.causal, "stick-breaking attention is defined for causal attention only");
  TORCH_CHECK(!bias.sink.defined(), "stick-breaking attention has no softmax for a sink column to join "
              "(attention.sink); leave the sink out");
  TORCH_CHECK(q.size(2) <= k.size(2), "stick-breaking attention: ", q.size(2), " queries for ", k.size(2), " keys");
}

// The weights A (B, H, Tq, Tk) of the call's queries (query row r is position Tk - Tq + r)
// against its keys.
torch::Tensor weights_of(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias) {
  const int64_t tq = q.size(2), keys = k.size(2), first = keys - tq;  // position of row 0
  auto z = torch::matmul(q * (1.0 / std::sqrt(double(q.size(3)))), k.transpose(-2, -1));  // (B, H, Tq, Tk)
  if (bias.logit_scale.defined())
    z = z * bias.logit_scale.to(z.scalar_type()).unsqueeze(0).unsqueeze(-1);
  const auto index = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  const auto i = torch::arange(first, keys, index).view({-1, 1}), j = torch::arange(0, keys, index).view({1, -1});
  auto visible = bias.stick_breaking_diagonal ? j <= i : j < i;  // (Tq, Tk)
  if (bias.masks_some(first, keys, 0, keys))
    visible = visible.logical_and(bias.option_mask(first, keys, 0, keys, q.device()).logical_not());
  // Sum over visible k > j of log(1 - sigmoid(z_ik)), added from the query leftwards (flip,
  // inclusive cumsum, flip, then shifted one key to the right).
  const auto log_stay = torch::log_sigmoid(-z).masked_fill(visible.logical_not(), 0);
  const auto after = torch::cat({log_stay.flip(-1).cumsum(-1).flip(-1).narrow(-1, 1, keys - 1),
                                 torch::zeros_like(log_stay.narrow(-1, 0, 1))}, -1);
  return torch::exp(torch::log_sigmoid(z) + after).masked_fill(visible.logical_not(), 0);
}

}  // namespace

torch::Tensor stick_breaking_weights(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias) {
  check_call(q, k, bias, AttentionOptions());
  return weights_of(q, k, bias);
}

// sum_j A_ij v_j plus the remaining mass times v_i.
torch::Tensor stick_breaking_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const AttentionBias& bias, const AttentionOptions& options) {
  check_call(q, k, bias, options);
  auto weights = weights_of(q, k, bias);                               // A
  const auto remaining = 1 - weights.sum(-1, /*keepdim=*/true);        // (B, H, Tq, 1)
  if (options.training && options.dropout > 0) weights = torch::dropout(weights, options.dropout, true);
  return torch::matmul(weights, v) + remaining * v.narrow(2, k.size(2) - q.size(2), q.size(2));
}

}  // namespace extrap
