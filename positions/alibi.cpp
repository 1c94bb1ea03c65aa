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
    auto b = AttentionBias::linear_causal(slopes_);
    b.paper_slopes = holds_paper_slopes();
    return b.at_positions(at.positions.sampled);
  }

 private:
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
