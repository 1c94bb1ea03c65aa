// T5's relative-position buckets (Raffel et al., 2020), shared by `t5_bias` and its tests.
#pragma once

#include <cstdint>

namespace extrap {

// The bucket of relative_position = j - i (key minus query), as in T5's
// `_relative_position_bucket`:
//   bidirectional: half the buckets per sign; keys to the right (j > i) use the upper half.
//   one-directional (causal): n = max(i - j, 0), so every key at or right of the query is 0.
// Within a half of `b` buckets, distances n < b/2 have a bucket each; larger distances are
// log-spaced up to max_distance: b/2 + floor(log(n / (b/2)) / log(max_distance / (b/2)) *
// (b - b/2)), capped at b - 1. A distance exactly on a boundary (e.g. 16, 32, 64 with 32
// bidirectional buckets up to 128) starts the new bucket, as the exact formula says; T5's
// float32 code may round those few either way.
int64_t t5_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                  int64_t max_distance);

}  // namespace extrap
