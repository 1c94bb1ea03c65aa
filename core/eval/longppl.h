// LongPPL (Fang et al., ICLR 2025, "What is Wrong with Perplexity for Long-context Language
// Modeling?"; PKU-ML/LongPPL): perplexity over the key tokens only, the tokens whose prediction
// depends on the long context.
//
// A reference model (by default the evaluated model itself) selects the key tokens of a stream:
//  - long: its NLL of each target in non-overlapping windows of the evaluation length T (the
//    target at window position p has p + 1 tokens of context);
//  - short: its NLL of the same target with at most the last K tokens as context (a sliding
//    evaluation at length K, stride 1: exactly K tokens past the stream's first K);
//  - candidates: targets with more than K tokens of long context (p >= K), the others see the
//    same context in both;
//  - key: a candidate whose long log-probability exceeds its short one by more than alpha (2)
//    and is above beta (-2): NLL_short - NLL_long > alpha and -NLL_long > beta.
// LongPPL = exp(mean NLL of the evaluated model's long evaluation over the key tokens). The
// reference implementation shares one short context among `sliding_window` targets (contexts
// K to K + S - 1); extrap scores each target with its own last K tokens, so that the short
// context never passes K (K = the training length L by default: the trained window).
#pragma once

#include "core/eval/evaluator.h"
#include "core/run/run_dir.h"

#include <cstdint>

namespace extrap {

struct LongPplSpec {
  int64_t short_length = 0;  // K, at least 1
  double alpha = 2.0;        // log-probability gain over the short context, nats
  double beta = -2.0;        // floor on the long log-probability, nats
};

// The key tokens a reference model selects at one evaluation length.
struct KeyTokens {
  int64_t length = 0;        // T
  int64_t short_length = 0;  // K
  torch::Tensor key;         // (n,) bool by the target's stream position
  int64_t candidates = 0;
  int64_t count = 0;
};

// Selects from the reference's long evaluation at T (non-overlapping) and short evaluation at
// K (stride 1), both with keep_token_nll over the same tokens of the same stream. Refuses
// (EvalFailure) T <= K, evaluations of different stream prefixes, a short evaluation that is
// not stride 1 at K, and non-finite NLLs.
KeyTokens select_key_tokens(const EvalResult& long_eval, const EvalResult& short_eval,
                            const LongPplSpec& spec);

struct LongPplResult {
  int64_t length = 0;
  int64_t short_length = 0;
  int64_t key_tokens = 0;
  int64_t candidates = 0;
  double nll_sum = 0;     // the evaluated model's NLL summed over the key tokens
  double longppl = NAN;   // exp(nll_sum / key_tokens); NaN with no key token
};

// The evaluated model's LongPPL from its long evaluation at the keys' length (keep_token_nll).
// Refuses (EvalFailure) another length or stream prefix, or a key token it did not score.
LongPplResult longppl(const EvalResult& long_eval, const KeyTokens& keys);

// The sliding evaluation at K that gives the short NLLs: `base` (split limit, batch size, RoPE
// scaling none) at length K, stride 1, keeping token NLLs.
EvalSpec short_context_spec(const EvalSpec& base, int64_t short_length);

// The run at `run_dir` loaded as the key-token model of evaluations of `corpus`, on `device`.
// Refuses (ConfigError, beginning with `what`, e.g. "--longppl-reference runs/a") a run
// without a verified checkpoint, one that reads other data or tokens than `corpus` (key tokens
// are positions in one token stream) and a masked LM.
LoadedRun load_key_token_model(const std::string& run_dir, const Corpus& corpus, torch::Device device,
                               const std::string& what);

}  // namespace extrap
