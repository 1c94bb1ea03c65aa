// `rotary`: rotary position embeddings (RoPE, Su et al., 2021), applied to q and k in every
// layer: pair i of a head, the complex number x[a] + i x[b], is multiplied at position p by
// exp(i p theta_i), theta_i = base^(-2i / d_rot), i = 0 .. d_rot/2 - 1. `pairing` says which
// dimensions pair (positions/rotation.h): interleaved (2i, 2i+1, the default) or half (i, i +
// d_rot/2, GPT-NeoX's and Llama's).
//
// Only the first d_rot = fraction * d_head dimensions (rounded down to an even count; GPT-NeoX's
// rotary_pct) rotate; the rest pass through unchanged. Because q_p . k_p' depends on p - p' only, the scores are
// translation-invariant: the same window at any offset gives the same attention.
#include "positions/rotation.h"

#include <cmath>

namespace extrap {
namespace {

struct RotaryOptions {
  double base = 10000.0;
  double fraction = 1.0;
  RotaryPairing pairing = RotaryPairing::interleaved;
  void read(const OptionReader& r) {
    r.read("base", base, "wavelength base of the rotation angles");
    r.read("fraction", fraction,
           "fraction of each head's dimensions that rotate (rounded down to an even count)");
    read_pairing(r, pairing);
    if (!r.decoding()) return;
    r.above("base", base, 1);
    r.in_range("fraction", fraction, 0, 1, "(]");
  }
};

class Rotary : public PositionMethod {
 public:
  Rotary(const PositionContext& context, RotaryOptions options) : options_(options) {
    // The 1e-9 keeps e.g. 0.3 * 10 from flooring to 2.
    rotated_ = 2 * int64_t(std::floor(options.fraction * double(context.d_head) / 2.0 + 1e-9));
    if (rotated_ < 2)
      throw ConfigError("rotary: fraction " + std::to_string(options.fraction) + " of d_head " +
                        std::to_string(context.d_head) + " rotates no pair of dimensions");
  }

  void rotate_qk(torch::Tensor& q, torch::Tensor& k, const LayerInput& at) override {
    TORCH_CHECK(q.size(-1) >= rotated_ && k.size(-1) == q.size(-1),
                "rotary: expected head dimension of at least ", rotated_, ", got q ", q.sizes(),
                " and k ", k.sizes());
    const auto tables = tables_.get(at.positions, q.device(), q.scalar_type(), [&] {
      auto [cos, sin] =
          scaled_rotary_angles(at.positions, rotated_, options_.base, tables_.scaling());
      return std::vector<torch::Tensor>{cos, sin};  // (T, d_rot/2) each
    });
    q = rotate_pairs(q, tables[0], tables[1], rotated_, options_.pairing);
    k = rotate_pairs(k, tables[0], tables[1], rotated_, options_.pairing);
  }

  bool set_rope_scaling(const RopeScaling& scaling) override {
    tables_.set_scaling(scaling);
    return true;
  }

 private:
  RotaryOptions options_;
  int64_t rotated_;  // d_rot: even, in [2, d_head]
  RotationTables tables_;
};

PositionInfo make_rotary_info() {
  PositionInfo info;
  info.name = "rotary";
  info.description = "rotary embeddings: q and k rotated pairwise by position (Su et al., 2021)";
  info.hooks = kRotateQK;
  info.modes = kCausal | kBidirectional;
  info.randomizable = true;
  info.rope_scaling = true;
  info.options = document_options<RotaryOptions>();
  info.factory = factory_for<Rotary, RotaryOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(rotary, extrap::make_rotary_info);
