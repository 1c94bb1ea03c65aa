// Whether a number given in double precision (a config's value) survives as a float32 operand:
// a normal float32 (from FLT_MIN, about 1.2e-38, to FLT_MAX, about 3.4e38), neither flushed to
// zero or to a subnormal nor rounded to infinity. The soft caps (attention.softcap,
// model.logit_softcap) and the q, k, v clip (model.clip_qkv) are computed in float32 with such
// a constant.
#pragma once

#include <limits>

namespace extrap {

inline bool normal_float32(double x) {
  return x >= double(std::numeric_limits<float>::min()) && x <= double(std::numeric_limits<float>::max());
}

}  // namespace extrap
