#include "positions/rotation.h"

#include "core/kernels/rotate_pairs.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace extrap {

std::string rope_scaling_name(RopeScalingKind kind) {
  switch (kind) {
    case RopeScalingKind::none: return "none";
    case RopeScalingKind::linear: return "linear";
    case RopeScalingKind::ntk: return "ntk";
    case RopeScalingKind::dynamic: return "dynamic";
    case RopeScalingKind::yarn: return "yarn";
    case RopeScalingKind::yarn_paper: return "yarn_paper";
    case RopeScalingKind::llama3: return "llama3";
    case RopeScalingKind::longrope: return "longrope";
    case RopeScalingKind::self_extend: return "self_extend";
  }
  return "?";
}

RopeScalingKind parse_rope_scaling(const std::string& name, const std::string& where) {
  for (auto kind : {RopeScalingKind::none, RopeScalingKind::linear, RopeScalingKind::ntk,
                    RopeScalingKind::dynamic, RopeScalingKind::yarn, RopeScalingKind::yarn_paper,
                    RopeScalingKind::llama3, RopeScalingKind::longrope, RopeScalingKind::self_extend})
    if (rope_scaling_name(kind) == name) return kind;
  throw ConfigError((where.empty() ? "" : where + ": ") + "unknown RoPE scaling '" + name +
                    "' (known: none, linear, ntk, dynamic, yarn, yarn_paper, llama3, longrope, self_extend)");
}

std::vector<RopeScalingKind> parse_rope_variants(const std::vector<std::string>& names,
                                                 const std::string& where) {
  std::vector<RopeScalingKind> variants;
  for (const auto& name : names) {
    const RopeScalingKind kind = parse_rope_scaling(name, where);
    if (std::find(variants.begin(), variants.end(), kind) != variants.end())
      throw ConfigError((where.empty() ? "" : where + ": ") + name + " is listed twice");
    variants.push_back(kind);
  }
  return variants;
}

void check_rope_scaling(const RopeScaling& s) {
  const std::string what = "RoPE scaling " + rope_scaling_name(s.kind);
  if (!s.active()) return;
  if (!(std::isfinite(s.factor) && s.factor >= 1.0))
    throw ConfigError(what + ": factor " + number_text(s.factor) + " must be at least 1");
  const bool yarn = s.kind == RopeScalingKind::yarn || s.kind == RopeScalingKind::yarn_paper;
  const bool needs_length = s.kind == RopeScalingKind::dynamic || yarn || s.kind == RopeScalingKind::llama3 ||
                            s.kind == RopeScalingKind::longrope || s.kind == RopeScalingKind::self_extend;
  if (needs_length && s.original_length < 1)
    throw ConfigError(what + " needs the training length (got " +
                      std::to_string(s.original_length) + ")");
  if (yarn && !(s.beta_fast > s.beta_slow && s.beta_slow > 0))
    throw ConfigError(what + ": beta_fast " + number_text(s.beta_fast) +
                      " must exceed beta_slow " + number_text(s.beta_slow) + " > 0");
  if (s.kind == RopeScalingKind::self_extend) {
    if (s.factor != std::floor(s.factor))
      throw ConfigError(what + ": the group size (factor) " + number_text(s.factor) + " must be a whole number");
    if (s.neighbor_window < 1 || (s.original_length > 0 && s.neighbor_window >= s.original_length))
      throw ConfigError(what + ": the neighbour window " + std::to_string(s.neighbor_window) +
                        " must be at least 1 and below the training length " + std::to_string(s.original_length));
  }
  if (s.kind == RopeScalingKind::longrope) {
    if (s.short_factor.empty() || s.short_factor.size() != s.long_factor.size())
      throw ConfigError(what + " needs short_factor and long_factor, one factor for each rotated pair (a checkpoint's "
                        "rope_scaling gives them; got " + std::to_string(s.short_factor.size()) + " and " +
                        std::to_string(s.long_factor.size()) + ")");
    for (const auto* list : {&s.short_factor, &s.long_factor})
      for (const double f : *list)
        if (!(std::isfinite(f) && f > 0))
          throw ConfigError(what + ": " + (list == &s.short_factor ? "short_factor" : "long_factor") + " holds " +
                            number_text(f) + "; each factor must be a finite number above 0");
    if (!(std::isfinite(s.attention_factor) && s.attention_factor >= 0))
      throw ConfigError(what + ": attention_factor " + number_text(s.attention_factor) +
                        " must be a finite number at least 0 (0: the paper's sqrt(1 + ln s / ln L))");
  }
  if (s.kind == RopeScalingKind::llama3 &&
      !(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0))
    throw ConfigError(what + ": high_freq_factor " + number_text(s.high_freq_factor) +
                      " must exceed low_freq_factor " + number_text(s.low_freq_factor) + " > 0");
}

