// `rotary`: rotary position embeddings (RoPE, Su et al., 2021), applied to q and k in every
// layer: pair i of a head, the complex number x[a] + i x[b], is multiplied at position p by
// exp(i p theta_i), theta_i = base^(-2i / d_rot), i = 0 .. d_rot/2 - 1. `pairing` says which
// dimensions pair (positions/rotation.h): interleaved (2i, 2i+1, the default) or half (i, i +
// d_rot/2, GPT-NeoX's and Llama's).
//
// Only the first d_rot = fraction * d_head dimensions (rounded down to an even count; GPT-NeoX's
// rotary_pct) rotate; the rest pass through unchanged.
//
// `scaling` builds a RoPE scaling into the model (a released checkpoint's rope_scaling, which
// `extrap import` maps here): linear, ntk, dynamic, yarn, yarn_paper, llama3 or longrope with its factor,
// original length and the kind's own options, by the formulas of positions/rotation.h, in every
// forward pass. Such a model refuses evaluation-time scaling on top (`extrap eval --rope-scaling`
// other than none): the two would compound. Because q_p . k_p' depends on p - p' only, the scores are
// translation-invariant: the same window at any offset gives the same attention.
#include "positions/rotation.h"

#include <cmath>

namespace extrap {
namespace {

struct RotaryOptions {
  double base = 10000.0;
  double fraction = 1.0;
  RotaryPairing pairing = RotaryPairing::interleaved;
  std::string scaling = "none";
  double scaling_factor = 1.0;
  int64_t scaling_length = 0;
  double beta_fast = 32.0, beta_slow = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  std::vector<double> short_factor, long_factor;
  double attention_factor = 0;
  void read(const OptionReader& r) {
    r.read("base", base, "wavelength base of the rotation angles");
    r.read("fraction", fraction,
           "fraction of each head's dimensions that rotate (rounded down to an even count)");
    read_pairing(r, pairing);
    r.read("scaling", scaling,
           "a RoPE scaling built into the model (a released checkpoint's rope_scaling): none, linear, ntk, dynamic, "
           "yarn, yarn_paper, llama3 or longrope");
    r.read("scaling_factor", scaling_factor, "scaling: its factor s");
    r.read("scaling_length", scaling_length, "scaling: the original training length L (dynamic, yarn, llama3, longrope)");
    r.read("beta_fast", beta_fast, "scaling yarn: beta_fast");
    r.read("beta_slow", beta_slow, "scaling yarn: beta_slow");
    r.read("low_freq_factor", low_freq_factor, "scaling llama3: low_freq_factor");
    r.read("high_freq_factor", high_freq_factor, "scaling llama3: high_freq_factor");
    r.read("short_factor", short_factor,
           "scaling longrope: each rotated pair's frequency divided by its factor while the window ends at or before "
           "L (one a pair)");
    r.read("long_factor", long_factor, "scaling longrope: the same past L");
    r.read("attention_factor", attention_factor,
           "scaling longrope: cos and sin multiplied by it (0: sqrt(1 + ln s / ln L) for s > 1, else 1)");
    if (!r.decoding()) return;
    r.above("base", base, 1);
    r.in_range("fraction", fraction, 0, 1, "(]");
    if (scaling == "self_extend")
      r.fail("scaling", "self_extend moves positions at evaluation (extrap eval --rope-scaling self_extend)");
    built_in();  // refuses a scaling that cannot be applied, naming it
  }
  // The scaling built in (kind none: nothing).
  RopeScaling built_in() const {
    RopeScaling s;
    s.kind = parse_rope_scaling(scaling, "position.scaling");
    if (!s.active()) return s;
    s.factor = scaling_factor;
    s.original_length = scaling_length;
    s.beta_fast = beta_fast;
    s.beta_slow = beta_slow;
    s.low_freq_factor = low_freq_factor;
    s.high_freq_factor = high_freq_factor;
    s.short_factor = short_factor;
    s.long_factor = long_factor;
    s.attention_factor = attention_factor;
    check_rope_scaling(s);
    return s;
  }
};

class Rotary : public PositionMethod {
 public:
  Rotary(const PositionContext& context, RotaryOptions options) : options_(options) {
    rotated_ = rotated_dimensions(options.fraction, context.d_head);
    if (rotated_ < 2)
      throw ConfigError("rotary: fraction " + std::to_string(options.fraction) + " of d_head " +
                        std::to_string(context.d_head) + " rotates no pair of dimensions");
    built_in_ = options.built_in();
    if (built_in_.active()) tables_.set_scaling(built_in_);
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
    if (built_in_.active() && scaling.active())
      throw ConfigError("RoPE scaling " + rope_scaling_name(scaling.kind) + ": the model has RoPE scaling " +
                        rope_scaling_name(built_in_.kind) + " built in (position.scaling, as its checkpoint's "
                        "rope_scaling), and the two would compound; evaluate it with --rope-scaling none");
    tables_.set_scaling(scaling.active() ? scaling : built_in_);
    return true;
  }

 private:
  RotaryOptions options_;
  RopeScaling built_in_;  // position.scaling (none: the plain angles)
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
