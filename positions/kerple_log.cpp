// `kerple_log`: KERPLE's logarithmic kernel (Chi et al., 2022, "KERPLE: Kernelized Relative
// Positional Embedding for Length Extrapolation"). Score(i, j) gets
//     -r1_h * log(1 + r2_h * |i - j|)
// with r1, r2 learned per head, clamped to >= 0.01 (positions/kerple.h), initialised as the
// reference does: r1 ~ U[0, 2), r2 ~ U[0, 1). One set for all layers unless
// shared_across_layers is false. Depends on i - j only: translation-invariant.
#include "positions/kerple.h"

namespace extrap {
namespace {

class KerpleLog : public PositionMethod {
 public:
  KerpleLog(const PositionContext& context, KerpleOptions options)
      : parameters_(*this, context, options.shared_across_layers, {2.0}, {1.0}) {}

  AttentionBias bias(const LayerInput& at) override {
    auto [r1, r2] = parameters_.at_layer(at.layer);  // (H, 1)
    return AttentionBias::dense_by_offset(distance_bias_offsets(
        r1.device(),
        [r1 = r1, r2 = r2](const torch::Tensor& distance) { return -r1 * torch::log1p(r2 * distance); }));
  }

  std::vector<std::pair<std::string, double>> log_values() const override {
    return parameters_.log_values();
  }

 private:
  KerpleParameters parameters_;
};

PositionInfo make_kerple_log_info() {
  PositionInfo info;
  info.name = "kerple_log";
  info.description = "KERPLE logarithmic bias -r1 * log(1 + r2 * |i - j|), learned per head";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.tensors =
      "position.r1 and position.r2 (S, H): r = clamp(value, min 0.01), bias(i, j) = -r1 * "
      "log(1 + r2 * |i - j|); S = 1 when shared_across_layers, else S = layers (layer l uses row l)";
  info.options = document_options<KerpleOptions>();
  info.factory = factory_for<KerpleLog, KerpleOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(kerple_log, extrap::make_kerple_log_info);
