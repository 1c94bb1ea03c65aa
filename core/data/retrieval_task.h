// Synthetic retrieval tasks, generated offline and deterministically from a seed: the passkey
// task of the literature (landmark attention, LongLoRA), a multi-key variant with distractors
// (RULER's multi-key needle in a haystack) and RULER's variable tracking. No downloads, no
// randomness outside the seed: the same (task, corpus tokenizer, length, depth, seed) gives the
// same tokens on every machine (the generator is splitmix64, not a standard-library
// distribution).
//
// An instance is exactly `length` tokens: filler text, the key sentence at the chosen depth,
// the question, then the answer (the last tokens):
//   <filler> The pass key is 12345. Remember it. 12345 is the pass key. <filler>
//   What is the pass key? The pass key is| 12345.
// - Filler: "The grass is green. The sky is blue. The sun is yellow. Here we go. There and
//   back again." repeated; it ends with a whole sentence right before the question, so only
//   the instance's first filler sentence may be cut (at its start), as in a window that begins
//   mid-text.
// - The key sentence goes at the sentence boundary of the filler nearest to depth x (filler
//   length): depth 0 puts it before the first whole filler sentence (after the cut one, if
//   any), depth 1 right before the question. `depth` reports where it went.
// - multikey: the key sentences of two other names ("The gold key is 31. Remember it. ...") at
//   random boundaries, and the question asks for the target's name; passkey uses the name
//   "pass".
// - K is uniform in 1..50000.
// - The answer is the number and its full stop (" 12345."), so the instance shows where the
//   number ends: a model that continues with a longer number does not match.
// - variable_tracking (RULER's "vt" with its defaults: one chain, four hops, names of five
//   capital letters, a value uniform in 10000..99999): a chain of five assignment sentences
//     QXLKZ = 12345. BWMRT = QXLKZ. HEPAV = BWMRT. JDUOC = HEPAV. YTNIS = JDUOC.
//   in the filler, in chain order: the first (the value's, the "key sentence") at the boundary
//   nearest the depth, each later one at a uniform boundary at or after the one before. Then
//     Which names hold 12345? They are| QXLKZ BWMRT HEPAV JDUOC YTNIS.
//   The answer names every variable that holds the value, in chain order here; scoring accepts
//   them in any order (match_answer), as RULER's set-valued answer does. The five names are
//   distinct. RULER's "VAR" before each name and its instruction are left out, so that an
//   instance (138 bytes at the least) fits a 256-byte training window with filler around it.
// Adapted to extrap's tokenizers: byte level is the UTF-8 text (the answer " 12345." with its
// space); word level writes punctuation and each digit as words ("The pass key is 1 2 3 4 5 .",
// the answer "1 2 3 4 5 ."), and a variable's name letter by letter ("Q X L K Z"), and refuses a
// corpus whose vocabulary lacks one of the task's words; sentencepiece encodes each sentence,
// the question and the answer (" 12345."; each " NAME" and the stop, which so reads " .") on
// its own (pieces never cross a space, so they join into the whole text's pieces), and refuses
// a model that writes any of them with <unk>; hf (a released model's tokenizer.json, byte-level
// or SentencePiece-style) encodes each text with its space first (" The grass is green.", a
// question as " What is ...", the answer " 12345."), since these tokenizers attach a space to
// the word after it, and every instance is checked: its tokens from its first whole sentence
// on must be exactly the tokenizer's own for their text (refused otherwise, naming the place).
// Instances carry no BOS: like an evaluation window, they begin mid-text.
// The literature's one-line instruction before the filler ("There is an important info hidden
// inside a lot of irrelevant text...") is left out: at byte level it alone fills a 128-token
// window, and extrap's models learn the task from training on it (data.task).
//
// Scoring (core/eval/retrieval_eval.h): greedy decoding after the question must give exactly the
// answer's tokens, or for variable_tracking the answer's names in any order and the stop.
#pragma once

#include "core/base/yaml_options.h"
#include "core/data/corpus.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace extrap {

enum class RetrievalTask { none, passkey, multikey, variable_tracking };
template <>
struct EnumNames<RetrievalTask> {
  static constexpr std::array<std::pair<const char*, RetrievalTask>, 4> table{
      {{"none", RetrievalTask::none},
       {"passkey", RetrievalTask::passkey},
       {"multikey", RetrievalTask::multikey},
       {"variable_tracking", RetrievalTask::variable_tracking}}};
};

inline constexpr int64_t kPasskeyMax = 50000;     // K is uniform in 1..kPasskeyMax
inline constexpr int64_t kMultikeyDistractors = 2;
inline constexpr int64_t kVariableHops = 4;        // variable_tracking: assignments after the first
inline constexpr int64_t kVariableNameLength = 5;  // capital letters per name
inline constexpr int64_t kVariableValueMin = 10000, kVariableValueMax = 99999;

