// PoSE training positions (position.pose_target, pose_chunks: positions/sampling.cpp) checked
// against the definition (REFERENCE.md, "The 2024-26 wave"): every draw is cut into at most
// pose_chunks runs of consecutive positions, the first starting at 0, every position below the
// target; over many draws the skips and the cut points are uniform, so every relative
// distance up to the target is reached. Randomized positions keep their old draw bit for bit.
#include <catch2/catch.hpp>

#include "core/model/config.h"
#include "core/model/model.h"
#include "positions/position.h"
#include "tests/support/position_support.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <set>
#include <vector>

using namespace extrap;

namespace {

PositionSampling pose(int64_t target, int64_t chunks) {
  return {PositionSampling::Kind::pose, target, chunks};
}

// The runs of consecutive values of a draw, as (first index, length) pairs.
std::vector<std::pair<int64_t, int64_t>> runs_of(const std::vector<int64_t>& p) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i == 0 || p[i] != p[i - 1] + 1) runs.push_back({int64_t(i), 0});
    ++runs.back().second;
  }
  return runs;
}

std::vector<int64_t> values(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("PoSE: each draw is chunks of consecutive positions from 0, below the target",
          "[positions][pose]") {
  torch::manual_seed(11);
  for (const auto& [length, target, chunks] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {16, 64, 2}, {16, 64, 3}, {5, 5, 2}, {7, 100, 7}, {32, 33, 4}}) {
    INFO("length " << length << " target " << target << " chunks " << chunks);
    for (int draw = 0; draw < 200; ++draw) {
      const auto t = pose(target, chunks).draw(length);
      REQUIRE(t.dtype() == torch::kLong);
      REQUIRE(t.sizes() == torch::IntArrayRef{length});
      const auto p = values(t);
      CHECK(p.front() == 0);
      CHECK(p.back() < target);
      for (size_t i = 1; i < p.size(); ++i) CHECK(p[i] > p[i - 1]);
      CHECK(int64_t(runs_of(p).size()) <= chunks);  // a zero skip joins two chunks
    }
  }
}

TEST_CASE("PoSE: skips and cut points are uniform, every distance up to the target is trained",
          "[positions][pose]") {
  torch::manual_seed(12);
  const int64_t length = 16, target = 64, draws = 4000;
  // Two chunks: the second chunk's skip s = last - (length - 1) is uniform on [0, target -
  // length]; the cut c (the second chunk's first index) is uniform on [1, length - 1] and is
  // seen wherever s > 0.
  std::vector<int64_t> skip_count(target - length + 1, 0), cut_count(length, 0);
  std::set<int64_t> spans;
  for (int64_t n = 0; n < draws; ++n) {
    const auto p = values(pose(target, 2).draw(length));
    const int64_t skip = p.back() - (length - 1);
    REQUIRE(skip >= 0);
    REQUIRE(skip <= target - length);
    ++skip_count[size_t(skip)];
    const auto runs = runs_of(p);
    REQUIRE(int64_t(runs.size()) == (skip > 0 ? 2 : 1));
    if (skip > 0) ++cut_count[size_t(runs[1].first)];
    spans.insert(p.back() - p.front());
  }
  const double per_skip = double(draws) / double(skip_count.size());  // 81.6
  for (size_t s = 0; s < skip_count.size(); ++s) {
    INFO("skip " << s);
    CHECK(std::abs(skip_count[s] - per_skip) < 5 * std::sqrt(per_skip));  // 5 sigma
  }
  CHECK(cut_count[0] == 0);
  const double seen = double(draws - skip_count[0]), per_cut = seen / double(length - 1);
  for (int64_t c = 1; c < length; ++c) {
    INFO("cut " << c);
    CHECK(std::abs(cut_count[size_t(c)] - per_cut) < 5 * std::sqrt(per_cut));
  }
  // The longest distance in a window reaches every value from length - 1 to target - 1.
  CHECK(int64_t(spans.size()) == target - length + 1);
  CHECK(*spans.begin() == length - 1);
  CHECK(*spans.rbegin() == target - 1);
}

TEST_CASE("randomized positions draw as before: a sorted sample without repeats",
          "[positions][pose][randomize]") {
  torch::manual_seed(13);
  const auto drawn = PositionSampling{PositionSampling::Kind::random, 200, 2}.draw(16);
  torch::manual_seed(13);
  const auto before = std::get<0>(torch::randperm(200, torch::kLong).narrow(0, 0, 16).sort());
  CHECK(torch::equal(drawn, before));  // the same numbers as runs made before PoSE
  CHECK_THROWS_WITH(pose(10, 2).draw(11), Catch::Contains("pose_target 10") && Catch::Contains("11 tokens"));
  CHECK_THROWS_WITH(pose(100, 8).draw(7), Catch::Contains("pose_chunks 8"));
}

TEST_CASE("PoSE: a model samples in training only, refusals name the key", "[positions][pose]") {
  auto model = testing::check_samples_in_training_only("{name: rotary, pose_target: 256, pose_chunks: 3}");
  CHECK(model->position().sampling().kind == PositionSampling::Kind::pose);
  CHECK(model->position().sampling().range == 256);
  CHECK(model->position().sampling().chunks == 3);

  CHECK_THAT(testing::position_refusal("{name: t5_bias, pose_target: 500}"),
             Catch::Contains("pose_target") && Catch::Contains("t5_bias") && Catch::Contains("rotary"));
  CHECK_THAT(testing::position_refusal("{name: rotary, pose_target: -1}"), Catch::Contains("position.pose_target"));
  CHECK_THAT(testing::position_refusal("{name: rotary, pose_target: 32}"),
             Catch::Contains("position.pose_target") && Catch::Contains("seq_len 64"));
  CHECK_THAT(testing::position_refusal("{name: rotary, pose_target: 500, pose_chunks: 1}"), Catch::Contains("position.pose_chunks"));
  CHECK_THAT(testing::position_refusal("{name: rotary, pose_target: 500, pose_chunks: 65}"),
             Catch::Contains("position.pose_chunks") && Catch::Contains("seq_len 64"));
  CHECK_THAT(testing::position_refusal("{name: rotary, pose_chunks: 3}"),
             Catch::Contains("position.pose_chunks") && Catch::Contains("pose_target"));
  CHECK_THAT(testing::position_refusal("{name: rotary, pose_target: 500, randomize_max: 500}"),
             Catch::Contains("position.pose_target") && Catch::Contains("randomize_max"));
  CHECK_THAT(testing::position_refusal("{name: learned, max_length: 100, pose_target: 500}"),
             Catch::Contains("pose_target 500") && Catch::Contains("max_length 100"));
  CHECK_THAT(testing::position_refusal("rotary", "model: {layers: 2}\nlayers: {pattern: [r, n], kinds: {r: {position: {name: rotary, "
                               "pose_target: 500}}, n: {position: none}}}\n"),
             Catch::Contains("layers.kinds.r.position.pose_target"));
  CHECK(testing::position_refusal("{name: alibi, pose_target: 500}") == "(accepted)");
  CHECK(testing::position_refusal("{name: learned, max_length: 500, pose_target: 500}") == "(accepted)");
}
