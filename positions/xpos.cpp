// `xpos`: rotary embeddings with an exponential decay per rotated pair (xPos, Sun et al., 2022,
// "A Length-Extrapolatable Transformer"; torchscale's xpos_relative_position.py). q and k are
// rotated exactly as `rotary` rotates them (the first d = fraction * d_head dimensions, pairs as
// `pairing` says: positions/rotation.h), and pair k = 0 .. d/2 - 1 is also scaled: the query at
// position n by zeta_k^(n / scale_base) and the key at position n by zeta_k^(-n / scale_base), with
//     zeta_k = (2k + gamma d) / ((1 + gamma) d),   gamma = 0.4, scale_base = 512,
// so that q_i . k_j carries zeta_k^((i - j) / scale_base) <= 1 for j <= i: attention to far
// keys decays smoothly, per frequency. The scale depends on i - j only: positions are counted
// from the middle of the window before scaling (as torchscale does), which changes nothing in
// q . k but keeps zeta^(+-n / 512) inside fp32's range at long windows. A sequence decoded
// block by block with a KV cache gives one centre for all its blocks (TokenPositions::centre).
//
// Causal only: for j > i the factor would grow without bound, so bidirectional attention is
// refused (use `rotary`).
#include "positions/rotation.h"

#include <cmath>

namespace extrap {
namespace {

struct XposOptions {
  double base = 10000.0;
  double scale_base = 512.0;
  double gamma = 0.4;
  double fraction = 1.0;
  RotaryPairing pairing = RotaryPairing::interleaved;
  void read(const OptionReader& r) {
    r.read("base", base, "wavelength base of the rotation angles (as rotary)");
    r.read("scale_base", scale_base, "positions are divided by this in the decay exponent");
    r.read("gamma", gamma, "zeta_k = (2k + gamma d) / ((1 + gamma) d)");
    r.read("fraction", fraction,
           "fraction of each head's dimensions that rotate and decay (rounded down to an even count), as rotary's");
    read_pairing(r, pairing);
    if (!r.decoding()) return;
    r.above("base", base, 1);
    r.above("scale_base", scale_base, 0);
    r.above("gamma", gamma, 0);
    r.in_range("fraction", fraction, 0, 1, "(]");
  }
};

class Xpos : public PositionMethod {
 public:
  Xpos(const PositionContext& context, XposOptions options)
      : options_(options), d_head_(context.d_head) {
    if (d_head_ % 2 != 0)
      throw ConfigError("xpos: the head size " + std::to_string(d_head_) +
                        " is odd; xPos rotates and scales pairs of dimensions");
    rotated_ = rotated_dimensions(options.fraction, d_head_);
    if (rotated_ < 2)
      throw ConfigError("xpos: fraction " + number_text(options.fraction) + " of the head size " +
                        std::to_string(d_head_) + " rotates no pair of dimensions");
  }

  void rotate_qk(torch::Tensor& q, torch::Tensor& k, const LayerInput& at) override {
    TORCH_CHECK(q.size(-1) == d_head_ && k.size(-1) == d_head_, "xpos: expected heads of size ",
                d_head_, ", got q ", q.sizes(), " and k ", k.sizes());
    // Rotation then scale, as one scaled rotation: (T, d/2) tables for q and for k.
    const auto tables = tables_.get(at.positions, q.device(), q.scalar_type(), [&] {
      auto [cos, sin] =
          scaled_rotary_angles(at.positions, rotated_, options_.base, tables_.scaling());
      auto [up, down] = scales(at.positions);
      return std::vector<torch::Tensor>{cos * up, sin * up, cos * down, sin * down};
    });
    q = rotate_pairs(q, tables[0], tables[1], rotated_, options_.pairing);
    k = rotate_pairs(k, tables[2], tables[3], rotated_, options_.pairing);
  }

  // The rotation's frequencies scale (and yarn's factor multiplies both tables); the decay
  // zeta^(n / scale_base) does not change.
  bool set_rope_scaling(const RopeScaling& scaling) override {
    tables_.set_scaling(scaling);
    return true;
  }

 private:
  // zeta_k^(+-(n - centre) / scale_base) for the window's positions n: (T, d/2) each, float64.
  std::pair<torch::Tensor, torch::Tensor> scales(const TokenPositions& positions) const {
    auto n = positions.values(torch::kFloat64);  // (T,), on the CPU
    const double centre = positions.centre >= 0
                              ? double(positions.centre)
                              : std::floor((n[0].item<double>() + n[-1].item<double>()) / 2.0);
    auto k = torch::arange(0, rotated_ / 2, torch::kFloat64);
    auto log_zeta = torch::log((2.0 * k + options_.gamma * double(rotated_)) /
                               ((1.0 + options_.gamma) * double(rotated_)));  // (d/2,)
    auto exponent = ((n - centre) / options_.scale_base).unsqueeze(1) * log_zeta.unsqueeze(0);
    return {exponent.exp(), (-exponent).exp()};
  }

  XposOptions options_;
  int64_t d_head_;
  int64_t rotated_;  // d: even, in [2, d_head]
  RotationTables tables_;
};

PositionInfo make_xpos_info() {
  PositionInfo info;
  info.name = "xpos";
  info.description =
      "xPos: rotary with a per-pair exponential decay zeta^((i - j) / 512) (Sun et al., 2022)";
  info.hooks = kRotateQK;
  info.modes = kCausal;
  info.randomizable = true;
  info.rope_scaling = true;
  info.bidirectional_alternative = "rotary";
  info.mode_reason = "its scale zeta^((i - j) / scale_base) decays towards earlier keys and "
                     "would grow without bound towards later ones";
  info.options = document_options<XposOptions>();
  info.factory = factory_for<Xpos, XposOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(xpos, extrap::make_xpos_info);
