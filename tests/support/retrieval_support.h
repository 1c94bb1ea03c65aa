// The retrieval tests' view of a byte-level task instance: the filler as the definition in
// core/data/retrieval_task.h writes it, and instance tokens read back as text.
#pragma once

#include "core/data/corpus.h"
#include "core/eval/generate.h"
#include "tests/support/test_support.h"

#include <algorithm>
#include <string>
#include <vector>

namespace extrap::testing {

inline const std::string kTaskFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
inline const std::vector<size_t> kTaskSentenceStarts{0, 20, 37, 56, 68};  // in kTaskFiller

// A byte-level corpus with no text: all a byte-level task instance needs.
inline Corpus task_byte_corpus() {
  Corpus corpus;
  corpus.name = "bytes";
  corpus.tokenizer = Tokenizer::byte;
  corpus.vocab_size = 257;
  corpus.mask_token = 256;
  return corpus;
}

// Byte tokens [begin, end) as text.
inline std::string bytes_text(const std::vector<int32_t>& tokens, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += char(tokens[i]);
  return out;
}

// The last n bytes of the filler repeated: what an instance's filler must be.
inline std::string filler_tail(size_t n) {
  std::string repeated;
  while (repeated.size() < n) repeated += kTaskFiller;
  return repeated.substr(repeated.size() - n);
}

// Whether position i of a filler of n bytes (its end included) is a sentence start: the
// filler is the last n bytes of the cycle repeated.
inline bool filler_sentence_start(size_t n, size_t i) {
  const size_t cycle = kTaskFiller.size();
  const size_t offset = (cycle - n % cycle) % cycle;
  return i == n || std::count(kTaskSentenceStarts.begin(), kTaskSentenceStarts.end(),
                              (offset + i) % cycle) > 0;
}

// A small causal model (alibi, d_model 64) trained on `task` alone: `sequences` instances of
// seq_len + 1 tokens a step.
inline Config task_config(RetrievalTask task, int64_t seq_len, int64_t sequences, int64_t steps) {
  Config config = tiny_config("alibi");
  config.model.d_model = 64;
  config.model.d_ffn = 256;
  config.task = task;
  config.task_fraction = 1;
  config.train.seq_len = seq_len;
  config.train.batch_tokens = seq_len * sequences;
  config.train.steps = steps;
  config.train.lr = 3e-3;
  config.train.warmup = 20;
  config.train.threads = 2;
  return config;
}

// Greedy decoding with the KV cache (extrap generate): `count` tokens after tokens[0, end),
// never the banned token.
inline std::vector<int32_t> greedy_after(TransformerLM& model, const std::vector<int32_t>& tokens,
                                         int64_t end, int64_t count, int32_t banned) {
  GenerateOptions greedy;
  greedy.temperature = 0;
  greedy.max_new = count;
  greedy.banned = {banned};
  return generate(model, std::vector<int32_t>(tokens.begin(), tokens.begin() + end), greedy);
}

}  // namespace extrap::testing
