// Stick-breaking attention: the reference and its row-blocked evaluation share one function,
// stick_breaking_rows(). See stick_breaking.h for the definition.
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

// The weights A (B, H, n, first + n) of rows [r0, r0 + n) of the call's Tq queries (query row r
// is position Tk - Tq + r, `first` that of row r0) against keys 0 .. the last row's position.
// logit_scale rows are the call's rows.
torch::Tensor weights_of_rows(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias, int64_t r0,
                              int64_t n) {
  const int64_t tq = q.size(2), tk = k.size(2), first = tk - tq + r0;  // position of row r0
  const int64_t keys = first + n;                                         // keys the rows can see
  const auto qs = q.narrow(2, r0, n), ks = k.narrow(2, 0, keys);
  auto z = torch::matmul(qs * (1.0 / std::sqrt(double(q.size(3)))), ks.transpose(-2, -1));  // (B, H, n, keys)
  if (bias.logit_scale.defined())
    z = z * bias.logit_scale.narrow(1, r0, n).to(z.scalar_type()).unsqueeze(0).unsqueeze(-1);
  const auto index = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  const auto i = torch::arange(first, first + n, index).view({-1, 1}), j = torch::arange(0, keys, index).view({1, -1});
  auto visible = bias.stick_breaking_diagonal ? j <= i : j < i;  // (n, keys)
  if (bias.masks_some(first, first + n, 0, keys))
    visible = visible.logical_and(bias.option_mask(first, first + n, 0, keys, q.device()).logical_not());
  // Sum over visible k > j of log(1 - sigmoid(z_ik)), added from the query leftwards (flip,
  // inclusive cumsum, flip, then shifted one key to the right).
  const auto log_stay = torch::log_sigmoid(-z).masked_fill(visible.logical_not(), 0);
  const auto after = torch::cat({log_stay.flip(-1).cumsum(-1).flip(-1).narrow(-1, 1, keys - 1),
                                 torch::zeros_like(log_stay.narrow(-1, 0, 1))}, -1);
  return torch::exp(torch::log_sigmoid(z) + after).masked_fill(visible.logical_not(), 0);
}

// Output rows [r0, r0 + n): sum_j A_ij v_j plus the remaining mass times v_i.
torch::Tensor stick_breaking_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const AttentionBias& bias, const AttentionOptions& options, int64_t r0, int64_t n) {
  const int64_t first = k.size(2) - q.size(2) + r0;
  auto weights = weights_of_rows(q, k, bias, r0, n);                                            // A
  const auto vs = v.narrow(2, 0, first + n);
  const auto remaining = 1 - weights.sum(-1, /*keepdim=*/true);                                   // (B, H, n, 1)
  if (options.training && options.dropout > 0) weights = torch::dropout(weights, options.dropout, true);
  return torch::matmul(weights, vs) + remaining * v.narrow(2, first, n);
}

}  // namespace

torch::Tensor stick_breaking_weights(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias) {
  check_call(q, k, bias, AttentionOptions());
  return weights_of_rows(q, k, bias, 0, q.size(2));
}

torch::Tensor stick_breaking_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const AttentionBias& bias, const AttentionOptions& options) {
  check_call(q, k, bias, options);
  return stick_breaking_rows(q, k, v, bias, options, 0, q.size(2));
}

torch::Tensor stick_breaking_attention_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                               const AttentionBias& bias, const AttentionOptions& options,
                                               int64_t query_block) {
  check_call(q, k, bias, options);
  TORCH_CHECK(query_block > 0, "stick-breaking attention: query block ", query_block);
  TORCH_CHECK(!torch::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad() || v.requires_grad()),
              "stick-breaking attention in row blocks is inference only: an input requires grad (the reference "
              "backend trains)");
  TORCH_CHECK(!(options.training && options.dropout > 0), "stick-breaking attention in row blocks has no dropout");
  std::vector<torch::Tensor> parts;
  for (int64_t r = 0; r < q.size(2); r += query_block)
    parts.push_back(stick_breaking_rows(q, k, v, bias, options, r, std::min(query_block, q.size(2) - r)));
  return torch::cat(parts, 2);
}

}  // namespace extrap
