// `sandwich`: the parameter-free bias of Chi et al., 2023 ("Dissecting Transformer Length
// Extrapolation via the Lens of Receptive Field Analysis"; NVIDIA NeMo's
// sandwich_relative_position_embedding.py): the inner product of two sinusoidal position
// embeddings, shifted to 0 at distance 0 and scaled down more for later heads. With d the head
// size, w_k = 10000^(-2k / d) for k = 1 .. d/2 and heads h = 1 .. H:
//     bias_h(i, j) = (sum_k cos(|i - j| * w_k) - d/2) / (8h / H)
// It is 0 on the diagonal, at most 0 elsewhere, symmetric in i - j (so bidirectional attention
// uses it on both sides), the same in every layer, and translation-invariant.
#include "positions/distance_bias.h"
#include "positions/position.h"

#include <cmath>

namespace extrap {
namespace {

struct SandwichOptions {
  double base = 10000.0;
  double scale = 8.0;
  void read(const OptionReader& r) {
    r.read("base", base, "wavelength base of the sinusoids (w_k = base^(-2k / d))");
    r.read("scale", scale, "head h (1..H) divides its bias by scale * h / H");
    if (!r.decoding()) return;
    r.above("base", base, 1);
    r.above("scale", scale, 0);
  }
};

class Sandwich : public PositionMethod {
 public:
  Sandwich(const PositionContext& context, SandwichOptions options)
      : options_(options), heads_(context.num_heads), d_head_(context.d_head) {
    if (d_head_ < 2) throw ConfigError("sandwich: the head size must be at least 2");
  }

  AttentionBias bias(const LayerInput&) override {
    const double base = options_.base, scale = options_.scale;
    const int64_t heads = heads_, d = d_head_;
    return AttentionBias::dense_by_offset(distance_bias_offsets(
        torch::kCPU, [=](const torch::Tensor& distance) {  // (R,) -> (H, R), in float64
          auto k = torch::arange(1, d / 2 + 1, torch::kFloat64);  // (d/2,)
          auto w = torch::exp(k * (-2.0 * std::log(base) / double(d)));
          auto kernel = torch::cos(distance.to(torch::kFloat64).unsqueeze(1) * w.unsqueeze(0)).sum(1) -
                        double(d / 2);                                          // (R,)
          auto h = torch::arange(1, heads + 1, torch::kFloat64).unsqueeze(1);  // (H, 1)
          return (kernel.unsqueeze(0) / (scale * h / double(heads))).to(torch::kFloat32);
        }));
  }

 private:
  SandwichOptions options_;
  int64_t heads_, d_head_;
};

PositionInfo make_sandwich_info() {
  PositionInfo info;
  info.name = "sandwich";
  info.description =
      "Sandwich: parameter-free bias from the inner product of sinusoidal embeddings, scaled per head";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.options = document_options<SandwichOptions>();
  info.factory = factory_for<Sandwich, SandwichOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(sandwich, extrap::make_sandwich_info);