torch::Tensor scaled_rotary_frequencies(int64_t rotated, double base, const RopeScaling& s,
                                        int64_t current_length) {
  check_rope_scaling(s);
  const double d = double(rotated), factor = s.factor, L = double(s.original_length);
  auto theta = rotary_frequencies(rotated, base);  // (d/2,)
  switch (s.kind) {
    case RopeScalingKind::none:
    case RopeScalingKind::self_extend:  // positions change, not frequencies
      return theta;
    case RopeScalingKind::linear:
      return theta / factor;
    case RopeScalingKind::ntk:
      if (rotated <= 2) return theta;
      return rotary_frequencies(rotated, base * std::pow(factor, d / (d - 2.0)));
    case RopeScalingKind::dynamic: {
      const double l = double(current_length);
      if (rotated <= 2 || l <= L) return theta;
      return rotary_frequencies(rotated,
                                base * std::pow(factor * l / L - (factor - 1.0), d / (d - 2.0)));
    }
    case RopeScalingKind::yarn: {
      // Hugging Face's and the authors' code: a ramp over the pair index k between the rounded
      // dimensions where L / wavelength crosses beta_fast and beta_slow.
      const auto dimension = [&](double rotations) {
        return d * std::log(L / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
      };
      const double low = std::max(std::floor(dimension(s.beta_fast)), 0.0);
      double high = std::min(std::ceil(dimension(s.beta_slow)), d - 1.0);
      if (high == low) high += 0.001;
      auto interpolated = ((torch::arange(0, rotated / 2, torch::kFloat64) - low) / (high - low)).clamp(0.0, 1.0);
      return interpolated * theta / factor + (1.0 - interpolated) * theta;
    }
    case RopeScalingKind::yarn_paper: {
      auto ratio = theta * (L / (2.0 * M_PI));  // L / wavelength
      auto gamma = ((ratio - s.beta_slow) / (s.beta_fast - s.beta_slow)).clamp(0.0, 1.0);
      return (1.0 - gamma) * theta / factor + gamma * theta;
    }
    case RopeScalingKind::llama3: {
      auto wavelength = (2.0 * M_PI) / theta;
      auto smooth = (L / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      auto blended = (1.0 - smooth) * theta / factor + smooth * theta;
      auto low = wavelength.gt(L / s.low_freq_factor), high = wavelength.lt(L / s.high_freq_factor);
      return torch::where(low, theta / factor, torch::where(high, theta, blended));
    }
    case RopeScalingKind::longrope: {
      const std::vector<double>& ext = double(current_length) > L ? s.long_factor : s.short_factor;
      if (int64_t(ext.size()) != rotated / 2)
        throw ConfigError("RoPE scaling longrope: " + std::to_string(ext.size()) + " factors for " +
                          std::to_string(rotated / 2) + " rotated pairs");
      return theta / torch::tensor(ext, torch::kFloat64);
    }
  }
  return theta;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.kind == RopeScalingKind::longrope) {
    if (s.attention_factor > 0) return s.attention_factor;
    return s.factor > 1.0 ? std::sqrt(1.0 + std::log(s.factor) / std::log(double(s.original_length))) : 1.0;
  }
  const bool yarn = s.kind == RopeScalingKind::yarn || s.kind == RopeScalingKind::yarn_paper;
  return yarn && s.factor > 1.0 ? 0.1 * std::log(s.factor) + 1.0 : 1.0;
}

torch::Tensor rotary_frequencies(int64_t rotated, double base) {
  auto i = torch::arange(0, rotated / 2, torch::kFloat64);  // (d/2,)
  return torch::exp(i * (-2.0 * std::log(base) / double(rotated)));
}

int64_t window_end(const TokenPositions& positions) {
  if (positions.is_sampled())
    return positions.sampled.numel() == 0 ? 0 : positions.sampled[-1].item<int64_t>() + 1;
  return positions.offset + positions.length;
}

std::pair<torch::Tensor, torch::Tensor> rotary_angles(const TokenPositions& positions,
                                                      const torch::Tensor& frequencies) {
  auto phase = positions.values(torch::kFloat64).unsqueeze(1) * frequencies.unsqueeze(0);  // (T, d/2)
  return {phase.cos(), phase.sin()};
}

std::pair<torch::Tensor, torch::Tensor> scaled_rotary_angles(const TokenPositions& positions,
                                                             int64_t rotated, double base,
                                                             const RopeScaling& scaling, int64_t pairs) {
  auto frequencies = scaled_rotary_frequencies(rotated, base, scaling, window_end(positions));
  if (pairs >= 0) frequencies = frequencies.narrow(0, 0, pairs);
  auto [cos, sin] = rotary_angles(positions, frequencies);
  const double factor = rope_attention_factor(scaling);  // 1 unless yarn
  return {cos * factor, sin * factor};
}

std::vector<torch::Tensor> RotationTables::get(
    const TokenPositions& positions, torch::Device device, torch::ScalarType dtype,
    const std::function<std::vector<torch::Tensor>()>& compute) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!positions.is_sampled() && !tables_.empty() && length_ == positions.length &&
      offset_ == positions.offset && centre_ == positions.centre && device_ == device &&
      dtype_ == dtype)
    return tables_;
  std::vector<torch::Tensor> tables = compute();
  for (auto& t : tables) t = t.to(device, dtype);
  if (!positions.is_sampled()) {
    length_ = positions.length;
    offset_ = positions.offset;
    centre_ = positions.centre;
    device_ = device;
    dtype_ = dtype;
    tables_ = tables;
  }
  return tables;
}

