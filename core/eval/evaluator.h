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

#include "core/data/corpus.h"
#include "core/model/model.h"

#include <cmath>
#include <functional>
#include <vector>

namespace extrap {

// The RoPE scaling an evaluation at `eval_length` of a model trained at `train_length` uses:
// `factor` when given (> 0), else eval_length / train_length, never below 1 (so every variant
// equals the trained rotation up to the training length). Dynamic NTK's factor defaults to 1
// instead: its base already follows the current length l (b (l / L)^(d / (d - 2)) at s = 1).
// Self-Extend: neighbour window W = L / 2 and group size G = `factor` when given, else the least
// whole G that keeps every distance below L (floor((T - 1) / G) + W - floor(W / G) <= L - 1), so
// 1 (the trained model) up to L.
RopeScaling rope_scaling_for(RopeScalingKind kind, double factor, int64_t train_length,
                             int64_t eval_length);

// The name of a RoPE-scaling variant in results and mode names: "yarn", or "yarn_x4" when the
// factor was given rather than derived from the length; "" for none.
std::string rope_variant_label(RopeScalingKind kind, double factor);

// Scored rows of hidden states projected to logits at once, so that a large vocabulary never
// needs (scored tokens, V) floats: a batch's scored targets are taken in chunks of at most
// kLogitChunkRows rows and about kLogitChunkBytes of float32 logits (the log-softmax holds as
// many again), at least kLogitChunkMinRows rows: 4,096 rows for a byte vocabulary, 524 for
// 8,000 ids, 32 for Llama 3's 128,256.
inline constexpr int64_t kLogitChunkRows = 4096;
inline constexpr int64_t kLogitChunkMinRows = 32;
inline constexpr int64_t kLogitChunkBytes = int64_t(16) << 20;
int64_t logit_chunk_rows(int64_t vocab_size);

struct EvalSpec {
  int64_t length = 512;
  int64_t stride = 0;            // 0 or >= length: non-overlapping
  int64_t max_tokens = 0;        // use the first N tokens of the stream (0: all)
  std::string max_tokens_source = "eval.max_tokens";  // where max_tokens came from, for messages
  int64_t batch_tokens = 16384;  // tokens per forward pass (windows are batched)
  // masked LM only
  double mask_prob = 0.15;
  int64_t mask_seed = 1234;
  // Evaluation-time RoPE scaling (rotary and xpos models; resolved: see rope_scaling_for).
  RopeScaling rope_scaling;
  // Also return each target's NLL and window position (EvalResult::token_nll): LongPPL's input.
  bool keep_token_nll = false;
  // StreamingLLM (core/model/model.h): each non-overlapping window is a stream read through a
  // cache of streaming.cache tokens with streaming.sinks sinks. Refused with a stride, a RoPE
  // scaling or a masked LM.
  StreamingCache streaming;
  // Called after each forward pass with the windows this process has scored and all it will
  // (with data-parallel ranks, this rank's share): a progress display's input.
  std::function<void(int64_t done, int64_t total)> on_progress;
};

// The mean NLL by position in the window: the scored tokens at window positions
// [begin, end) and their summed NLL. Bins are log-spaced (position_bin_edges).
struct PositionBin {
  int64_t begin = 0;
  int64_t end = 0;
  double nll_sum = 0;
  int64_t scored_tokens = 0;
};

// Bin edges for windows of `length` positions: 0, then round(2^(j/4)) for j = 0, 1, ...
// without repeats (single positions up to 8, then four bins an octave: 10, 11, 13, 16, 19,
// ...), ending at `length`.
std::vector<int64_t> position_bin_edges(int64_t length);

struct EvalResult {
  int64_t length = 0;
  int64_t stride = 0;             // == length for non-overlapping
  double nll_sum = 0;             // natural log
  int64_t scored_tokens = 0;
  double perplexity = NAN;
  // Bytes of text behind the scored tokens, and the NLL in bits per byte of them: byte-level
  // corpora, sentencepiece, and ids with data.token_bytes (Corpus::counts_bytes); 0 and NaN
  // otherwise.
  int64_t scored_bytes = 0;
  double bits_per_byte = NAN;
  double seconds = 0;
  int64_t windows = 0;
  // Scored tokens by their position in the window (bins without scored tokens left out); the
  // bins' nll_sum and scored_tokens add up to the totals above.
  std::vector<PositionBin> by_position;
  // With spec.keep_token_nll, by the target's stream position (n entries, the evaluated prefix
  // of the stream): its NLL (float64, NaN where not scored) and the window position that
  // predicted it (int64, -1 where not scored). A causal target at window position p had p + 1
  // tokens of context.
  torch::Tensor token_nll;
  torch::Tensor token_position;
  StreamingCache streaming;  // as evaluated (inactive: the plain evaluation)
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
// The tokens one window of `length` reads: a causal window of L inputs needs L + 1 (the last is
// only a target), a masked LM's L.
inline int64_t window_tokens(int64_t length, bool causal) { return length + (causal ? 1 : 0); }
void check_eval_length(const EvalSpec& spec, int64_t available, int64_t split_tokens, bool causal);

// The spec a config asks for at one (length, stride): its eval section's token limit and batch
// size, and its masked-LM selection.
EvalSpec eval_spec_for(const Config& config, int64_t length, int64_t stride = 0);

// Refuses (ConfigError, core/model/memory_estimate.h) a batch of `windows` windows of `length` tokens
// whose activations cannot fit in memory, rather than attempt the allocation, on the attention
// path the model takes now (an evaluation may have forced one: `extrap eval --attention`).
// `attention_length`: the longest span one attention call covers (StreamingLLM: its cache);
// -1: the window length.
void check_window_memory(const TransformerLM& model, int64_t windows, int64_t length,
                         int64_t attention_length = -1);

// Eval mode and a RoPE scaling for one evaluation: the model's training flag and scaling are
// restored when the scope ends, whatever happens.
class EvaluationScope {
 public:
  EvaluationScope(TransformerLM& model, const RopeScaling& scaling, const StreamingCache& streaming = {});
  ~EvaluationScope();
  EvaluationScope(const EvaluationScope&) = delete;
  EvaluationScope& operator=(const EvaluationScope&) = delete;

 private:
  TransformerLM& model_;
  RopeScaling scaling_;
  StreamingCache streaming_;
  bool training_;
};

// Evaluates under NoGradGuard and eval mode (restores the training flag and the model's RoPE
// scaling afterwards). Data parallel (core/runtime/distributed.h): every rank calls it alike, batch k
// of windows is rank k % world's, and the per-position sums are all-reduced, so every rank
// returns the one-process result (same tokens; NLL up to summation order). Throws
// EvalFailure rather than return a number that is not right (see above).
EvalResult evaluate(TransformerLM& model, const Corpus& corpus, const TokenStream& stream,
                    const EvalSpec& spec, torch::Device device = torch::kCPU);

}  // namespace extrap
