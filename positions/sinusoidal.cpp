// `sinusoidal`: Vaswani et al.'s fixed embeddings, added to the scaled token embeddings.
//   PE(p, 2i) = sin(p / base^(2i/d)),  PE(p, 2i+1) = cos(p / base^(2i/d))
// Computed on the fly for any positions, so there is no maximum length; takes sampled
// positions (position.randomize_max).
#include "positions/position.h"

#include <cmath>

namespace extrap {

namespace {

// positions: (T,) float64.
torch::Tensor sinusoidal_table(const torch::Tensor& positions, int64_t dim, double base) {
  auto position = positions.unsqueeze(1);                                               // (T, 1)
  auto i = torch::arange(0, (dim + 1) / 2, torch::kFloat64);                             // (d/2,)
  auto inv_freq = torch::exp(i * (-2.0 * std::log(base) / double(dim)));
  auto angles = position * inv_freq.unsqueeze(0);                                       // (T, d/2)
  auto table = torch::stack({angles.sin(), angles.cos()}, -1).flatten(1);              // (T, 2*(d/2))
  return table.narrow(1, 0, dim).to(torch::kFloat32);                                   // (T, d)
}

struct SinusoidalOptions {
  double base = 10000.0;
  void read(const OptionReader& r) { r.read("base", base, "wavelength base"); }
};

class Sinusoidal : public PositionMethod {
 public:
  Sinusoidal(const PositionContext& context, SinusoidalOptions options)
      : d_model_(context.d_model), options_(options) {}

  torch::Tensor embed(const torch::Tensor& x, const TokenPositions& positions) override {
    auto table = sinusoidal_table(positions.values(torch::kFloat64), d_model_, options_.base);  // (T, D)
    return x + table.to(x.device(), x.scalar_type()).unsqueeze(0);
  }

 private:
  int64_t d_model_;
  SinusoidalOptions options_;
};

PositionInfo make_sinusoidal_info() {
  PositionInfo info;
  info.name = "sinusoidal";
  info.description = "fixed sinusoidal embeddings added to the input (Vaswani et al., 2017)";
  info.hooks = kEmbed;
  info.modes = kCausal | kBidirectional;
  info.randomizable = true;
  info.options = document_options<SinusoidalOptions>();
  info.factory = factory_for<Sinusoidal, SinusoidalOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(sinusoidal, extrap::make_sinusoidal_info);
