// `dape`: Data-Adaptive Positional Encoding (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive
// Positional Encoding for Length Extrapolation"; chuanyang-zheng/DAPE). Each layer's logits are
//     A + B + f([A; B])
// with A the H heads' scaled scores q_i . k_j / sqrt(d), B a base bias from another method
// (`base`, ALiBi by default as the reference's AliBi_DAPE, alibi_symmetric when bidirectional;
// kerple_log, fire, ... with their
// options under `base_options`), and f an MLP over the 2H channels of each (i, j) pair:
// Linear(2H, width) -> LeakyReLU(0.01) -> Linear(width, H), one per layer, initialised as
// torch.nn.Linear is (U(+-1/sqrt(fan_in)) for weights and biases). f reads B with its masked
// entries as 0 (the reference's causal ALiBi matrix is 0 above the diagonal); the masks apply
// after. f mixes every head's whole score matrix, so only the reference attention path takes
// it (AttentionBias::Kind::ScoreMixing); the others refuse by name.
#include "positions/position.h"

#include <cmath>

namespace extrap {
namespace {

struct DapeOptions {
  std::string base;  // "": alibi (causal) or alibi_symmetric (bidirectional)
  int64_t mlp_width = 32;
  void read(const OptionReader& r) {
    r.read("base", base, "the base bias B: a method that only adds a bias of positions (kerple_log, fire, ...); "
                         "empty: alibi (causal) or alibi_symmetric (bidirectional)");
    r.read("mlp_width", mlp_width, "hidden units of the MLP 2 x heads -> width -> heads");
    r.section("base_options", "the base method's own options");
    if (r.decoding()) r.at_least("mlp_width", mlp_width, 1);
  }
};

// Rows of f computed at once without gradients (evaluation at long lengths): the hidden layer
// holds rows x keys x width floats per sequence, kept near 2^26 (256 MB).
constexpr int64_t kEvaluationFloats = int64_t(1) << 26;

class Dape : public PositionMethod {
 public:
  Dape(const PositionContext& context, DapeOptions options, const OptionReader& reader)
      : heads_(context.num_heads) {
    auto& registry = PositionRegistry::instance();
    if (options.base.empty()) options.base = context.causal ? "alibi" : "alibi_symmetric";
    if (!registry.contains(options.base)) reader.fail("base", "unknown position method '" + options.base + "'");
    const PositionInfo& info = registry.get(options.base);
    if (!(info.modes & (context.causal ? kCausal : kBidirectional)))
      reader.fail("base", "'" + options.base + "' does not support " + (context.causal ? "causal" : "bidirectional") +
                              " attention");
    if (info.hooks != kBias || info.name == "dape")
      reader.fail("base", "'" + options.base + "' is not a bias of positions alone; DAPE's base B is a method that only "
                          "adds a bias (alibi, kerple_log, kerple_power, fire, t5_bias, sandwich)");
    base_ = register_module("base", registry.create(options.base, context, reader.section("base_options", "")));
    if (base_->sampling().active())
      reader.fail("base_options", "sampled training positions do not apply to DAPE's base");
    if (base_->bias(layer_window(0, 2)).depends_on_input())
      reader.fail("base", "'" + options.base + "' depends on the layer input or on q.k; DAPE's base B is a bias of "
                          "positions alone (alibi, kerple_log, kerple_power, fire, t5_bias, sandwich)");
    const int64_t width = options.mlp_width, layers = context.num_layers;
    auto uniform = [](std::vector<int64_t> shape, double fan_in) {
      const double bound = 1.0 / std::sqrt(fan_in);
      return torch::rand(shape) * (2 * bound) - bound;
    };
    w1_ = register_parameter("w1", uniform({layers, width, 2 * heads_}, double(2 * heads_)));
    b1_ = register_parameter("b1", uniform({layers, width}, double(2 * heads_)));
    w2_ = register_parameter("w2", uniform({layers, heads_, width}, double(width)));
    b2_ = register_parameter("b2", uniform({layers, heads_}, double(width)));
  }

