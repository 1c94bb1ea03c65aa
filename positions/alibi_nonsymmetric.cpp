// `alibi_nonsymmetric`: bidirectional ALiBi with direction-split heads (Press et al., 2022).
// The fixed slopes for H/2 heads are used twice: heads [0, H/2) look only left (j <= i),
// heads [H/2, H) only right (j >= i); each gets -m * |i - j| on its allowed side and -inf on
// the other. H must be even.
#include "positions/alibi_slopes.h"
#include "positions/position.h"

namespace extrap {
namespace {

struct AlibiNonsymmetricOptions {
  void read(const OptionReader&) {}
};

class AlibiNonsymmetric : public PositionMethod {
 public:
  AlibiNonsymmetric(const PositionContext& context, AlibiNonsymmetricOptions) {
    const int64_t heads = context.num_heads;
    if (heads < 2 || heads % 2 != 0)
      throw ConfigError("alibi_nonsymmetric splits the heads into a left-looking and a "
                        "right-looking half, so it needs an even number of heads; got H = " +
                        std::to_string(heads));
    auto half = torch::tensor(alibi_slopes(int(heads / 2)), torch::kFloat64).to(torch::kFloat32);
    slopes_ = register_buffer("slopes", torch::cat({half, half}));  // (H,)
    auto first_half = torch::arange(heads) < heads / 2;                 // (H,) bool
    look_left_ = first_half;  // fixed by H, so not state to save
    look_right_ = first_half.logical_not();
  }

  AttentionBias bias(const LayerInput& at) override {
    return AttentionBias::linear(slopes_, slopes_, look_left_, look_right_)
        .at_positions(at.positions.sampled);
  }

 private:
  torch::Tensor slopes_;      // (H,)
  torch::Tensor look_left_;   // (H,) bool, CPU
  torch::Tensor look_right_;  // (H,) bool, CPU
};

PositionInfo make_alibi_nonsymmetric_info() {
  PositionInfo info;
  info.name = "alibi_nonsymmetric";
  info.description =
      "bidirectional ALiBi: half the heads look only left, half only right (H even)";
  info.hooks = kBias;
  info.modes = kBidirectional;
  info.randomizable = true;  // distances between the sampled positions
  info.tensors =
      "position.slopes (H): the H/2-head slopes twice; heads h < H/2 look left, the others right";
  info.causal_alternative = "alibi";
  info.factory = factory_for<AlibiNonsymmetric, AlibiNonsymmetricOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(alibi_nonsymmetric, extrap::make_alibi_nonsymmetric_info);
