#include "positions/rotation.h"

#include <cmath>

namespace extrap {

torch::Tensor rotary_frequencies(int64_t rotated, double base) {
  auto i = torch::arange(0, rotated / 2, torch::kFloat64);  // (d/2,)
  return torch::exp(i * (-2.0 * std::log(base) / double(rotated)));
}

std::pair<torch::Tensor, torch::Tensor> rotary_angles(const TokenPositions& positions,
                                                      const torch::Tensor& frequencies) {
  auto phase = positions.values(torch::kFloat64).unsqueeze(1) * frequencies.unsqueeze(0);  // (T, d/2)
  return {phase.cos(), phase.sin()};
}

std::vector<torch::Tensor> RotationTables::get(
    const TokenPositions& positions, torch::Device device, torch::ScalarType dtype,
    const std::function<std::vector<torch::Tensor>()>& compute) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!positions.is_sampled() && !tables_.empty() && length_ == positions.length &&
      offset_ == positions.offset && device_ == device && dtype_ == dtype)
    return tables_;
  std::vector<torch::Tensor> tables = compute();
  for (auto& t : tables) t = t.to(device, dtype);
  if (!positions.is_sampled()) {
    length_ = positions.length;
    offset_ = positions.offset;
    device_ = device;
    dtype_ = dtype;
    tables_ = tables;
  }
  return tables;
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin, int64_t rotated) {
  const auto d = x.size(-1);
  auto pairs = x.narrow(-1, 0, rotated).unflatten(-1, {rotated / 2, 2});  // (B, H, T, d/2, 2)
  auto even = pairs.select(-1, 0), odd = pairs.select(-1, 1);             // (B, H, T, d/2)
  auto turned = torch::stack({even * cos - odd * sin, even * sin + odd * cos}, -1)
                    .flatten(-2);                                         // (B, H, T, d_rot)
  if (rotated == d) return turned;
  return torch::cat({turned, x.narrow(-1, rotated, d - rotated)}, -1);    // (B, H, T, D)
}

}  // namespace extrap
