// Attention probabilities, and a way to watch attention calls from outside the model: what the
// attention profile (core/eval/attention_profile.h) reads, without a T x T tensor and without
// a hook in each position method or backend.
#pragma once

#include "core/attention/attention.h"

#include <functional>

namespace extrap {

// Sees every attention() call made on the thread that installed it (ObservedAttention), in
// call order (a model's layers in order), before the call is computed; q, k, v and the bias as
// the backend gets them (rotary angles applied, the layer's bias and options). Returns the
// call's output where the observer has computed it on the way (attention_reference()'s, to
// rounding: its weights times v), which the backend then does not compute again; an undefined
// tensor leaves the call to the backend.
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  virtual torch::Tensor observe(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const AttentionBias& bias, const AttentionOptions& options) = 0;
};

// Installs `observer` on this thread for the object's lifetime; one at a time (a second is
// refused).
class ObservedAttention {
 public:
  explicit ObservedAttention(AttentionObserver& observer);
  ~ObservedAttention();
  ObservedAttention(const ObservedAttention&) = delete;
  ObservedAttention& operator=(const ObservedAttention&) = delete;
};

// The weights the reference path gives the values: (B, H, Tq, Tk), the queries the last Tq
// keys. Every kind: the softmax of the scores with the bias, masks, logit scale and Self-Extend
// (a sink's column left out: the rows then sum to less than 1), and stick-breaking's weights
// A_ij (the rest of each row, 1 - sum_j A_ij, goes to the query's own value). In grad mode it is
// differentiable. attention_reference() is these weights times v (stick-breaking aside).
torch::Tensor attention_probabilities(const torch::Tensor& q, const torch::Tensor& k,
                                      const AttentionBias& bias, const AttentionOptions& options);

// attention_probabilities() a block of at most `query_block` query rows at a time: calls
// visit(r, probs) with probs (B, H, n, keys) for query rows [r, r + n) against keys [0, keys)
// (causal: the keys those rows can see; bidirectional: every key). Memory (B, H, query_block,
// Tk) instead of (B, H, Tq, Tk). Kind::ScoreMixing (DAPE) mixes every head's whole score matrix
// and is computed whole.
void for_each_probability_block(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
                                const AttentionOptions& options, int64_t query_block,
                                const std::function<void(int64_t r, const torch::Tensor& probs)>& visit);

}  // namespace extrap
