// `alibi_symmetric`: ALiBi for bidirectional attention (Press et al., 2022, encoder variant).
// Score(i, j) gets -m_h * |i - j| on both sides, with the fixed slopes of positions/alibi_slopes.h.
// Causal attention has its own method, `alibi`.
#include "positions/alibi_slopes.h"
#include "positions/position.h"

namespace extrap {
namespace {

struct AlibiSymmetricOptions {
  void read(const OptionReader&) {}
};

class AlibiSymmetric : public PositionMethod {
 public:
  AlibiSymmetric(const PositionContext& context, AlibiSymmetricOptions) {
    auto values = alibi_slopes(int(context.num_heads));
    slopes_ = register_buffer("slopes", torch::tensor(values, torch::kFloat64).to(torch::kFloat32));
  }

  AttentionBias bias(const LayerInput& at) override {
    return AttentionBias::linear_symmetric(slopes_).at_positions(at.positions.sampled);
  }

 private:
  torch::Tensor slopes_;  // (H,)
};

PositionInfo make_alibi_symmetric_info() {
  PositionInfo info;
  info.name = "alibi_symmetric";
  info.description = "bidirectional ALiBi: -m_h * |i - j| with fixed geometric slopes";
  info.hooks = kBias;
  info.modes = kBidirectional;
  info.randomizable = true;  // distances between the sampled positions
  info.tensors = "position.slopes (H): the fixed slopes m_h (a buffer, not trained)";
  info.causal_alternative = "alibi";
  info.factory = factory_for<AlibiSymmetric, AlibiSymmetricOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(alibi_symmetric, extrap::make_alibi_symmetric_info);
