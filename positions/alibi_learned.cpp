// `alibi_learned`: ALiBi with trainable slopes (tried in Press et al., 2022, section 4).
// Causal: one slope per head, score(i, j) gets -m_h * (i - j) for j <= i. Bidirectional:
// separate left and right slopes, -m_left * (i - j) for j <= i and -m_right * (j - i) for j > i.
// Every slope starts at the fixed ALiBi slope of its head.
//
// Parametrisation: slope = softplus(raw), raw initialised to softplus^-1(m) = log(expm1(m)),
// so slopes stay positive whatever the optimiser does; for the small slopes ALiBi uses,
// softplus(raw) ~ exp(raw), i.e. updates act on the log of the slope. The bias is still
// described as slopes (AttentionBias::linear) that carry autograd back to `raw`.
#include "positions/alibi_slopes.h"
#include "positions/position.h"

#include <cmath>
#include <string>
#include <vector>

namespace extrap {
namespace {

struct AlibiLearnedOptions {
  bool shared_across_layers = true;
  void read(const OptionReader& r) {
    r.read("shared_across_layers", shared_across_layers,
           "one set of slopes for all layers; false: one set per layer");
  }
};

class AlibiLearned : public PositionMethod {
 public:
  AlibiLearned(const PositionContext& context, AlibiLearnedOptions options)
      : options_(options), causal_(context.causal) {
    const int64_t sets = options.shared_across_layers ? 1 : context.num_layers;
    std::vector<double> raw;
    for (double m : alibi_slopes(int(context.num_heads))) raw.push_back(std::log(std::expm1(m)));
    auto initial = [&] {  // a fresh leaf tensor per parameter: (sets, H)
      return torch::tensor(raw, torch::kFloat64).to(torch::kFloat32).unsqueeze(0).repeat({sets, 1});
    };
    if (causal_) {
      raw_left_ = register_parameter("raw_slopes", initial());
    } else {
      raw_left_ = register_parameter("raw_slopes_left", initial());
      raw_right_ = register_parameter("raw_slopes_right", initial());
    }
  }

  AttentionBias bias(const LayerInput& at) override {
    const int64_t set = options_.shared_across_layers ? 0 : at.layer;
    auto left = torch::softplus(raw_left_[set]);  // (H,)
    const auto heads = left.size(0);
    if (causal_) return AttentionBias::linear_causal(left).at_positions(at.positions.sampled);
    auto right = torch::softplus(raw_right_[set]);  // (H,)
    return AttentionBias::linear(left, right, torch::ones({heads}, torch::kBool),
                                 torch::ones({heads}, torch::kBool))
        .at_positions(at.positions.sampled);
  }

  // "slope[h]" (causal) or "slope_left[h]" and "slope_right[h]", prefixed "layer<l>." when
  // the layers have their own slopes.
  std::vector<std::pair<std::string, double>> log_values() const override {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<std::string, double>> out;
    auto add = [&](const std::string& name, const torch::Tensor& raw) {
      auto slopes = torch::softplus(raw).to(torch::kCPU, torch::kFloat64);  // (sets, H)
      for (int64_t s = 0; s < slopes.size(0); ++s) {
        const std::string layer =
            options_.shared_across_layers ? "" : "layer" + std::to_string(s) + ".";
        for (int64_t h = 0; h < slopes.size(1); ++h)
          out.emplace_back(layer + name + "[" + std::to_string(h) + "]",
                           slopes[s][h].item<double>());
      }
    };
    if (causal_) {
      add("slope", raw_left_);
    } else {
      add("slope_left", raw_left_);
      add("slope_right", raw_right_);
    }
    return out;
  }

 private:
  AlibiLearnedOptions options_;
  bool causal_;
  torch::Tensor raw_left_;   // (sets, H): slope = softplus(raw); the only set when causal
  torch::Tensor raw_right_;  // (sets, H), bidirectional only
};

PositionInfo make_alibi_learned_info() {
  PositionInfo info;
  info.name = "alibi_learned";
  info.description =
      "ALiBi with trainable positive slopes (left and right when bidirectional)";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.randomizable = true;  // distances between the sampled positions
  info.tensors =
      "causal: position.raw_slopes (S, H); bidirectional: position.raw_slopes_left and "
      "position.raw_slopes_right (S, H). slope = softplus(raw). S = 1 when "
      "shared_across_layers (every layer uses row 0), else S = layers (layer l uses row l)";
  info.options = document_options<AlibiLearnedOptions>();
  info.factory = factory_for<AlibiLearned, AlibiLearnedOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(alibi_learned, extrap::make_alibi_learned_info);
