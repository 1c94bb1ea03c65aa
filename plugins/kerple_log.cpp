// `kerple_log`: an example plugin, not part of the ALiBi paper. KERPLE's logarithmic bias
// (Chi et al., 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
// Extrapolation"): score(i, j) gets
//     -r1_h * log(1 + r2_h * |i - j|)
// with r1 and r2 learned per head and kept positive as softplus(raw). In causal attention
// only keys j <= i matter (the causal mask removes the rest); bidirectional attention uses
// the same kernel on both sides. Initially r1 = 1 and r2 = the ALiBi slopes, so each head
// starts ALiBi-like at short range (r2 * |i - j| small) and logarithmic at long range.
//
// Built as its own shared object by plugins/CMakeLists.txt and loaded with
// PositionRegistry::load_plugin(); it shows that a method outside the library needs only
// this file: the class, its options, EXTRAP_REGISTER_POSITION and EXTRAP_PLUGIN().
#include "positions/alibi_slopes.h"
#include "positions/position.h"

#include <cmath>
#include <vector>

namespace extrap {
namespace {

struct KerpleLogOptions {
  bool shared_across_layers = true;
  void read(const OptionReader& r) {
    r.read("shared_across_layers", shared_across_layers,
           "one (r1, r2) per head for all layers; false: one per layer");
  }
};

// softplus^-1(y) = log(expm1(y)), for initialising raw parameters to a chosen value.
torch::Tensor inverse_softplus(const std::vector<double>& values) {
  std::vector<double> raw;
  for (double y : values) raw.push_back(std::log(std::expm1(y)));
  return torch::tensor(raw, torch::kFloat64).to(torch::kFloat32);
}

class KerpleLog : public PositionMethod {
 public:
  KerpleLog(const PositionContext& context, KerpleLogOptions options) : options_(options) {
    const int64_t sets = options.shared_across_layers ? 1 : context.num_layers;
    const int64_t heads = context.num_heads;
    raw_r1_ = register_parameter(
        "raw_r1", inverse_softplus(std::vector<double>(heads, 1.0)).unsqueeze(0).repeat({sets, 1}));
    raw_r2_ = register_parameter(
        "raw_r2", inverse_softplus(alibi_slopes(int(heads))).unsqueeze(0).repeat({sets, 1}));
  }

  AttentionBias bias(int64_t layer, int64_t, int64_t) override {
    const int64_t set = options_.shared_across_layers ? 0 : layer;
    auto r1 = torch::softplus(raw_r1_[set]).view({-1, 1, 1});  // (H, 1, 1)
    auto r2 = torch::softplus(raw_r2_[set]).view({-1, 1, 1});  // (H, 1, 1)
    return AttentionBias::dense_blocks([r1, r2](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
      auto options = r1.options().requires_grad(false);
      auto i = torch::arange(q0, q1, options).view({1, -1, 1});  // (1, Tq, 1)
      auto j = torch::arange(k0, k1, options).view({1, 1, -1});  // (1, 1, Tk)
      return -r1 * torch::log1p(r2 * (i - j).abs());            // (H, Tq, Tk)
    });
  }

  std::vector<std::pair<std::string, double>> log_values() const override {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<std::string, double>> out;
    auto r1 = torch::softplus(raw_r1_).to(torch::kCPU, torch::kFloat64);  // (sets, H)
    auto r2 = torch::softplus(raw_r2_).to(torch::kCPU, torch::kFloat64);
    for (int64_t s = 0; s < r1.size(0); ++s) {
      const std::string layer =
          options_.shared_across_layers ? "" : "layer" + std::to_string(s) + ".";
      for (int64_t h = 0; h < r1.size(1); ++h) {
        out.emplace_back(layer + "r1[" + std::to_string(h) + "]", r1[s][h].item<double>());
        out.emplace_back(layer + "r2[" + std::to_string(h) + "]", r2[s][h].item<double>());
      }
    }
    return out;
  }

 private:
  KerpleLogOptions options_;
  torch::Tensor raw_r1_;  // (sets, H): r1 = softplus(raw_r1)
  torch::Tensor raw_r2_;  // (sets, H): r2 = softplus(raw_r2)
};

PositionInfo make_kerple_log_info() {
  PositionInfo info;
  info.name = "kerple_log";
  info.description = "example plugin: KERPLE logarithmic bias -r1 * log(1 + r2 * |i - j|)";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.tensors =
      "position.raw_r1 and position.raw_r2 (S, H): r = softplus(raw); S = 1 when "
      "shared_across_layers, else S = layers (layer l uses row l)";
  info.options = document_options<KerpleLogOptions>();
  info.factory = factory_for<KerpleLog, KerpleLogOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(kerple_log, extrap::make_kerple_log_info);
EXTRAP_PLUGIN()
