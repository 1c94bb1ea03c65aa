// Rotation of query and key pairs, shared by `rotary` and `xpos`.
//
// Convention: *interleaved pairs*, as in the RoFormer paper and torchscale's xPos. Dimensions
// (2i, 2i+1) of a head form the complex number x[2i] + i x[2i+1], which at position p is
// multiplied by exp(i p theta_i), theta_i = base^(-2i / d_rot), i = 0 .. d_rot/2 - 1. Only the
// first d_rot dimensions rotate; the rest pass through unchanged.
#pragma once

#include "positions/position.h"

#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace extrap {

// theta_i = base^(-2i / rotated), i = 0 .. rotated/2 - 1: (rotated/2,) float64.
torch::Tensor rotary_frequencies(int64_t rotated, double base);

// cos and sin of p * theta_i for the window's positions p: (T, rotated/2) each, float64 on
// the CPU.
std::pair<torch::Tensor, torch::Tensor> rotary_angles(const TokenPositions& positions,
                                                      const torch::Tensor& frequencies);

// The tables a rotation needs for one window (rotary: cos and sin; xpos: the same scaled for
// the queries and for the keys). Every layer of a forward pass asks for the same ones, so the
// last contiguous window's are kept; sampled positions (a new sample every training step) are
// computed each time.
class RotationTables {
 public:
  // compute() returns the tables in float64 on the CPU; they come back in `dtype` on `device`.
  std::vector<torch::Tensor> get(const TokenPositions& positions, torch::Device device,
                                 torch::ScalarType dtype,
                                 const std::function<std::vector<torch::Tensor>()>& compute);

 private:
  std::mutex mutex_;
  int64_t length_ = -1, offset_ = 0;
  torch::Device device_ = torch::kCPU;
  torch::ScalarType dtype_ = torch::kFloat32;
  std::vector<torch::Tensor> tables_;
};

// x: (B, H, T, D). Rotates the pairs (2i, 2i+1) of the first `rotated` dimensions by the
// (T, rotated/2) angles given as cos and sin.
torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin, int64_t rotated);

}  // namespace extrap
