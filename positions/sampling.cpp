// Sampled training positions (PositionSampling, positions/position.h): randomized positions
// (Ruoss et al., 2023) and PoSE (Zhu et al., ICLR 2024), drawn once per forward pass.
#include "positions/position.h"

namespace extrap {

std::string PositionSampling::key() const {
  switch (kind) {
    case Kind::random: return "position.randomize_max";
    case Kind::pose: return "position.pose_target";
    case Kind::contiguous: break;
  }
  return "";
}

torch::Tensor PositionSampling::draw(int64_t length) const {
  TORCH_CHECK(active(), "PositionSampling::draw: contiguous positions are not drawn");
  TORCH_CHECK(length <= range, key(), " ", range, " is below the window of ", length, " tokens");
  if (kind == Kind::random)
    return std::get<0>(torch::randperm(range, torch::kLong).narrow(0, 0, length).sort());
  TORCH_CHECK(length >= chunks, "position.pose_chunks ", chunks, " exceeds the window of ", length,
              " tokens (each chunk needs one)");
  // Chunk c > 0 starts at one of the window's indices 1..length-1 (distinct, uniform); its
  // positions are shifted by skip_c, the c-th smallest of chunks - 1 uniform draws from
  // [0, range - length], so that positions increase strictly and the last is below range.
  const auto starts =
      std::get<0>((torch::randperm(length - 1, torch::kLong).narrow(0, 0, chunks - 1) + 1).sort());
  const auto skips = std::get<0>(torch::randint(0, range - length + 1, {chunks - 1}, torch::kLong).sort());
  auto positions = torch::arange(length, torch::kLong);
  const auto start = starts.accessor<int64_t, 1>();
  const auto skip = skips.accessor<int64_t, 1>();
  for (int64_t c = 0, shifted = 0; c < chunks - 1; shifted = skip[c++])  // chunk c + 1 onward
    positions.narrow(0, start[c], length - start[c]).add_(skip[c] - shifted);
  return positions;
}

PositionSampling read_sampling(const OptionReader& options) {
  int64_t randomize_max = 0, pose_target = 0, pose_chunks = 2;
  options.read("randomize_max", randomize_max,
               "training only: 0, or N to train on sorted random positions from [0, N) "
               "(Ruoss et al., 2023); evaluation uses 0..T-1");
  options.read("pose_target", pose_target,
               "training only: 0, or N for PoSE (Zhu et al., 2024): the window is cut at random "
               "into pose_chunks chunks, each after a random skip, every position below N; "
               "evaluation uses 0..T-1");
  options.read("pose_chunks", pose_chunks, "PoSE: the number of chunks (at least 2)");
  if (!options.decoding()) return {};
  if (randomize_max < 0) options.fail("randomize_max", "must be 0 (off) or a positive number of positions");
  if (pose_target < 0) options.fail("pose_target", "must be 0 (off) or a positive number of positions");
  if (randomize_max > 0 && pose_target > 0)
    options.fail("pose_target", "and randomize_max are two ways to sample training positions; give one");
  if (options.has("pose_chunks") && pose_target == 0)
    options.fail("pose_chunks", "applies to PoSE only: set pose_target too");
  options.at_least("pose_chunks", pose_chunks, 2);
  PositionSampling sampling;
  if (randomize_max > 0) sampling = {PositionSampling::Kind::random, randomize_max, 2};
  if (pose_target > 0) sampling = {PositionSampling::Kind::pose, pose_target, pose_chunks};
  return sampling;
}

}  // namespace extrap
