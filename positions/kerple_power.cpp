// `kerple_power`: KERPLE's power kernel (Chi et al., 2022). Score(i, j) gets
//     -r1_h * |i - j|^r2_h,   0 < r2 <= 2
// with r1, r2 learned per head: r1 clamped to >= 0.01, the exponent r2 to [0.01, 2]
// (positions/kerple.h), initialised as the reference does: r1 ~ U[0, 1), r2 ~ U[0, 2). With
// r2 = 1 this is ALiBi with learned slopes. Depends on i - j only: translation-invariant.
#include "positions/kerple.h"

namespace extrap {
namespace {

class KerplePower : public PositionMethod {
 public:
  KerplePower(const PositionContext& context, KerpleOptions options)
      : parameters_(*this, context, options.shared_across_layers, {1.0}, {2.0, 0.01, 2.0}) {}

  AttentionBias bias(const LayerInput& at) override {
    auto [r1, r2] = parameters_.at_layer(at.layer);  // (H, 1)
    // pow(0, r2) is 0 for r2 > 0; its gradient with respect to r2 (0^r2 * log 0) is taken as
    // 0 there, by computing the power on a distance of 1 instead and zeroing the diagonal.
    return AttentionBias::dense_by_offset(distance_bias_offsets(
        r1.device(),
        [r1 = r1, r2 = r2](const torch::Tensor& distance) {
          auto on_diagonal = distance == 0;
          return -r1 * torch::pow(distance.clamp_min(1.0), r2).masked_fill(on_diagonal, 0.0);
        }));
  }

  std::vector<std::pair<std::string, double>> log_values() const override {
    return parameters_.log_values();
  }

 private:
  KerpleParameters parameters_;
};

PositionInfo make_kerple_power_info() {
  PositionInfo info;
  info.name = "kerple_power";
  info.description = "KERPLE power bias -r1 * |i - j|^r2 (0 < r2 <= 2), learned per head";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.tensors =
      "position.r1 and position.r2 (S, H): r1 = clamp(value, min 0.01), r2 = clamp(value, 0.01, "
      "2), bias(i, j) = -r1 * |i - j|^r2 (0 on the diagonal); S = 1 when shared_across_layers, "
      "else S = layers (layer l uses row l)";
  info.options = document_options<KerpleOptions>();
  info.factory = factory_for<KerplePower, KerpleOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(kerple_power, extrap::make_kerple_power_info);
