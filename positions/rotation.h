// Rotation of query and key pairs, shared by `rotary`, `xpos` and `p_rope`.
//
// Pair i of the first d_rot dimensions of a head, the complex number x[a] + i x[b], is multiplied
// at position p by exp(i p theta_i), theta_i = base^(-2i / d_rot), i = 0 .. d_rot/2 - 1; the rest
// pass through unchanged. Which dimensions pair (a method's `pairing` option):
//   interleaved  a = 2i, b = 2i + 1, as the RoFormer paper and torchscale's xPos (the default);
//   half         a = i, b = i + d_rot/2, as GPT-NeoX, Llama and every Hugging Face checkpoint
//                (rotate_half). The two are the same up to a fixed permutation of the head's
//                dimensions, so neither is better, but checkpoints are not interchangeable.
#pragma once

#include "positions/position.h"

#include <cmath>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace extrap {

enum class RotaryPairing { interleaved, half };
template <>
struct EnumNames<RotaryPairing> {
  static constexpr std::array<std::pair<const char*, RotaryPairing>, 2> table{
      {{"interleaved", RotaryPairing::interleaved}, {"half", RotaryPairing::half}}};
};
// A method's `pairing` option (rotary, xpos, p_rope), with its help text.
inline void read_pairing(const OptionReader& r, RotaryPairing& pairing) {
  r.read("pairing", pairing,
         "which dimensions rotate together: interleaved (2i, 2i+1), or half (i, i + d/2: GPT-NeoX, Llama, Hugging "
         "Face checkpoints)");
}

// The dimensions a rotary method with `fraction` rotates of a head of d_head: the largest even
// count at most fraction x d_head (0 when it is below 2). The 1e-9 keeps e.g. 0.3 x 10 from
// flooring to 2. rotary, xpos, and the Hugging Face import and export read it here.
inline int64_t rotated_dimensions(double fraction, int64_t d_head) {
  return 2 * int64_t(std::floor(fraction * double(d_head) / 2.0 + 1e-9));
}

// theta_i = base^(-2i / rotated), i = 0 .. rotated/2 - 1: (rotated/2,) float64.
torch::Tensor rotary_frequencies(int64_t rotated, double base);

// Evaluation-time RoPE scaling (RopeScaling in positions/position.h; ../shared/REFERENCE.md,
// "Evaluation-time RoPE scaling"). With s the factor, d = `rotated`, L the training length and
// theta_k = base^(-2k/d):
//   linear   theta_k / s (positions divided by s: position interpolation)
//   ntk      theta_k from the base b * s^(d / (d - 2))
//   dynamic  at a window ending at position l - 1 with l > L, theta_k from the base
//            b * (s l / L - (s - 1))^(d / (d - 2)); unchanged while l <= L
//   yarn     as Hugging Face transformers and the authors' code (jquesnelle/yarn), which every
//            released YaRN checkpoint is used with: d(n) = d ln(L / (2 pi n)) / (2 ln base), low =
//            max(floor(d(beta_fast)), 0), high = min(ceil(d(beta_slow)), d - 1) (+0.001 if equal),
//            m_k = clamp((k - low) / (high - low), 0, 1), theta'_k = m_k theta_k / s + (1 - m_k)
//            theta_k: a ramp linear over the pair index k;
//   yarn_paper  the paper's formula: r_k = L theta_k / (2 pi), gamma_k = clamp((r_k - beta_slow)
//            / (beta_fast - beta_slow), 0, 1), theta'_k = (1 - gamma_k) theta_k / s + gamma_k
//            theta_k, a ramp linear in r_k. Up to 0.76 apart from yarn's blend at small L.
//            Both multiply cos and sin by 0.1 ln s + 1 (rope_attention_factor), so the scores
//            scale by its square.
//   llama3   wavelength lambda_k = 2 pi / theta_k: above L / low_freq_factor theta_k / s, below
//            L / high_freq_factor theta_k, between the blend (1 - m) theta_k / s + m theta_k with
//            m = (L / lambda_k - low_freq_factor) / (high_freq_factor - low_freq_factor).
//   longrope theta_k / short_factor[k] while the window ends at or before L (l <= L), theta_k /
//            long_factor[k] past it, as transformers picks one set for a forward pass by its last
//            position; cos and sin times attention_factor, or sqrt(1 + ln s / ln L) where it is 0
//            and s > 1 (rope_attention_factor). Phi-3's; the factor lists come from its config.
//   self_extend  theta_k unchanged: Self-Extend moves positions, not frequencies (the model
//            rotates q and k a second time at TokenPositions::grouped positions).
// With d = 2 the only frequency is theta_0 = 1 whatever the base, so ntk and dynamic change
// nothing. (rotated/2,) float64.
torch::Tensor scaled_rotary_frequencies(int64_t rotated, double base, const RopeScaling& scaling,
                                        int64_t current_length);

// The factor cos and sin are multiplied by: 0.1 ln s + 1 for yarn and yarn_paper with s > 1;
// longrope's attention_factor, or sqrt(1 + ln s / ln L) with s > 1; else 1.
double rope_attention_factor(const RopeScaling& scaling);

// One past the last position of the window (the current length l of dynamic NTK).
int64_t window_end(const TokenPositions& positions);

// cos and sin of p * theta_i for the window's positions p: (T, rotated/2) each, float64 on
// the CPU. scaled_rotary_angles: the same with the frequencies of `scaling`
// (scaled_rotary_frequencies, at the window's end) and both tables multiplied by its
// rope_attention_factor; RopeScaling{} gives rotary_angles with the unscaled frequencies. With
// `pairs` >= 0 only the first `pairs` frequencies, the highest (p_rope): (T, pairs) each.
std::pair<torch::Tensor, torch::Tensor> rotary_angles(const TokenPositions& positions,
                                                      const torch::Tensor& frequencies);
std::pair<torch::Tensor, torch::Tensor> scaled_rotary_angles(const TokenPositions& positions,
                                                             int64_t rotated, double base,
                                                             const RopeScaling& scaling, int64_t pairs = -1);

// The tables a rotation needs for one window (rotary: cos and sin; xpos: the same scaled for
// the queries and for the keys). Every layer of a forward pass asks for the same ones, so the
// last contiguous window's are kept; sampled positions (a new sample every training step) are
// computed each time.
class RotationTables {
 public:
  // compute() returns the tables in float64 on the CPU; they come back in `dtype` on `device`.
  std::vector<torch::Tensor> get(const TokenPositions& positions, torch::Device device,
                                 torch::ScalarType dtype,
                                 const std::function<std::vector<torch::Tensor>()>& compute);
  // The evaluation-time scaling the tables are computed under (checked; forgets the kept
  // tables). A method's set_rope_scaling() hands it here.
  void set_scaling(const RopeScaling& scaling);
  const RopeScaling& scaling() const { return scaling_; }

 private:
  std::mutex mutex_;
  int64_t length_ = -1, offset_ = 0, centre_ = -1;
  torch::Device device_ = torch::kCPU;
  torch::ScalarType dtype_ = torch::kFloat32;
  std::vector<torch::Tensor> tables_;
  RopeScaling scaling_;  // none unless an evaluation asks
};

// x: (B, H, T, D). Rotates the pairs of the first `rotated` dimensions, (2i, 2i+1) or (i, i +
// rotated/2) by `pairing`, by the (T, rotated/2) angles given as cos and sin.
torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin, int64_t rotated,
                           RotaryPairing pairing = RotaryPairing::interleaved);

}  // namespace extrap
