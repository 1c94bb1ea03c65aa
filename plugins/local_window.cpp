// `local_window`: an example plugin. Windowed (local) attention: each query sees only the keys
// within `window` positions of it, |i - j| < window, and nothing farther; inside the window no
// position information at all. A classic baseline for length extrapolation (Beltagy et al.,
// 2020, Longformer; the ALiBi paper's discussion of local attention): it extrapolates by
// construction, since no query ever sees more than it saw in training, and it shows what a
// method gains by using more than that context.
//
// Per-head windows may differ: head h uses window * 2^(h * spread / (H - 1)) when spread > 0,
// so the heads cover several scales.
//
// Built as its own shared object by plugins/CMakeLists.txt and loaded with `--plugin` (or
// `plugins:` in a config); it shows that a method outside the library needs only this file:
// the class, its options, EXTRAP_REGISTER_POSITION and EXTRAP_PLUGIN().
#include "positions/position.h"

#include <cmath>
#include <limits>
#include <vector>

namespace extrap {
namespace {

struct LocalWindowOptions {
  int64_t window = 64;
  double spread = 0.0;
  void read(const OptionReader& r) {
    r.read("window", window, "keys with |i - j| < window are visible (head 0's window)");
    r.read("spread", spread, "head h's window is window * 2^(h * spread / (H - 1)); 0: all equal");
    if (!r.decoding()) return;
    r.at_least("window", window, 1);
    r.in_range("spread", spread, 0, 20, "[]");
  }
};

class LocalWindow : public PositionMethod {
 public:
  LocalWindow(const PositionContext& context, LocalWindowOptions options) {
    std::vector<double> per_head;
    for (int64_t h = 0; h < context.num_heads; ++h) {
      const double exponent =
          context.num_heads > 1 ? double(h) * options.spread / double(context.num_heads - 1) : 0.0;
      per_head.push_back(std::floor(double(options.window) * std::exp2(exponent)));
    }
    windows_ = register_buffer("windows", torch::tensor(per_head, torch::kFloat64).to(torch::kFloat32));
  }

  AttentionBias bias(const LayerInput&) override {
    auto windows = windows_.view({-1, 1, 1});  // (H, 1, 1)
    return AttentionBias::dense_blocks([windows](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
      auto options = windows.options();
      auto i = torch::arange(q0, q1, options).view({1, -1, 1});  // (1, Tq, 1)
      auto j = torch::arange(k0, k1, options).view({1, 1, -1});  // (1, 1, Tk)
      auto outside = (i - j).abs() >= windows;                    // (H, Tq, Tk)
      return torch::zeros(outside.sizes(), options)
          .masked_fill(outside, -std::numeric_limits<float>::infinity());
    });
  }

 private:
  torch::Tensor windows_;  // (H,)
};

PositionInfo make_local_window_info() {
  PositionInfo info;
  info.name = "local_window";
  info.description = "example plugin: windowed attention, keys with |i - j| < window only";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.tensors = "position.windows (H): head h sees keys with |i - j| < windows[h] (a buffer)";
  info.options = document_options<LocalWindowOptions>();
  info.factory = factory_for<LocalWindow, LocalWindowOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(local_window, extrap::make_local_window_info);
EXTRAP_PLUGIN()
