// `fire`: Functional Interpolation for Relative Positions (Li et al., 2023, arXiv 2310.04418).
// A small MLP f: R -> R^H maps a log-transformed, progressively normalised distance to one
// bias per head:
//     bias(i, j) = f( psi(|i - j|) / psi(max(L, i)) ),   psi(x) = log(|c| x + 1)
// with f = Linear(1, width) -> ReLU -> Linear(width, H). c (init 0.1) and the threshold
// L = |L_multiplier| * init_L (multiplier init 1, init_L fixed) are learned, as in the
// paper's listing; eps = 1e-6 is added to the normaliser. Dividing by psi(max(L, i)) maps
// every query's distances into [0, 1] once i passes L, which is how FIRE extrapolates: set
// init_L to the training length. The normaliser uses the query's index i in the window, so
// FIRE is not translation-invariant. Bidirectional attention uses |i - j| on both sides.
// Per layer by default (each layer its own f, c and L), as the reference code.
#include "positions/position.h"

#include <cmath>

namespace extrap {
namespace {

struct FireOptions {
  int64_t mlp_width = 32;
  double init_c = 0.1;
  double init_L = 512.0;
  double eps = 1e-6;
  bool shared_across_layers = false;
  void read(const OptionReader& r) {
    r.read("mlp_width", mlp_width, "hidden units of the MLP 1 -> width -> heads");
    r.read("init_c", init_c, "initial c in psi(x) = log(|c| x + 1)");
    r.read("init_L", init_L, "the threshold L starts here (the training length is a good choice)");
    r.read("eps", eps, "added to the normaliser psi(max(L, i))");
    r.read("shared_across_layers", shared_across_layers,
           "one MLP, c and L for all layers; false (the reference): one per layer");
    if (!r.decoding()) return;
    r.at_least("mlp_width", mlp_width, 1);
    r.above("init_c", init_c, 0);
    r.above("init_L", init_L, 0);
    r.above("eps", eps, 0);
  }
};

class Fire : public PositionMethod {
 public:
  Fire(const PositionContext& context, FireOptions options) : options_(options) {
    const int64_t sets = options.shared_across_layers ? 1 : context.num_layers;
    const int64_t width = options.mlp_width, heads = context.num_heads;
    // torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    auto uniform = [](std::vector<int64_t> shape, double fan_in) {
      const double bound = 1.0 / std::sqrt(fan_in);
      return torch::rand(shape) * (2 * bound) - bound;
    };
    w1_ = register_parameter("w1", uniform({sets, width}, 1.0));
    b1_ = register_parameter("b1", uniform({sets, width}, 1.0));
    w2_ = register_parameter("w2", uniform({sets, heads, width}, double(width)));
    b2_ = register_parameter("b2", uniform({sets, heads}, double(width)));
    c_ = register_parameter("c", torch::full({sets}, options.init_c));
    L_multiplier_ = register_parameter("L_multiplier", torch::ones({sets}));
  }

  AttentionBias bias(const LayerInput& at) override {
    const int64_t set = options_.shared_across_layers ? 0 : at.layer;
    auto w1 = w1_[set], b1 = b1_[set], w2 = w2_[set], b2 = b2_[set];
    auto c = c_[set].abs(), threshold = (L_multiplier_[set] * options_.init_L).abs();
    const double eps = options_.eps;
    return AttentionBias::dense_blocks([=](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
      auto options = w1.options().requires_grad(false);
      auto i = torch::arange(q0, q1, options).view({-1, 1});  // (Tq, 1)
      auto j = torch::arange(k0, k1, options).view({1, -1});  // (1, Tk)
      auto distance = torch::log1p(c * (i - j).abs());                      // (Tq, Tk)
      auto normaliser = torch::log1p(c * torch::maximum(i, threshold)) + eps;  // (Tq, 1)
      auto x = (distance / normaliser).unsqueeze(-1);                         // (Tq, Tk, 1)
      auto hidden = torch::relu(x * w1 + b1);                                 // (Tq, Tk, W)
      auto out = torch::matmul(hidden, w2.t()) + b2;                          // (Tq, Tk, H)
      return out.permute({2, 0, 1});                                          // (H, Tq, Tk)
    });
  }

  std::vector<std::pair<std::string, double>> log_values() const override {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<std::string, double>> out;
    for (int64_t s = 0; s < c_.size(0); ++s) {
      const std::string layer = options_.shared_across_layers ? "" : "layer" + std::to_string(s) + ".";
      out.emplace_back(layer + "c", c_[s].abs().item<double>());
      out.emplace_back(layer + "L", (L_multiplier_[s] * options_.init_L).abs().item<double>());
    }
    return out;
  }

 private:
  FireOptions options_;
  torch::Tensor w1_, b1_;           // (S, W): first layer, from the scalar input
  torch::Tensor w2_, b2_;           // (S, H, W) and (S, H): second layer
  torch::Tensor c_, L_multiplier_;  // (S,)
};

PositionInfo make_fire_info() {
  PositionInfo info;
  info.name = "fire";
  info.description =
      "FIRE: an MLP of the log distance normalised by the query position (Li et al., 2023)";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  // The MLP's (T, T, width) activations: about 32 T x T floats a layer at the default width 32
  // (33 MB at T = 512); more for a wider MLP.
  info.training_pairs = 32;
  info.tensors =
      "position.w1, position.b1 (S, W), position.w2 (S, H, W), position.b2 (S, H), position.c, "
      "position.L_multiplier (S): x = log(|c| |i - j| + 1) / (log(|c| max(i, |L_multiplier| * "
      "init_L) + 1) + eps), bias(i, j)[h] = sum_w w2[h, w] relu(x w1[w] + b1[w]) + b2[h]; S = 1 "
      "when shared_across_layers (row 0 for all), else S = layers (layer l uses row l)";
  info.options = document_options<FireOptions>();
  info.factory = factory_for<Fire, FireOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(fire, extrap::make_fire_info);
