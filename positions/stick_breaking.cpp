// `stick_breaking`: stick-breaking attention (Tan et al., ICLR 2025; shawntan/stickbreaking-
// attention). Not a bias: each query breaks a stick of mass 1 from its nearest key leftwards,
// key j taking sigmoid(z_ij) of what the nearer keys left, and gives the rest to its own value
// (core/attention/stick_breaking.h). Order is the position information: no other method.
// Causal only. The reference path trains it; evaluation (the efficient backend, and Auto past
// AttentionOptions::efficient_threshold) computes the same numbers a block of query rows at a
// time. The fused kernels refuse it by name.
#include "positions/position.h"

namespace extrap {
namespace {

struct StickBreakingOptions {
  bool attend_current = false;
  void read(const OptionReader& r) {
    r.read("attend_current", attend_current,
           "the query's own key takes part (j <= i); false, the authors' default: keys before it only (j < i)");
  }
};

class StickBreaking : public PositionMethod {
 public:
  StickBreaking(const PositionContext&, StickBreakingOptions options) : options_(options) {}
  AttentionBias bias(const LayerInput&) override { return AttentionBias::stick_breaking(options_.attend_current); }

 private:
  StickBreakingOptions options_;
};

PositionInfo make_stick_breaking_info() {
  PositionInfo info;
  info.name = "stick_breaking";
  info.description = "stick-breaking attention: sigmoid weights taken nearest key first, no softmax (Tan et al., 2025)";
  info.hooks = kBias;
  info.modes = kCausal;
  info.mode_reason = "the stick is broken from the query leftwards";
  // What the reference path's backward keeps beyond the logits and the weights: log sigmoid(-z),
  // its reversed cumulative sum and the visibility mask, about 3 score-sized tensors. Auto's
  // row-blocked path keeps none (an upper bound, as the estimate's scores are for fused paths).
  info.training_scores = 3;
  info.options = document_options<StickBreakingOptions>();
  info.factory = factory_for<StickBreaking, StickBreakingOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(stick_breaking, extrap::make_stick_breaking_info);
