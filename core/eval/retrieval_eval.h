// Retrieval evaluation: exact-match accuracy of a causal model on generated task instances
// (core/data/retrieval_task.h), by total length and by the depth of the key.
//
// An instance counts as correct when greedy decoding after the question gives exactly the
// answer's tokens (the number and its full stop: core/data/retrieval_task.h). This is computed in one
// forward pass over the instance's `length` tokens (prompt and answer): greedy decoding follows
// the answer exactly when, at every answer position, the most likely token given the answer so
// far is the answer's token. (The mask token of a byte vocabulary is never a candidate, as in
// `extrap generate`.) The same pass gives the answer's NLL, a soft score.
//
// Instances depend only on (task, length, depth, sample, seed) and the tokenizer: every
// method is scored on the same instances.
#pragma once

#include "core/data/retrieval_task.h"
#include "core/eval/evaluator.h"

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
};

// One depth of a retrieval evaluation.
struct RetrievalCell {
  double depth = 0;          // percent, as asked (each instance's key sits at the filler
                             // sentence boundary nearest to it)
  int64_t trials = 0;
  int64_t correct = 0;
  double answer_nll = 0;     // the answer tokens' summed NLL over the trials (nats)
  int64_t answer_tokens = 0;
};

// The cells of all depths added up (trials, correct, answer_nll, answer_tokens; depth 0).
RetrievalCell retrieval_totals(const std::vector<RetrievalCell>& cells);

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

// Evaluates under NoGradGuard and eval mode (restored afterwards). A masked LM, a length below
// the task's shortest instance or a non-finite logit is an EvalFailure.
RetrievalResult evaluate_retrieval(TransformerLM& model, const Corpus& corpus,
                                   const RetrievalSpec& spec, torch::Device device = torch::kCPU);

}  // namespace extrap
