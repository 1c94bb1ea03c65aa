#include "positions/kerple.h"

namespace extrap {

KerpleParameters::KerpleParameters(torch::nn::Module& owner, const PositionContext& context,
                                   bool shared, KerpleRange r1, KerpleRange r2)
    : shared_(shared), range1_(r1), range2_(r2) {
  const int64_t sets = shared ? 1 : context.num_layers;
  auto initial = [&](const KerpleRange& range) {
    return (torch::rand({sets, context.num_heads}) * range.init_max).clamp(range.min, range.max);
  };
  r1_ = owner.register_parameter("r1", initial(r1));
  r2_ = owner.register_parameter("r2", initial(r2));
}

std::pair<torch::Tensor, torch::Tensor> KerpleParameters::at_layer(int64_t layer) {
  // On .data(), as the reference: no autograd version bump, so that a later layer of the same
  // forward pass may do this again (it changes nothing then) without breaking the backward of
  // an earlier one. No host synchronisation.
  r1_.data().clamp_(range1_.min, range1_.max);
  r2_.data().clamp_(range2_.min, range2_.max);
  const int64_t set = shared_ ? 0 : layer;
  return {r1_[set].view({-1, 1}), r2_[set].view({-1, 1})};
}

std::vector<std::pair<std::string, double>> KerpleParameters::log_values() const {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, double>> out;
  auto r1 = r1_.clamp(range1_.min, range1_.max).to(torch::kCPU, torch::kFloat64);  // (S, H)
  auto r2 = r2_.clamp(range2_.min, range2_.max).to(torch::kCPU, torch::kFloat64);
  for (int64_t s = 0; s < r1.size(0); ++s) {
    const std::string layer = shared_ ? "" : "layer" + std::to_string(s) + ".";
    for (int64_t h = 0; h < r1.size(1); ++h) {
      out.emplace_back(layer + "r1[" + std::to_string(h) + "]", r1[s][h].item<double>());
      out.emplace_back(layer + "r2[" + std::to_string(h) + "]", r2[s][h].item<double>());
    }
  }
  return out;
}

}  // namespace extrap
