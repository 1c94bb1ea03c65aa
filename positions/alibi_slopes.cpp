#include "positions/alibi_slopes.h"

#include "core/base/yaml_options.h"

#include <cmath>

namespace extrap {

namespace {
// 2^(-8 (h + 1) / n), each from its own exponent (exact in binary for a power-of-two n), not as
// powers of the rounded ratio, so every slope is the double nearest the definition.
std::vector<double> power_of_two_slopes(int n) {
  std::vector<double> slopes(n);
  for (int h = 0; h < n; ++h) slopes[h] = std::pow(2.0, -8.0 * double(h + 1) / double(n));
  return slopes;
}
}  // namespace

std::vector<double> alibi_slopes(int num_heads) {
  if (num_heads < 1) throw ConfigError("ALiBi needs at least one head, got " + std::to_string(num_heads));
  int p = 1;
  while (p * 2 <= num_heads) p *= 2;
  std::vector<double> slopes = power_of_two_slopes(p);
  if (p == num_heads) return slopes;
  const std::vector<double> extra = power_of_two_slopes(2 * p);
  for (int i = 0; slopes.size() < size_t(num_heads); i += 2) slopes.push_back(extra[i]);
  return slopes;
}

}  // namespace extrap
