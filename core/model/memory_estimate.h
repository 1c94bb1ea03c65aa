// What a config needs in memory, estimated before anything is allocated, so that a config that
// cannot fit is refused with the estimate and what is available, not a climb into bad_alloc.
//
// Training (fp32): parameters, their gradients and AdamW's two moments (4 copies; NAG's one
// momentum: 3), plus the
// activations autograd keeps for one micro-batch of B = batch_tokens / seq_len / accumulation
// sequences of T = seq_len tokens: per layer about B*T*(10*d_model + 2*d_ffn) values for the
// residual stream, LayerNorms, q/k/v, projections and FFN, and B*heads*T*T*2 for the
// attention scores and probabilities (the reference path materialises them); and the logits
// with their gradient, B*T*vocab*2 (adaptive bands: the head's columns, and a tail's for a tenth of
// the tokens). The estimate errs low: a refused config surely does not
// fit, an accepted one may still be tight.
#pragma once

#include "core/model/config.h"

#include <cstdint>
#include <string>

namespace extrap {

struct MemoryEstimate {
  int64_t parameters = 0;   // bytes of the weights
  int64_t gradients = 0;
  int64_t optimizer = 0;    // AdamW's moments or NAG's momentum
  int64_t activations = 0;  // kept for backward, one micro-batch
  int64_t total() const;  // saturating: never wraps negative
  std::string parts() const;  // "weights 1.1 GiB, gradients ..., optimiser state ..., activations ..."
};

int64_t parameter_count_estimate(const Config& config, int64_t vocab_size);
// The input embedding's (and tied softmax's) parameters: V x d_model, or the adaptive bands'.
int64_t vocabulary_parameters(const ModelConfig& model, int64_t vocab_size);
MemoryEstimate estimate_training_memory(const Config& config, int64_t vocab_size);

// Bytes this process can still allocate: the least of MemAvailable, the cgroup's memory.max
// headroom and RLIMIT_AS headroom; -1 when none is known.
int64_t available_memory_bytes();
std::string format_bytes(int64_t bytes);  // "1.5 GiB", "320 MiB"

// Floating-point operations of a forward pass over `windows` windows of `length` tokens (causal
// attention: each query against the keys up to it), with the output projection at `scored`
// positions of all of them: 2 x tokens x the blocks' projection weights, 2 x 2 x layers x the
// attended pairs x d_model for q.k and the weighted values, 2 x scored x d_model x vocabulary.
// What an evaluation will cost, said before a long one starts.
double forward_flops(const ModelConfig& model, int64_t vocab_size, int64_t windows, int64_t length, int64_t scored);

// Refuses (ConfigError) a training config whose estimate exceeds the available memory.
void check_training_memory(const Config& config, int64_t vocab_size);
// Refuses (ConfigError) `bytes` needed for `what` when more than is available.
void check_memory(int64_t bytes, const std::string& what, const std::string& advice);

}  // namespace extrap
