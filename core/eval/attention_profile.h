// Where a model looks: for a trained model and a window length, the attention mass and entropy
// by query-key distance, per layer and head, averaged over every query of the windows read.
//
// Each window of `length` tokens of the stream (non-overlapping, from the start, at most
// spec.windows of them) goes through the model once. Every layer's attention weights (those of
// attention_probabilities(), core/attention/attention_observer.h: the weights the reference path
// gives the values, whatever backend the forward itself takes) are computed a block of query
// rows at a time, so memory grows with length x query_block, not length^2, and summed into
// distance bins. On the CPU, for no bias, a linear one (the ALiBi family) or forget gates, with
// any masks, sink and logit scale, a kernel makes each row's softmax from q and k and sums it
// into the bins in one pass over its keys (-p ln p = p (ln Z - z + m), no logarithm a weight);
// other biases take attention_probabilities() and then the same bins. Sums are float32 within
// blocks of 256 keys and float64 across them (about 1e-7 relative):
//   bin b holds distances [edges[b], edges[b + 1]): 0, 1, 2-3, 4-7, ... (powers of two, and
//   spec.split_at, e.g. the training length, so that the mass past it is a sum of bins), the
//   last ending at `length`; distance i - j for a causal model, |i - j| for a masked LM.
//   mass[l, h, b]    = mean over queries i of sum_{j in bin b} p_ij
//   entropy[l, h, b] = mean over queries i of sum_{j in bin b} -p_ij ln p_ij   (nats; 0 ln 0 = 0)
// so a row of mass sums to 1 less the sink's share (a learned sink logit takes mass that
// weighs no value: `sink`), and a row of entropy sums to the heads' mean attention entropy over
// the keys. Stick-breaking's rest of each row (1 - sum_j A_ij, which goes to the query's own
// value) is counted at distance 0, with its -r ln r. The inputs are the text as it is (a masked
// LM sees no mask token). Not with StreamingLLM.
#pragma once

#include "core/data/corpus.h"
#include "core/model/model.h"

#include <cstdint>
#include <vector>

namespace extrap {

struct AttentionProfileSpec {
  int64_t length = 0;        // tokens a window
  int64_t windows = 8;       // at most this many windows (0: every full window of the stream)
  int64_t max_tokens = 0;    // windows from the first N tokens of the stream (0: all)
  int64_t query_block = 256;  // query rows whose weights are held at once (fewer at long
                              // lengths: a block's scores stay near 32 MiB on the CPU)
  int64_t split_at = 0;       // a distance edge besides the powers of two (0: none)
};

struct AttentionProfile {
  int64_t length = 0;
  int64_t windows = 0;
  bool causal = true;
  std::vector<int64_t> edges;  // bins + 1 distance edges, 0 .. length
  torch::Tensor mass;          // (layers, heads, bins) float64
  torch::Tensor entropy;       // (layers, heads, bins) float64, nats
  torch::Tensor sink;          // (layers, heads) float64: mean mass on the sink logit
  double seconds = 0;
};

// The distance bin edges for windows of `length` tokens: 0, 1, 2, 4, ..., with `split_at`
// among them when 0 < split_at < length, then `length`.
std::vector<int64_t> distance_bin_edges(int64_t length, int64_t split_at = 0);

// The profile of `model` (evaluation mode, no gradients; its training flag restored) over
// `stream`. Refuses (EvalFailure) a length the stream cannot fill with one window, a model
// under StreamingLLM and non-finite weights, and (ConfigError) a forward pass whose activations
// cannot fit in memory (check_window_memory).
AttentionProfile attention_profile(TransformerLM& model, const TokenStream& stream,
                                   const AttentionProfileSpec& spec, torch::Device device = torch::kCPU);

}  // namespace extrap