void RotationTables::set_scaling(const RopeScaling& scaling) {
  check_rope_scaling(scaling);
  std::lock_guard<std::mutex> lock(mutex_);
  scaling_ = scaling;
  tables_.clear();
  length_ = -1;
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin, int64_t rotated, RotaryPairing pairing) {
  const auto d = x.size(-1);
  if (rotate_pairs_fused_takes(x, cos, sin, rotated))  // one pass each way (core/kernels/rotate_pairs.h)
    return rotate_pairs_fused(x, cos, sin, rotated, pairing == RotaryPairing::half);
  torch::Tensor turned;  // (B, H, T, d_rot)
  if (pairing == RotaryPairing::half) {
    auto first = x.narrow(-1, 0, rotated / 2), second = x.narrow(-1, rotated / 2, rotated / 2);  // (B, H, T, d/2)
    turned = torch::cat({first * cos - second * sin, first * sin + second * cos}, -1);
  } else {
    auto pairs = x.narrow(-1, 0, rotated).unflatten(-1, {rotated / 2, 2});  // (B, H, T, d/2, 2)
    auto even = pairs.select(-1, 0), odd = pairs.select(-1, 1);             // (B, H, T, d/2)
    turned = torch::stack({even * cos - odd * sin, even * sin + odd * cos}, -1).flatten(-2);
  }
  if (rotated == d) return turned;
  return torch::cat({turned, x.narrow(-1, rotated, d - rotated)}, -1);    // (B, H, T, D)
}

}  // namespace extrap
