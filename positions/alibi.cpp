// `alibi`: causal ALiBi (Press et al., 2022). Score(i, j) gets -m_h * (i - j) for j <= i;
// later keys are masked by the causal attention. Slopes are fixed (positions/alibi_slopes.h)
// and described to the attention as slopes, so no backend needs an N x N bias tensor.
#include "positions/alibi_slopes.h"
#include "positions/position.h"

namespace extrap {
namespace {

struct AlibiOptions {
  void read(const OptionReader&) {}
};

class Alibi : public PositionMethod {
 public:
  Alibi(const PositionContext& context, AlibiOptions) {
    auto values = alibi_slopes(int(context.num_heads));
    slopes_ = register_buffer("slopes", torch::tensor(values, torch::kFloat64).to(torch::kFloat32));
  }

  AttentionBias bias(const LayerInput& at) override {
    return AttentionBias::linear_causal(slopes_).at_positions(at.positions.sampled);
  }

 private:
  torch::Tensor slopes_;  // (H,)
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