  AttentionBias bias(const LayerInput& at) override {
    TORCH_CHECK(at.layer < w1_.size(0), "dape: layer ", at.layer, " of a method built for ", w1_.size(0), " layers");
    const AttentionBias base = base_->bias(at);
    const int64_t heads = heads_;
    auto w1 = w1_[at.layer], b1 = b1_[at.layer], w2 = w2_[at.layer], b2 = b2_[at.layer];
    return AttentionBias::score_mixing(
        [base, heads](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
          return materialize_bias_block(base, heads, q0, q1, k0, k1, /*causal=*/false);
        },
        [w1, b1, w2, b2](const torch::Tensor& scores, const torch::Tensor& base) {
          // scores (B, H, Tq, Tk), base (H, Tq, Tk) -> f (B, H, Tq, Tk).
          const auto f = [&](const torch::Tensor& a, const torch::Tensor& b) {
            const auto x = torch::cat({a, b.unsqueeze(0).expand_as(a)}, 1).permute({0, 2, 3, 1});  // (B, tq, Tk, 2H)
            const auto hidden = torch::leaky_relu(torch::linear(x, w1.to(x.scalar_type()), b1.to(x.scalar_type())), 0.01);
            return torch::linear(hidden, w2.to(x.scalar_type()), b2.to(x.scalar_type())).permute({0, 3, 1, 2});
          };
          const int64_t rows = scores.size(2), per_row = scores.size(0) * scores.size(3) * w1.size(0);
          if (torch::GradMode::is_enabled() || rows * per_row <= kEvaluationFloats) return f(scores, base);
          const int64_t block = std::max<int64_t>(1, kEvaluationFloats / per_row);
          std::vector<torch::Tensor> parts;
          for (int64_t r = 0; r < rows; r += block) {
            const int64_t n = std::min(block, rows - r);
            parts.push_back(f(scores.narrow(2, r, n), base.narrow(1, r, n)));
          }
          return torch::cat(parts, 2);
        });
  }

  bool set_rope_scaling(const RopeScaling& scaling) override { return base_->set_rope_scaling(scaling); }
  std::vector<std::pair<std::string, double>> log_values() const override {
    auto values = base_->log_values();
    for (auto& [name, value] : values) name = "base." + name;
    return values;
  }

 private:
  int64_t heads_;
  std::shared_ptr<PositionMethod> base_;
  torch::Tensor w1_, b1_;  // (layers, W, 2H), (layers, W): first layer, from [A; B]
  torch::Tensor w2_, b2_;  // (layers, H, W), (layers, H): second layer
};

PositionInfo make_dape_info() {
  PositionInfo info;
  info.name = "dape";
  info.description = "DAPE: logits A + B + MLP([A; B]) over every head's scores and a base bias (Zheng et al., 2024)";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;  // as its base's
  info.reference_only = "its MLP mixes every head's whole score matrix at each (i, j)";
  // What backward keeps beyond the scores: the MLP's input [A; B] (2 score-sized tensors) and its
  // hidden layer before and after the activation (2 x width / H): 10 at 8 heads and width 32.
  info.training_scores = 10;
  info.tensors =
      "position.w1 (layers, W, 2H), position.b1 (layers, W), position.w2 (layers, H, W), position.b2 "
      "(layers, H), and the base method's tensors under position.base.: logits = A + B + f([A; B]) with A the "
      "scaled scores (B, H, T, T), B the base bias (its masked entries 0 inside f), f = w2 leaky_relu(w1 x + b1, "
      "0.01) + b2 over the 2H channels of each (i, j); layer l uses row l";
  info.options = document_options<DapeOptions>();
  info.factory = [](const PositionContext& context, const OptionReader& reader) {
    DapeOptions options;
    options.read(reader);
    return std::make_shared<Dape>(context, options, reader);
  };
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(dape, extrap::make_dape_info);
