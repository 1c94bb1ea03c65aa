// `t5_bias`: T5's learned relative-position bias (Raffel et al., 2020). Each head has one
// trained scalar per relative-distance bucket (positions/t5_buckets.h); score(i, j) gets
// table[bucket(j - i), h]. Causal attention uses one-directional buckets (all keys at or left
// of the query), bidirectional attention two-sided ones (half the buckets per side).
//
// The bias is described by offset (AttentionBias::dense_by_offset): the table's column of each
// offset j - i, with autograd to the table; a backend's tile [q0, q1) x [k0, k1) is those
// columns spread over it. It depends on positions only through j - i, so the method is
// translation-invariant.
#include "positions/position.h"
#include "positions/t5_buckets.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace extrap {

int64_t t5_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                  int64_t max_distance) {
  int64_t bucket = 0;
  int64_t distance = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (relative_position > 0) bucket += num_buckets;
    distance = std::abs(relative_position);
  } else {
    distance = std::max<int64_t>(-relative_position, 0);
  }
  const int64_t max_exact = num_buckets / 2;
  if (distance < max_exact) return bucket + distance;
  // The 1e-9 keeps a distance exactly on a log-spaced boundary from rounding down a bucket.
  const double scaled = std::log(double(distance) / double(max_exact)) /
                        std::log(double(max_distance) / double(max_exact)) *
                        double(num_buckets - max_exact);
  const auto large = max_exact + int64_t(std::floor(scaled + 1e-9));
  return bucket + std::min(large, num_buckets - 1);
}

namespace {

struct T5BiasOptions {
  int64_t buckets = 32;
  int64_t max_distance = 128;
  bool shared_across_layers = true;
  double init_std = 0.02;
  void read(const OptionReader& r) {
    r.read("buckets", buckets, "number of relative-distance buckets (both sides together)");
    r.read("max_distance", max_distance, "distance at which the last, catch-all bucket starts");
    r.read("shared_across_layers", shared_across_layers,
           "one table for all layers (as T5); false: one table per layer");
    r.read("init_std", init_std, "standard deviation of the initial table entries");
    if (!r.decoding()) return;
    if (buckets < 4 || buckets % 2 != 0) r.fail("buckets", "must be even and at least 4");
    if (max_distance <= buckets / 2)
      r.fail("max_distance", "must exceed buckets / 2 (" + std::to_string(buckets / 2) + ")");
    r.at_least("init_std", init_std, 0.0);
  }
};

// The bucket ids of offsets j - i = lo .. hi - 1: one t5_bucket() call each.
torch::Tensor offset_buckets(int64_t lo, int64_t hi, bool bidirectional, int64_t buckets, int64_t max_distance) {
  std::vector<int64_t> per_offset;
  per_offset.reserve(size_t(std::max<int64_t>(hi - lo, 0)));
  for (int64_t r = lo; r < hi; ++r) per_offset.push_back(t5_bucket(r, bidirectional, buckets, max_distance));
  return torch::tensor(per_offset, torch::kLong);  // (hi - lo,)
}

class T5Bias : public PositionMethod {
 public:
  T5Bias(const PositionContext& context, T5BiasOptions options)
      : options_(options), bidirectional_(!context.causal) {
    const int64_t tables = options.shared_across_layers ? 1 : context.num_layers;
    table_ = register_parameter(
        "table", torch::randn({tables, options.buckets, context.num_heads}) * options.init_std);
  }

  AttentionBias bias(const LayerInput& at) override {
    auto table = table_[options_.shared_across_layers ? 0 : at.layer].t();  // (H, buckets)
    const torch::Tensor by_offset = bucket_of_offset(table.device());
    const int64_t reach = options_.max_distance;
    return AttentionBias::dense_by_offset([=](int64_t lo, int64_t hi) {
      const auto offsets = torch::arange(lo, hi, by_offset.options()).clamp_(-reach, reach).add_(reach);
      return table.index_select(1, by_offset.index_select(0, offsets));
    });  // (H, hi - lo)
  }

 private:
  // The bucket of every offset -max_distance .. max_distance, on `device` (index o + max_distance).
  // Past max_distance on either side every offset is in that side's last bucket, so an offset's
  // bucket is this table's entry at the offset clamped to the range: the tiles of any length
  // are then gathered on the device. Made once a device, by the first forward (an eager one:
  // a CUDA graph captures the step only after an eager step), since a copy from the host cannot
  // be captured.
  torch::Tensor bucket_of_offset(const torch::Device& device) {
    if (!by_offset_.defined() || by_offset_.device() != device)
      by_offset_ = offset_buckets(-options_.max_distance, options_.max_distance + 1, bidirectional_, options_.buckets,
                                  options_.max_distance)
                       .to(device);
    return by_offset_;
  }

  T5BiasOptions options_;
  bool bidirectional_;
  torch::Tensor table_;      // (layers or 1, buckets, H)
  torch::Tensor by_offset_;  // bucket_of_offset's table, on the device last asked for
};

PositionInfo make_t5_bias_info() {
  PositionInfo info;
  info.name = "t5_bias";
  info.description = "T5 relative bias: a learned scalar per head and log-spaced distance bucket";
  info.hooks = kBias;
  info.modes = kCausal | kBidirectional;
  info.tensors =
      "position.table (S, buckets, H): bias(i, j) = table[s, bucket(j - i), h]; S = 1 when "
      "shared_across_layers (every layer uses s = 0), else S = layers (layer l uses s = l)";
  info.options = document_options<T5BiasOptions>();
  info.factory = factory_for<T5Bias, T5BiasOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(t5_bias, extrap::make_t5_bias_info);
