// Text generation from a causal model: a prompt, then new tokens sampled one at a time, with
// a per-layer key/value cache (core/model/model.h, KVCache) or, for comparison, a full forward pass
// over the whole sequence at every step.
#pragma once

#include "core/model/model.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace extrap {

struct GenerateOptions {
  int64_t max_new = 64;      // tokens to generate
  double temperature = 1.0;  // 0: greedy (the most likely token)
  int64_t top_k = 0;         // sample from the k most likely tokens (0: all)
  uint64_t seed = 0;         // of the sampling generator: the same seed, the same text
  bool use_cache = true;     // false: recompute the whole sequence at every step
  std::vector<int32_t> banned;  // never sampled (e.g. the mask token of a byte vocabulary)
};

// Refuses (ConfigError) a negative count, temperature or top-k, naming the option.
void check_generate_options(const GenerateOptions& options);

// The next token from one row of logits (V,) under the options, drawing from `generator`.
int32_t sample_token(const torch::Tensor& logits, const GenerateOptions& options,
                     torch::Generator& generator);

// Generates after `prompt` (at least one token); calls on_token(token) for each new token as
// it is chosen. Returns the new tokens. Under NoGradGuard and eval mode (restored afterwards).
// A causal model only; the sequence may run past the training length as far as the position
// method allows (a `learned` table ends at its max_length).
std::vector<int32_t> generate(TransformerLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace extrap
