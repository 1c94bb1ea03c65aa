// Evaluation of a trained model at any window length L.
//
// Targets are the tokens 1..N-1 of the stream (token t is predicted from tokens before it).
//  - Non-overlapping (stride 0 or stride == L): consecutive windows of L inputs; every target is
//    scored once with only the context inside its window.
//  - Sliding window, stride S < L: each forward pass sees (up to) L tokens and scores only the
//    targets not scored before, i.e. its last S; the first window scores all of its targets.
// Masked LM: the same windows, but inputs are masked with a selection that depends only on
// (mask_seed, absolute position), so every method and length is scored on the same tokens;
// only selected tokens inside a window's scored region count.
#pragma once

#include "core/corpus.h"
#include "core/model.h"

#include <cmath>
#include <vector>

namespace extrap {

struct EvalSpec {
  int64_t length = 512;
  int64_t stride = 0;            // 0 or >= length: non-overlapping
  int64_t max_tokens = 0;        // use the first N tokens of the stream (0: all)
  int64_t batch_tokens = 16384;  // tokens per forward pass (windows are batched)
  // masked LM only
  double mask_prob = 0.15;
  int64_t mask_seed = 1234;
};

struct EvalResult {
  int64_t length = 0;
  int64_t stride = 0;             // == length for non-overlapping
  double nll_sum = 0;             // natural log
  int64_t scored_tokens = 0;
  double perplexity = NAN;
  double bits_per_byte = NAN;     // byte-level corpora only
  double seconds = 0;
  int64_t windows = 0;
};

// One forward window: inputs [begin, begin + size) of the stream; positions
// [score_from, size) of the window are scored (their targets are stream[begin + p + 1] for a
// causal LM and stream[begin + p] for a masked LM).
struct EvalWindow {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t score_from = 0;
};

// The windows for a stream of n tokens. Causal: targets 1..n-1; masked: tokens 0..n-1.
std::vector<EvalWindow> plan_windows(int64_t n, int64_t length, int64_t stride, bool causal);

// The fixed masked-LM selection: whether absolute position `pos` is selected, and what its
// input becomes (80% mask token, 10% a random token, 10% unchanged).
struct MaskDecision {
  bool selected = false;
  int32_t input = 0;
};
MaskDecision mask_decision(int64_t pos, int32_t token, double mask_prob, int64_t seed,
                           int32_t mask_token, int64_t vocab_size);

// An evaluation that cannot give a right number: a length the data cannot fill, no scored
// tokens, a non-finite NLL. Sweeps record it as a failed point with this message.
struct EvalFailure : ConfigError {
  using ConfigError::ConfigError;
};

// Refuses (EvalFailure) a length longer than the `available` tokens can fill (L + 1 tokens for
// a causal window, L for a masked one) and a negative stride.
void check_eval_length(const EvalSpec& spec, int64_t available, int64_t split_tokens, bool causal);

// The spec a config asks for at one (length, stride): its eval section's token limit and batch
// size, and its masked-LM selection.
EvalSpec eval_spec_for(const Config& config, int64_t length, int64_t stride = 0);

// Evaluates under NoGradGuard and eval mode (restores the training flag afterwards). Throws
// EvalFailure rather than return a number that is not right (see above).
EvalResult evaluate(TransformerLM& model, const Corpus& corpus, const TokenStream& stream,
                    const EvalSpec& spec, torch::Device device = torch::kCPU);

}  // namespace extrap
