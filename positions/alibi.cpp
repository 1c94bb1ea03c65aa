// `alibi`: causal ALiBi (Press et al., 2022). Score(i, j) gets -m_h * (i - j) for j <= i;
// later keys are masked by the causal attention. Slopes are fixed (positions/alibi_slopes.h)
// and described to the attention as slopes, so no backend needs an N x N bias tensor.
//
// Released families that compute the bias in lower precision (../shared/REFERENCE.md, "Released
// families") are followed by name, not approximated: with `round_to` bfloat16 or float16 the
// bias is m_h * j for key position j (from the sequence's first token), rounded to that dtype,
// as BLOOM computes it in a half-precision run; `round_slopes` rounds m_h to bfloat16 first, as
// Falcon does whatever its dtype; `bias_scale` multiplies the bias (Falcon's SDPA path divides
// it by sqrt(d_head) with the scores). The row's constant -m_h i of the paper's form is dropped,
// which the softmax does not see; the rounded bias is no longer linear in i - j, so it is
// described to the attention as a dense bias (the reference and memory-efficient paths).
#include "positions/alibi_slopes.h"
#include "positions/position.h"

#include <cmath>
#include <optional>

namespace extrap {
namespace {

struct AlibiOptions {
  std::string round_to = "none";
  bool round_slopes = false;
  double bias_scale = 1.0;
  void read(const OptionReader& r) {
    r.read("round_to", round_to,
           "none (the exact bias), or bfloat16 / float16: m_h j rounded to that dtype, as BLOOM and Falcon compute it "
           "(released checkpoints)");
    r.read("round_slopes", round_slopes, "round the slopes, and each m_h j, to bfloat16 (Falcon, whatever its dtype)");
    r.read("bias_scale", bias_scale, "multiply the bias (Falcon divides it by sqrt(d_head))");
    if (!r.decoding()) return;
    if (round_to != "none" && round_to != "bfloat16" && round_to != "float16")
      r.fail("round_to", "\"" + round_to + "\" is not one of none, bfloat16, float16");
    if (!(bias_scale > 0) || !std::isfinite(bias_scale))
      r.fail("bias_scale", "must be a finite number above 0, got " + number_text(bias_scale));
  }
  bool rounded() const { return round_to != "none" || round_slopes; }
};

class Alibi : public PositionMethod {
 public:
  Alibi(const PositionContext& context, AlibiOptions options) : options_(std::move(options)) {
    auto values = alibi_slopes(int(context.num_heads));
    slopes_ = register_buffer("slopes", torch::tensor(values, torch::kFloat64).to(torch::kFloat32));
  }

  AttentionBias bias(const LayerInput& at) override {
    if (options_.rounded()) return rounded_bias(at);
    if (options_.bias_scale != 1.0)
      return AttentionBias::linear_causal(slopes_ * options_.bias_scale).at_positions(at.positions.sampled);
    auto b = AttentionBias::linear_causal(slopes_);
    b.paper_slopes = holds_paper_slopes();
    return b.at_positions(at.positions.sampled);
  }

 private:
  // round(m_h j) (times bias_scale) for key position j, the same down every query's row.
  AttentionBias rounded_bias(const LayerInput& at) const {
    if (at.positions.sampled.defined())
      throw ConfigError("alibi: round_to and round_slopes (a released checkpoint's rounding) take contiguous "
                        "positions, not sampled ones");
    const int64_t first_key = at.positions.offset + at.length() - at.key_length();
    const auto slopes = options_.round_slopes ? slopes_.to(torch::kBFloat16).to(torch::kFloat32) : slopes_;
    const auto dtype = options_.round_to == "bfloat16"  ? std::optional<torch::ScalarType>(torch::kBFloat16)
                       : options_.round_to == "float16" ? std::optional<torch::ScalarType>(torch::kFloat16)
                                                        : std::nullopt;
    const double scale = options_.bias_scale;
    const bool bf16_product = options_.round_slopes;  // by value: the bias may outlive this method
    return AttentionBias::dense_blocks([=](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
      const auto j = torch::arange(first_key + k0, first_key + k1, slopes.options().requires_grad(false));
      auto b = slopes.detach().view({-1, 1}) * j.view({1, -1});  // (H, Tk), float32 as the families compute it
      if (bf16_product) b = b.to(torch::kBFloat16).to(torch::kFloat32);  // Falcon's bf16 product
      if (dtype) b = b.to(*dtype).to(torch::kFloat32);
      if (scale != 1.0) b = b * scale;
      return b.unsqueeze(1).expand({b.size(0), q1 - q0, k1 - k0});
    });
  }

  // Whether the buffer still holds the paper's slopes (a checkpoint or a plugin may have written
  // others): read back once per version of the buffer and device, so a step (or its CUDA graph
  // capture) after the first reads nothing from the device.
  bool holds_paper_slopes() {
    if (slopes_._version() != checked_version_ || slopes_.device() != checked_device_) {
      const auto paper = torch::tensor(alibi_slopes(int(slopes_.size(0))), torch::kFloat64).to(torch::kFloat32);
      paper_ = !slopes_.requires_grad() && slopes_.scalar_type() == torch::kFloat32 &&
               torch::equal(slopes_.detach().cpu(), paper);
      checked_version_ = slopes_._version();
      checked_device_ = slopes_.device();
    }
    return paper_;
  }

  AlibiOptions options_;
  torch::Tensor slopes_;  // (H,)
  int64_t checked_version_ = -1;
  torch::Device checked_device_ = torch::kCPU;
  bool paper_ = false;
};

PositionInfo make_alibi_info() {
  PositionInfo info;
  info.name = "alibi";
  info.description = "causal ALiBi: -m_h * (i - j) with fixed geometric slopes";
  info.hooks = kBias;
  info.modes = kCausal;
  info.randomizable = true;  // distances between the sampled positions
  info.tensors = "position.slopes (H): the fixed slopes m_h (a buffer, not trained)";
  info.bidirectional_alternative = "alibi_symmetric";
  info.factory = factory_for<Alibi, AlibiOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(alibi, extrap::make_alibi_info);
