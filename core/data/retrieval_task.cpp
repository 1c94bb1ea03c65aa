#include "core/data/retrieval_task.h"

#include "core/data/sentencepiece.h"
#include "core/data/tokenizer.h"

#include <algorithm>
#include <cmath>

namespace extrap {

namespace {

const char* const kFillerSentences[] = {"The grass is green.", "The sky is blue.",
                                        "The sun is yellow.", "Here we go.",
                                        "There and back again."};
const char* const kKeyNames[] = {"gold", "silver", "iron", "copper", "glass", "stone"};
const char* const kPassName = "pass";

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform draws from one seed, identical on every platform.
struct TaskRandom {
  uint64_t state;
  uint64_t below(uint64_t n) { return splitmix64(state) % n; }  // bias < n / 2^64
};

// The words of `text` as the word tokenizer should see them: punctuation and every digit
// its own word ("key is 123." -> "key", "is", "1", "2", "3", ".").
std::vector<std::string> word_form(const std::string& text) {
  std::vector<std::string> words;
  std::string current;
  const auto flush = [&] {
    if (!current.empty()) words.push_back(current);
    current.clear();
  };
  for (char c : text) {
    if (c == ' ') {
      flush();
    } else if (c == '.' || c == '?' || (c >= '0' && c <= '9')) {
      flush();
      words.push_back(std::string(1, c));
    } else {
      current += c;
    }
  }
  flush();
  return words;
}

std::string key_text(const std::string& name, int64_t key) {
  const std::string k = std::to_string(key);
  return "The " + name + " key is " + k + ". Remember it. " + k + " is the " + name + " key. ";
}

std::string question_text(const std::string& name) {
  return "What is the " + name + " key? The " + name + " key is";
}

// The answer as written after "The pass key is": " 12345." as text ("12345." in word form);
// the full stop ends the number, so a longer number is never a match.
std::string answer_text(bool as_text, int64_t key) {
  std::string out = as_text ? " " : "";
  out += std::to_string(key);
  out += '.';
  return out;
}

void append(std::vector<int32_t>& out, const std::vector<int32_t>& piece) {
  out.insert(out.end(), piece.begin(), piece.end());
}

}  // namespace

double task_unit(uint64_t seed) { return double(seed >> 11) * 0x1.0p-53; }

uint64_t task_seed(std::initializer_list<uint64_t> values) {
  uint64_t state = 0x6a09e667f3bcc908ull;
  for (uint64_t v : values) {
    state ^= v;
    state = splitmix64(state);
  }
  return state;
}

TaskGenerator::TaskGenerator(RetrievalTask task, const Corpus& corpus)
    : task_(task), corpus_(corpus) {
  if (task == RetrievalTask::none) throw ConfigError("retrieval task 'none' generates nothing");
  if (!corpus.has_text())
    throw ConfigError("retrieval task " + enum_name(task) + " writes text, and corpus '" + corpus.name +
                      "' is pre-tokenised (data.tokenizer: ids): its ids have no words to write "
                      "the task with");
  // Every name the task writes keys and questions with.
  std::vector<std::string> names(std::begin(kKeyNames), std::end(kKeyNames));
  names.push_back(kPassName);
  if (corpus.word_level()) {
    // The ids of every word the task can write, found in one pass over the vocabulary.
    std::string all = "0123456789 ";
    for (const char* sentence : kFillerSentences) all += std::string(sentence) + " ";
    for (const auto& name : names)
      all += key_text(name, 1) + question_text(name) + " ";
    for (const auto& word : word_form(all)) word_ids_[word] = -1;
    for (size_t id = 0; id < corpus.vocabulary.size(); ++id) {
      const auto found = word_ids_.find(corpus.vocabulary[id]);
      if (found != word_ids_.end() && found->second < 0) found->second = int32_t(id);
    }
  }
  for (const char* sentence : kFillerSentences) {
    filler_starts_.push_back(int64_t(filler_.size()));
    append(filler_, encode(std::string(sentence) + " "));
  }
  for (const auto& entry : word_ids_) encode(entry.first);  // refuses a missing word now
  if (corpus.sentencepiece) {  // refuses a text the model can only write as <unk> now
    for (const auto& name : names) {
      encode(key_text(name, 1234567890));
      encode(question_text(name));
    }
  }
}

std::vector<int32_t> TaskGenerator::encode(const std::string& text) const {
  if (corpus_.byte_level()) return byte_tokens(text);
  if (corpus_.sentencepiece) {
    // Each piece of the task separately: SentencePiece splits at spaces, and a text's first
    // piece carries its word boundary, so the pieces joined are the whole text's pieces.
    std::vector<int32_t> ids = corpus_.sentencepiece->encode(text);
    for (int32_t id : ids)
      if (id == corpus_.unk_token)
        throw ConfigError("retrieval task " + enum_name(task_) + ": the tokenizer model of corpus '" +
                          corpus_.name + "' writes part of '" + text + "' as <unk>; use a model " +
                          "that covers it (extrap tokenizer train keeps byte fallback on)");
    return ids;
  }
  std::vector<int32_t> ids;
  for (const auto& word : word_form(text)) {
    const auto found = word_ids_.find(word);
    TORCH_CHECK(found != word_ids_.end(), "retrieval task: '", word, "' is not a task word");
    if (found->second < 0)
      throw ConfigError("retrieval task " + enum_name(task_) + ": corpus '" + corpus_.name +
                        "' (word level) has no word '" + word +
                        "' in its vocabulary; use a byte-level corpus or one whose training "
                        "text has the task's words");
    ids.push_back(found->second);
  }
  return ids;
}

std::vector<int32_t> TaskGenerator::key_sentence(const std::string& name, int64_t key) const {
  return encode(key_text(name, key));
}

int64_t TaskGenerator::min_length() const {
  // The longest key (5 digits) and name; the question and answer follow from them.
  int64_t longest = 0;
  std::vector<std::string> names{kPassName};
  if (task_ == RetrievalTask::multikey) names.assign(std::begin(kKeyNames), std::end(kKeyNames));
  for (const auto& name : names) {
    const int64_t sentences = int64_t(key_sentence(name, kPasskeyMax).size()) *
                              (task_ == RetrievalTask::multikey ? 1 + kMultikeyDistractors : 1);
    const int64_t question = int64_t(encode(question_text(name)).size());
    const int64_t answer = int64_t(encode(answer_text(!corpus_.word_level(), kPasskeyMax)).size());
    longest = std::max(longest, sentences + question + answer);
  }
  return longest;
}

TaskInstance TaskGenerator::make(int64_t length, double depth, uint64_t seed) const {
  if (!(depth >= 0 && depth <= 1))
    throw ConfigError("retrieval depth " + number_text(depth) + ": must be in [0, 1]");
  TaskRandom random{seed};
  TaskInstance out;
  out.key = 1 + int64_t(random.below(kPasskeyMax));
  out.name = kPassName;
  std::vector<std::string> others;
  if (task_ == RetrievalTask::multikey) {
    std::vector<std::string> names(std::begin(kKeyNames), std::end(kKeyNames));
    for (int64_t i = int64_t(names.size()) - 1; i > 0; --i)  // Fisher-Yates
      std::swap(names[i], names[random.below(uint64_t(i + 1))]);
    out.name = names[0];
    others.assign(names.begin() + 1, names.begin() + 1 + kMultikeyDistractors);
  }
  const std::vector<int32_t> target = key_sentence(out.name, out.key);
  const std::vector<int32_t> question = encode(question_text(out.name));
  out.answer = encode(answer_text(!corpus_.word_level(), out.key));
  std::vector<int64_t> distractor_keys;  // in name order; out.distractor_keys is in text order
  std::vector<std::vector<int32_t>> distractors;
  for (const auto& name : others) {
    distractor_keys.push_back(1 + int64_t(random.below(kPasskeyMax)));
    distractors.push_back(key_sentence(name, distractor_keys.back()));
  }

  int64_t fixed = int64_t(target.size() + question.size() + out.answer.size());
  for (const auto& d : distractors) fixed += int64_t(d.size());
  const int64_t filler = length - fixed;
  if (filler < 0)
    throw ConfigError("retrieval task " + enum_name(task_) + ": an instance of " +
                      std::to_string(length) + " tokens is too short; it needs at least " +
                      std::to_string(min_length()) + " (the key sentences, question and answer)");

  // The filler is the last `filler` tokens of the repeated cycle: it ends with a whole
  // sentence. Key sentences go at sentence boundaries.
  const int64_t cycle = int64_t(filler_.size());
  const int64_t offset = (cycle - filler % cycle) % cycle;
  // Sentence starts (the end included); the cut first sentence is not one, so a key never
  // precedes it.
  std::vector<int64_t> boundaries;
  for (int64_t i = 0; i < filler; ++i)
    if (std::binary_search(filler_starts_.begin(), filler_starts_.end(), (offset + i) % cycle))
      boundaries.push_back(i);
  boundaries.push_back(filler);
  // The boundary nearest depth * filler (the lower on a tie).
  const double wanted = depth * double(filler);
  int64_t at = boundaries[0];
  for (int64_t b : boundaries)
    if (std::abs(double(b) - wanted) < std::abs(double(at) - wanted)) at = b;
  out.depth = filler > 0 ? double(at) / double(filler) : depth;

  // Insertions: (filler position, order, sentence index); -1 is the target.
  struct Insert {
    int64_t at;
    uint64_t order;
    int64_t which;
  };
  std::vector<Insert> inserts{{at, random.below(1u << 30), -1}};
  for (size_t d = 0; d < distractors.size(); ++d)
    inserts.push_back({boundaries[random.below(boundaries.size())], random.below(1u << 30),
                       int64_t(d)});
  std::sort(inserts.begin(), inserts.end(), [](const Insert& a, const Insert& b) {
    return a.at != b.at ? a.at < b.at : a.order < b.order;
  });

  out.tokens.reserve(size_t(length));
  int64_t written = 0;  // filler tokens written
  for (const auto& insert : inserts) {
    for (; written < insert.at; ++written) out.tokens.push_back(filler_[(offset + written) % cycle]);
    const auto& sentence = insert.which < 0 ? target : distractors[size_t(insert.which)];
    if (insert.which < 0) {
      out.key_begin = int64_t(out.tokens.size());
      out.key_end = out.key_begin + int64_t(sentence.size());
    } else {
      out.distractor_begins.push_back(int64_t(out.tokens.size()));
      out.distractor_keys.push_back(distractor_keys[size_t(insert.which)]);
    }
    append(out.tokens, sentence);
  }
  for (; written < filler; ++written) out.tokens.push_back(filler_[(offset + written) % cycle]);
  append(out.tokens, question);
  out.prompt_length = int64_t(out.tokens.size());
  append(out.tokens, out.answer);
  TORCH_CHECK(int64_t(out.tokens.size()) == length, "retrieval instance has ", out.tokens.size(),
              " tokens, not ", length);
  return out;
}

std::string TaskGenerator::text(const std::vector<int32_t>& tokens) const {
  if (corpus_.sentencepiece) return corpus_.sentencepiece->decode(tokens);
  std::string out;
  for (int32_t t : tokens) {
    if (!corpus_.byte_level() && !out.empty()) out += ' ';
    out += corpus_.token_text(t);
  }
  return out;
}

}  // namespace extrap
