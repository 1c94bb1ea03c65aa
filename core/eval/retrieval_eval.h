// Retrieval evaluation: exact-match accuracy of a causal model on generated task instances
// (core/data/retrieval_task.h), by total length and by the depth of the key.
//
// An instance counts as correct when greedy decoding after the question gives a right answer:
// exactly the answer's tokens (the number and its full stop: core/data/retrieval_task.h), or for
// variable_tracking the answer's names in any order, then the stop (match_answer). This is
// computed in one forward pass over the instance's `length` tokens (prompt and answer): greedy
// decoding follows the answer exactly when, at every answer position, the most likely token
// given the answer so far is the answer's token. Where it leaves the answer for another right
// one (another of the names), decoding goes on from there, one pass per token
// (greedy_answer_is_right). (The mask token of a byte vocabulary is never a candidate, as in
// `extrap generate`.) The same pass gives the answer's NLL, a soft score (of the answer in its
// own order).
//
// Instances depend only on (task, length, depth, sample, seed) and the tokenizer: every
// method is scored on the same instances.
#pragma once

#include "core/data/retrieval_task.h"
#include "core/eval/evaluator.h"

#include <functional>
#include <vector>

namespace extrap {

struct RetrievalSpec {
  RetrievalTask task = RetrievalTask::passkey;
  int64_t length = 0;                                // tokens per instance
  std::vector<double> depths{0, 25, 50, 75, 100};    // percent
  int64_t samples = 20;                              // instances per depth
  int64_t seed = 1;
  int64_t batch_tokens = 16384;                      // tokens per forward pass
  RopeScaling rope_scaling;                          // rotary and xpos models
  // Called after each forward pass with the instances scored and all of them.
  std::function<void(int64_t done, int64_t total)> on_progress;
};

// One depth of a retrieval evaluation.
//
// Each instance's key sits at the filler's sentence boundary nearest to the asked depth. A short
// filler has few boundaries, and then several asked depths put the key at the same one: at 128
// bytes depths 0, 25 and 50 share a boundary. Such depths are one measurement (the same instances
// but for the seed), so each cell also says where its keys went and which earlier cell placed
// them alike: a table shows a group of such cells once, their counts pooled
// (retrieval_placement_groups).
struct RetrievalCell {
  double depth = 0;          // percent, as asked
  int64_t trials = 0;
  int64_t correct = 0;
  double answer_nll = 0;     // the answer tokens' summed NLL over the trials (nats)
  int64_t answer_tokens = 0;
  // Percent: the mean over the trials of where the key went (filler tokens before it / all).
  // NaN in results files written before it was recorded.
  double placed_depth = NAN;
  // The asked depth of the first cell of the evaluation (in the order of its depths) that puts
  // every instance's key where this cell does, for every filler length its instances have: this
  // cell's own depth when no earlier one does. NaN where not recorded (as placed_depth).
  double same_as = NAN;
  // Whether the cell is the first of its group (same_as is its own depth, or not recorded).
  bool distinct() const { return std::isnan(same_as) || same_as == depth; }
};

// The cells of all depths added up (trials, correct, answer_nll, answer_tokens; depth 0).
RetrievalCell retrieval_totals(const std::vector<RetrievalCell>& cells);

// The cells as measurements: one per group of cells that place the key alike (same_as), in
// the order of their first cells, each with the group's counts summed, its first cell's depth,
// and placed_depth the trial-weighted mean of the group's. `depths` lists each group's asked
// depths. Cells without a recorded placement are groups of their own.
struct RetrievalPlacement {
  RetrievalCell pooled;
  std::vector<double> depths;
};
std::vector<RetrievalPlacement> retrieval_placement_groups(const std::vector<RetrievalCell>& cells);

struct RetrievalResult {
  int64_t length = 0;
  std::vector<RetrievalCell> cells;  // in the order of spec.depths
  int64_t trials = 0;
  int64_t correct = 0;
  double accuracy = NAN;
  double seconds = 0;
  // Each instance's verdict, in (depth, sample) order: instance s of depth d is
  // make(length, d / 100, retrieval_instance_seed(seed, length, d, s)).
  std::vector<uint8_t> correct_by_trial;
};

// The seed of instance `sample` at (length, depth percent) of an evaluation seeded `seed`.
uint64_t retrieval_instance_seed(int64_t seed, int64_t length, double depth, int64_t sample);

// Refuses (ConfigError) depths outside [0, 100] or repeated, samples below 1.
void check_retrieval_spec(const RetrievalSpec& spec);
// Refuses `instances` retrieval instances of `length` tokens that cannot fit in memory, before
// any is built (a ConfigError naming the length; `extrap task --length`, evaluate_retrieval).
void check_instance_memory(int64_t length, int64_t instances);

// What evaluate_retrieval(model, corpus, spec) will cost: its forward passes over every instance
// (forward_flops) and, at the rate this model computes here (timed now on one short window),
// about how long. A retrieval at millions of tokens on a small model passes the memory checks
// and can take days: said before it starts.
struct RetrievalWork {
  int64_t instances = 0;
  double flops = 0;
  double seconds = NAN;  // NaN where the rate could not be measured
  // "" when it takes under `threshold` seconds; else a line saying how long, and what shortens it.
  std::string warning(const std::string& who, double threshold = 300) const;
};
RetrievalWork estimate_retrieval_work(TransformerLM& model, const RetrievalSpec& spec, torch::Device device);

// The most likely next token (never a banned one) of the model reading `sequence` (an
// instance's `length` tokens), at position `row`.
using GreedyStep = std::function<int32_t(const std::vector<int64_t>& sequence, int64_t row)>;

// Whether greedy decoding after the question of `instance` gives a right answer, given its first
// choices: the tokens it chose while they followed the instance's answer, then its first other
// choice if there was one. While the choices are a proper prefix of a right answer
// (match_answer: partial), it asks `step` for the next one, at row prompt_length + chosen - 1 of
// the instance's tokens with the chosen tokens in place of the answer's first ones (the rest of
// the answer pads the sequence to its length; a causal model's earlier rows do not see it), so
// that every row is computed at the length, and under the RoPE scaling, of the batched pass.
bool greedy_answer_is_right(const TaskInstance& instance, std::vector<int32_t> generated,
                            const GreedyStep& step);

// The model's greedy step: one pass over the sequence (as the model is: evaluation mode and
// RoPE scaling are the caller's), row `row`'s most likely token other than `banned` (-1: none).
// Non-finite logits are an EvalFailure. Holds a reference to `model`.
GreedyStep model_greedy_step(TransformerLM& model, int64_t banned, torch::Device device);

// Evaluates under NoGradGuard and eval mode (restored afterwards). A masked LM, a length below
// the task's shortest instance or a non-finite logit is an EvalFailure.
RetrievalResult evaluate_retrieval(TransformerLM& model, const Corpus& corpus,
                                   const RetrievalSpec& spec, torch::Device device = torch::kCPU);

}  // namespace extrap
