// What `kerple_log` and `kerple_power` share: two positive parameters per head, r1 and r2,
// kept in range as the KERPLE reference does (chijames/KERPLE, megatron/mpu/layers.py): the
// parameters themselves are clamped in place before each use, so that an optimiser step that
// leaves the range is undone (a projected gradient step), and the bias is computed from the
// clamped values. Initial values are uniform, as in the reference.
#pragma once

#include "positions/distance_bias.h"
#include "positions/position.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace extrap {

struct KerpleRange {
  double init_max;                                       // initial value ~ U[0, init_max), then clamped
  double min = 0.01;
  double max = std::numeric_limits<double>::infinity();
};

struct KerpleOptions {
  bool shared_across_layers = true;
  void read(const OptionReader& r) {
    r.read("shared_across_layers", shared_across_layers,
           "one (r1, r2) per head for all layers, as the reference; false: one per layer");
  }
};

class KerpleParameters {
 public:
  KerpleParameters(torch::nn::Module& owner, const PositionContext& context, bool shared,
                   KerpleRange r1, KerpleRange r2);

  // (H, 1) r1 and r2 of layer `layer`, after clamping the parameters into their range.
  std::pair<torch::Tensor, torch::Tensor> at_layer(int64_t layer);

  // "r1[h]", "r2[h]", prefixed "layer<l>." when the layers have their own values.
  std::vector<std::pair<std::string, double>> log_values() const;

 private:
  bool shared_;
  KerpleRange range1_, range2_;
  torch::Tensor r1_, r2_;  // (S, H)
};

}  // namespace extrap
