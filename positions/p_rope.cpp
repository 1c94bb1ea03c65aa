// `p_rope`: p-RoPE (Barbero et al., ICLR 2025, "Round and Round We Go! What makes Rotary
// Positional Encodings useful?"): rotary on the highest-frequency fraction p of the pairs only.
// With d = d_head and theta_i = base^(-2i / d), i = 0 .. d/2 - 1 (rotary's frequencies over the
// whole head), the pairs (2i, 2i+1) with i < m = floor(p d / 2) rotate by p theta_i at position p,
// and the lowest-frequency d/2 - m pairs are left unrotated: they carry semantics, not position,
// at any distance. p = 1 is rotary, p = 0 is NoPE (none).
//
// Unlike rotary's `fraction`, which rotates the first dimensions with the whole range of
// frequencies squeezed into them, p-RoPE keeps rotary's frequencies and drops the lowest ones.
// Evaluation-time RoPE scaling applies to the frequencies kept. With `pairing: half` pair i is
// the dimensions (i, i + d/2), as a Hugging Face model pairs them: the pairs i < m rotate.
#include "positions/rotation.h"

#include <cmath>

namespace extrap {
namespace {

struct PRopeOptions {
  double base = 10000.0;
  double keep = 0.75;
  RotaryPairing pairing = RotaryPairing::interleaved;
  void read(const OptionReader& r) {
    r.read("base", base, "wavelength base of the rotation angles (over the whole head, as rotary's)");
    r.read("keep", keep, "p: the fraction of pairs that rotate, the highest frequencies (0: NoPE, 1: rotary)");
    read_pairing(r, pairing);
    if (!r.decoding()) return;
    r.above("base", base, 1);
    r.in_range("keep", keep, 0, 1, "[]");
  }
};

class PRope : public PositionMethod {
 public:
  PRope(const PositionContext& context, PRopeOptions options)
      : options_(options), d_head_(context.d_head) {
    if (d_head_ % 2 != 0)
      throw ConfigError("p_rope: d_head " + std::to_string(d_head_) + " is odd; rotary pairs need an even head size");
    // The 1e-9 keeps e.g. 0.3 * 10 from flooring to 2.
    kept_ = int64_t(std::floor(options.keep * double(d_head_ / 2) + 1e-9));
  }

  void rotate_qk(torch::Tensor& q, torch::Tensor& k, const LayerInput& at) override {
    if (kept_ == 0) return;  // p = 0: nothing rotates
    TORCH_CHECK(q.size(-1) == d_head_ && k.size(-1) == d_head_, "p_rope: expected heads of ", d_head_,
                " dimensions, got q ", q.sizes(), " and k ", k.sizes());
    const bool half = options_.pairing == RotaryPairing::half;
    const auto tables = tables_.get(at.positions, q.device(), q.scalar_type(), [&] {
      // The whole head's frequencies (scaled where an evaluation asks), the highest m kept.
      auto [cos, sin] = scaled_rotary_angles(at.positions, d_head_, options_.base, tables_.scaling(), kept_);
      if (half) {  // every pair (i, i + d/2) of the head, the unkept ones at angle 0: cos 1, sin 0 (exactly unrotated)
        const int64_t rest = d_head_ / 2 - kept_;
        cos = torch::cat({cos, torch::ones({cos.size(0), rest}, cos.options())}, 1);
        sin = torch::cat({sin, torch::zeros({sin.size(0), rest}, sin.options())}, 1);
      }
      return std::vector<torch::Tensor>{cos, sin};  // (T, m) each, (T, d/2) with half pairs
    });
    const int64_t rotated = half ? d_head_ : 2 * kept_;
    q = rotate_pairs(q, tables[0], tables[1], rotated, options_.pairing);
    k = rotate_pairs(k, tables[0], tables[1], rotated, options_.pairing);
  }

  bool set_rope_scaling(const RopeScaling& scaling) override {
    tables_.set_scaling(scaling);
    return true;
  }

 private:
  PRopeOptions options_;
  int64_t d_head_;
  int64_t kept_;  // m: pairs that rotate, in [0, d_head / 2]
  RotationTables tables_;
};

PositionInfo make_p_rope_info() {
  PositionInfo info;
  info.name = "p_rope";
  info.description = "p-RoPE: rotary on the highest-frequency fraction p of the pairs, the rest unrotated "
                     "(Barbero et al., 2025)";
  info.hooks = kRotateQK;
  info.modes = kCausal | kBidirectional;
  info.randomizable = true;
  info.rope_scaling = true;
  info.options = document_options<PRopeOptions>();
  info.factory = factory_for<PRope, PRopeOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(p_rope, extrap::make_p_rope_info);