struct TaskInstance {
  std::vector<int32_t> tokens;    // the whole instance: prompt then answer (`length` tokens)
  int64_t prompt_length = 0;      // tokens before the answer (the model reads these)
  std::vector<int32_t> answer;    // == tokens[prompt_length:]
  int64_t key = 0;                // K
  std::string name;               // the key's name ("pass", or the multikey target's)
  int64_t key_begin = 0;          // first token of the target's key sentence
  int64_t key_end = 0;            // one past its last token
  double depth = 0;               // where the key sentence went: filler tokens before it / all
  int64_t filler = 0;             // the filler's tokens (key_placements() takes it)
  std::vector<int64_t> distractor_keys;    // multikey: the other keys, in text order
  std::vector<int64_t> distractor_begins;  // ... and where their sentences begin
  // variable_tracking: the chain's names in assignment order (the first is assigned `key`;
  // `name` is it too), where each assignment sentence begins, and the answer in pieces (each
  // name's tokens, in chain order, then the stop's): the pieces joined are `answer`.
  std::vector<std::string> variables;
  std::vector<int64_t> statement_begins;
  std::vector<std::vector<int32_t>> answer_names;
  std::vector<int32_t> answer_stop;
};

// How a greedy continuation after the question stands against an instance's answer.
enum class AnswerMatch {
  wrong,     // no right answer begins with these tokens
  partial,   // a proper prefix of a right answer
  complete,  // a right answer
};
// The right answers: `answer` itself; for variable_tracking, the answer's names in any order
// (each once), then the stop. Every right answer has answer.size() tokens.
AnswerMatch match_answer(const TaskInstance& instance, const std::vector<int32_t>& generated);

// Deterministic 64-bit mixing of values into one seed (splitmix64 finaliser chain).
uint64_t task_seed(std::initializer_list<uint64_t> values);
// A seed as a uniform number in [0, 1) (its top 53 bits).
double task_unit(uint64_t seed);

class TaskGenerator {
 public:
  // Encodes the task's fixed texts with the corpus's tokenizer. A word-level vocabulary
  // without one of the task's words is a ConfigError naming the word and the corpus.
  TaskGenerator(RetrievalTask task, const Corpus& corpus);

  RetrievalTask task() const { return task_; }
  // The shortest instance (the longest key and names, no filler; with an hf tokenizer every
  // key's sentence and answer counted, since a BPE writes numbers of one length in different
  // counts of tokens; variable tracking: one instance's, which another's may exceed at
  // SentencePiece and hf level).
  int64_t min_length() const;
  // An instance of exactly `length` tokens with the key near `depth` in [0, 1]. A length below
  // min_length() is a ConfigError naming both.
  TaskInstance make(int64_t length, double depth, uint64_t seed) const;
  // The text of tokens (bytes as they are; words joined by spaces).
  std::string text(const std::vector<int32_t>& tokens) const;
  // Where make() puts the key sentence of an instance whose filler has `filler` tokens
  // (TaskInstance::filler) at each of `depths` (in [0, 1]): the filler tokens before it. Two
  // depths with the same placement give the same instance for the same seed: at short lengths
  // the filler has few sentence boundaries, and several depths share one.
  std::vector<int64_t> key_placements(int64_t filler, const std::vector<double>& depths) const;

 private:
  std::vector<int32_t> encode(const std::string& text) const;  // byte or word form of `text`
  // data.tokenizer hf: refuses (ConfigError) an instance whose tokens from `from` (its first
  // whole sentence) are not what the tokenizer writes for their text.
  void check_joined(const std::vector<int32_t>& tokens, int64_t from) const;
  int64_t shortest_instance() const;  // min_length(), worked out once
  std::vector<int32_t> key_sentence(const std::string& name, int64_t key) const;
  TaskInstance make_variable_tracking(int64_t length, double depth, uint64_t seed) const;
  // A sentence to insert into the filler: at filler position `at` (a sentence boundary),
  // ordered by `order` among those at the same position.
  struct Placement {
    int64_t at;
    uint64_t order;
    size_t sentence;
  };
  // The sentence boundaries of a filler of `filler` tokens (the last `filler` tokens of the
  // repeated cycle), its end included; the cut first sentence's start is not one.
  std::vector<int64_t> boundaries(int64_t filler) const;
  // The boundary nearest depth x filler (the lower on a tie); sets out.depth to where it is.
  static int64_t nearest_boundary(const std::vector<int64_t>& boundaries, int64_t filler,
                                  double depth, TaskInstance& out);
  // Appends the filler with the placed sentences to `tokens`; returns where each sentence begins.
  std::vector<int64_t> lay_out(int64_t filler, std::vector<Placement> placements,
                               const std::vector<std::vector<int32_t>>& sentences,
                               std::vector<int32_t>& tokens) const;

  RetrievalTask task_;
  const Corpus& corpus_;
  std::vector<int32_t> filler_;          // one cycle of the filler sentences
  std::vector<int64_t> filler_starts_;   // token offsets of the sentences in one cycle
  std::map<std::string, int32_t> word_ids_;  // word level: the task's words (-1: not in it)
  int64_t min_length_ = 0;
};

}  // namespace extrap
