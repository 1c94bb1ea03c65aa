#include "core/data/retrieval_task.h"

#include "core/data/hf_tokenizer.h"
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
// its own word ("key is 123." -> "key", "is", "1", "2", "3", "."), and a word of capital
// letters alone (a variable's name) letter by letter ("QXL" -> "Q", "X", "L").
std::vector<std::string> word_form(const std::string& text) {
  std::vector<std::string> words;
  std::string current;
  const auto flush = [&] {
    const bool capitals = current.size() > 1 &&
                          std::all_of(current.begin(), current.end(),
                                      [](char c) { return c >= 'A' && c <= 'Z'; });
    if (capitals) {
      for (char c : current) words.push_back(std::string(1, c));
    } else if (!current.empty()) {
      words.push_back(current);
    }
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

// variable_tracking's texts: "QXLKZ = 12345. ", "BWMRT = QXLKZ. ", the question and the
// answer's pieces (" QXLKZ", then "."; in word form the name letter by letter).
std::string assignment_text(const std::string& name, const std::string& value) {
  return name + " = " + value + ". ";
}
std::string variable_question_text(int64_t value) {
  return "Which names hold " + std::to_string(value) + "? They are";
}
const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

// A Hugging Face tokenizer attaches a space to the word after it ("Ġthe", "▁the"), so each of the
// task's texts is written with its space first: " The grass is green." rather than "The grass is
// green. ", and a question after the filler as " What is ...". The instance's text is the same.
std::string hf_form(const std::string& text) {
  if (!text.empty() && text.back() == ' ') return " " + text.substr(0, text.size() - 1);
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z') return " " + text;
  return text;
}

}  // namespace

AnswerMatch match_answer(const TaskInstance& instance, const std::vector<int32_t>& generated) {
  // Whether generated[from, from + count) is piece[0, count).
  const auto begins = [&](const std::vector<int32_t>& piece, size_t from, size_t count) {
    return count <= piece.size() &&
           std::equal(piece.begin(), piece.begin() + long(count), generated.begin() + long(from));
  };
  // The tail from `at` against one last piece: the answer or the stop.
  const auto last = [&](const std::vector<int32_t>& piece, size_t at) {
    const size_t left = generated.size() - at;
    if (!begins(piece, at, left)) return AnswerMatch::wrong;
    return left == piece.size() ? AnswerMatch::complete : AnswerMatch::partial;
  };
  if (instance.answer_names.empty()) return last(instance.answer, 0);
  // Names in any order, each once, then the stop. The names have equal lengths and differ, so
  // no name's tokens begin another's: at most one name matches at each step.
  std::vector<bool> used(instance.answer_names.size(), false);
  size_t at = 0;
  for (size_t found = 0; found < used.size(); ++found) {
    const size_t left = generated.size() - at;
    if (left == 0) return AnswerMatch::partial;
    size_t match = used.size();
    for (size_t n = 0; n < used.size() && match == used.size(); ++n) {
      const auto& piece = instance.answer_names[n];
      if (used[n]) continue;
      if (left < piece.size() && begins(piece, at, left)) return AnswerMatch::partial;
      if (left >= piece.size() && begins(piece, at, piece.size())) match = n;
    }
    if (match == used.size()) return AnswerMatch::wrong;
    used[match] = true;
    at += instance.answer_names[match].size();
  }
  return last(instance.answer_stop, at);
}

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
  // Every text the task can write, with every digit and letter it can use: a word-level
  // vocabulary must have each word, a SentencePiece model must write each without <unk>.
  std::vector<std::string> texts(std::begin(kFillerSentences), std::end(kFillerSentences));
  if (task == RetrievalTask::variable_tracking) {
    texts.push_back(assignment_text(kAlphabet, "1234567890"));
    texts.push_back(variable_question_text(1234567890));
  } else {
    std::vector<std::string> names{kPassName};
    if (task == RetrievalTask::multikey) names.assign(std::begin(kKeyNames), std::end(kKeyNames));
    for (const auto& name : names) {
      texts.push_back(key_text(name, 1234567890));
      texts.push_back(question_text(name));
    }
  }
  if (corpus.word_level()) {
    // The ids of every word the task can write, found in one pass over the vocabulary.
    for (const auto& text : texts)
      for (const auto& word : word_form(text)) word_ids_[word] = -1;
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
  if (corpus.sentencepiece)  // refuses a text the model can only write as <unk> now
    for (const auto& text : texts) encode(text);
  if (corpus.hf)  // refuses a tokenizer that writes any of the texts with <unk> now
    for (const auto& text : texts)
      for (const int32_t id : encode(text))
        if (id == corpus.hf->unk())
          throw ConfigError("retrieval task " + enum_name(task) + ": the tokenizer of corpus '" + corpus.name +
                            "' (data.tokenizer hf) writes part of '" + text + "' as its unk_token");
  min_length_ = shortest_instance();
  if (corpus.hf) make(min_length() + 40, 0.5, 0);  // refuses a tokenizer that joins the pieces differently now
}

void TaskGenerator::check_joined(const std::vector<int32_t>& tokens, int64_t from) const {
  if (!corpus_.hf) return;
  const std::vector<int32_t> pieces(tokens.begin() + from, tokens.end());
  const std::string text = corpus_.hf->decode(pieces);
  const std::vector<int32_t> whole = corpus_.hf->encode_piece(text, /*starts_text=*/false).ids;
  if (whole == pieces) return;
  size_t at = 0;
  while (at < whole.size() && at < pieces.size() && whole[at] == pieces[at]) ++at;
  throw ConfigError("retrieval task " + enum_name(task_) + " on corpus '" + corpus_.name + "': its tokenizer (data.tokenizer hf) writes the task's text with other tokens than its pieces joined "
                    "(from token " + std::to_string(at) + " of \"" + text.substr(0, 80) +
                    "...\"); refused rather than scored on tokens the model would never read");
}

std::vector<int32_t> TaskGenerator::encode(const std::string& text) const {
  if (corpus_.byte_level()) return byte_tokens(text);
  if (corpus_.hf) return corpus_.hf->encode_piece(hf_form(text), /*starts_text=*/false).ids;
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

int64_t TaskGenerator::min_length() const { return min_length_; }

int64_t TaskGenerator::shortest_instance() const {
  if (task_ == RetrievalTask::variable_tracking) {
    // Names and values have fixed lengths: any instance's key sentences, question and answer
    // (at SentencePiece level, one instance's: another's pieces may number differently).
    const TaskInstance sample = make_variable_tracking(-1, 0, 0);
    return int64_t(sample.tokens.size());
  }
  // The longest key (5 digits) and name; the question and answer follow from them.
  int64_t longest = 0;
  std::vector<std::string> names{kPassName};
  if (task_ == RetrievalTask::multikey) names.assign(std::begin(kKeyNames), std::end(kKeyNames));
  const int64_t copies = task_ == RetrievalTask::multikey ? 1 + kMultikeyDistractors : 1;
  if (corpus_.hf) {
    // A BPE writes numbers of one length with different counts of tokens ("50000" may be one,
    // "12345" three): every key's sentence and answer counted, the longest of each taken.
    // Encoded as encode() does (hf_form, not the text's start), in batches through one word cache.
    int64_t sentence = 0, question = 0, answer = 0;
    constexpr int64_t kBatch = 4096;
    for (int64_t first = 1; first <= kPasskeyMax; first += kBatch) {
      std::vector<std::string> texts;
      for (int64_t key = first; key < std::min(first + kBatch, kPasskeyMax + 1); ++key) {
        texts.push_back(hf_form(answer_text(true, key)));
        for (const auto& name : names) texts.push_back(hf_form(key_text(name, key)));
      }
      const auto encoded = corpus_.hf->encode_pieces(texts, /*starts_text=*/false);
      for (size_t i = 0; i < encoded.size(); i += 1 + names.size()) {
        answer = std::max(answer, int64_t(encoded[i].ids.size()));
        for (size_t n = 1; n <= names.size(); ++n) sentence = std::max(sentence, int64_t(encoded[i + n].ids.size()));
      }
    }
    for (const auto& name : names) question = std::max(question, int64_t(encode(question_text(name)).size()));
    return copies * sentence + question + answer;
  }
  for (const auto& name : names) {
    const int64_t sentences = int64_t(key_sentence(name, kPasskeyMax).size()) * copies;
    const int64_t question = int64_t(encode(question_text(name)).size());
    const int64_t answer = int64_t(encode(answer_text(!corpus_.word_level(), kPasskeyMax)).size());
    longest = std::max(longest, sentences + question + answer);
  }
  return longest;
}

std::vector<int64_t> TaskGenerator::boundaries(int64_t filler) const {
  const int64_t cycle = int64_t(filler_.size());
  const int64_t offset = (cycle - filler % cycle) % cycle;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < filler; ++i)
    if (std::binary_search(filler_starts_.begin(), filler_starts_.end(), (offset + i) % cycle))
      out.push_back(i);
  out.push_back(filler);
  return out;
}

int64_t TaskGenerator::nearest_boundary(const std::vector<int64_t>& boundaries, int64_t filler,
                                        double depth, TaskInstance& out) {
  // The boundary nearest depth * filler (the lower on a tie): boundaries are sorted, so it is
  // the last one at or below the wanted position or the first one above it.
  const double wanted = depth * double(filler);
  const auto above = std::upper_bound(boundaries.begin(), boundaries.end(), wanted,
                                      [](double w, int64_t b) { return w < double(b); });
  int64_t at = above == boundaries.end() ? boundaries.back() : *above;
  if (above != boundaries.begin() && std::abs(double(*(above - 1)) - wanted) <= std::abs(double(at) - wanted))
    at = *(above - 1);
  out.depth = filler > 0 ? double(at) / double(filler) : depth;
  out.filler = filler;
  return at;
}

std::vector<int64_t> TaskGenerator::key_placements(int64_t filler, const std::vector<double>& depths) const {
  const std::vector<int64_t> starts = boundaries(filler);
  std::vector<int64_t> out;
  TaskInstance unused;
  for (double depth : depths) out.push_back(nearest_boundary(starts, filler, depth, unused));
  return out;
}

std::vector<int64_t> TaskGenerator::lay_out(int64_t filler, std::vector<Placement> placements,
                                            const std::vector<std::vector<int32_t>>& sentences,
                                            std::vector<int32_t>& tokens) const {
  // The filler is the last `filler` tokens of the repeated cycle: it ends with a whole
  // sentence, right before what follows it.
  const int64_t cycle = int64_t(filler_.size());
  const int64_t offset = (cycle - filler % cycle) % cycle;
  std::stable_sort(placements.begin(), placements.end(),
                   [](const Placement& a, const Placement& b) {
                     return a.at != b.at ? a.at < b.at : a.order < b.order;
                   });
  std::vector<int64_t> begins(sentences.size(), 0);
  int64_t written = 0;  // filler tokens written
  for (const auto& placement : placements) {
    for (; written < placement.at; ++written) tokens.push_back(filler_[(offset + written) % cycle]);
    begins[placement.sentence] = int64_t(tokens.size());
    append(tokens, sentences[placement.sentence]);
  }
  for (; written < filler; ++written) tokens.push_back(filler_[(offset + written) % cycle]);
  return begins;
}

TaskInstance TaskGenerator::make(int64_t length, double depth, uint64_t seed) const {
  if (!(depth >= 0 && depth <= 1))
    throw ConfigError("retrieval depth " + number_text(depth) + ": must be in [0, 1]");
  if (task_ == RetrievalTask::variable_tracking) return make_variable_tracking(length, depth, seed);
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
  // sentences[0] is the target's, then the distractors' in name order.
  std::vector<std::vector<int32_t>> sentences{key_sentence(out.name, out.key)};
  const std::vector<int32_t> question = encode(question_text(out.name));
  out.answer = encode(answer_text(!corpus_.word_level(), out.key));
  std::vector<int64_t> distractor_keys;  // in name order; out.distractor_keys is in text order
  for (const auto& name : others) {
    distractor_keys.push_back(1 + int64_t(random.below(kPasskeyMax)));
    sentences.push_back(key_sentence(name, distractor_keys.back()));
  }

  int64_t fixed = int64_t(question.size() + out.answer.size());
  for (const auto& sentence : sentences) fixed += int64_t(sentence.size());
  const int64_t filler = length - fixed;
  if (filler < 0)
    throw ConfigError("retrieval task " + enum_name(task_) + ": an instance of " +
                      std::to_string(length) + " tokens is too short; it needs at least " +
                      std::to_string(min_length()) + " (the key sentences, question and answer)");

  // Key sentences go at sentence boundaries (the cut first sentence's start is not one, so a
  // key never precedes it): the target's nearest the depth, each distractor's at a uniform one.
  const std::vector<int64_t> starts = boundaries(filler);
  std::vector<Placement> placements{
      {nearest_boundary(starts, filler, depth, out), random.below(1u << 30), 0}};
  for (size_t d = 1; d < sentences.size(); ++d)
    placements.push_back({starts[random.below(starts.size())], random.below(1u << 30), d});

  out.tokens.reserve(size_t(length));
  const std::vector<int64_t> begins = lay_out(filler, placements, sentences, out.tokens);
  out.key_begin = begins[0];
  out.key_end = out.key_begin + int64_t(sentences[0].size());
  std::vector<size_t> order;  // the distractors in text order
  for (size_t d = 1; d < sentences.size(); ++d) order.push_back(d);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return begins[a] < begins[b]; });
  for (size_t d : order) {
    out.distractor_begins.push_back(begins[d]);
    out.distractor_keys.push_back(distractor_keys[d - 1]);
  }
  append(out.tokens, question);
  out.prompt_length = int64_t(out.tokens.size());
  append(out.tokens, out.answer);
  TORCH_CHECK(int64_t(out.tokens.size()) == length, "retrieval instance has ", out.tokens.size(),
              " tokens, not ", length);
  check_joined(out.tokens, starts.front());
  return out;
}

// length < 0: the instance without filler (min_length()).
TaskInstance TaskGenerator::make_variable_tracking(int64_t length, double depth,
                                                   uint64_t seed) const {
  TaskRandom random{seed};
  TaskInstance out;
  const auto values = uint64_t(kVariableValueMax - kVariableValueMin + 1);
  out.key = kVariableValueMin + int64_t(random.below(values));
  while (int64_t(out.variables.size()) < kVariableHops + 1) {
    std::string name;
    for (int64_t c = 0; c < kVariableNameLength; ++c) name += kAlphabet[random.below(26)];
    if (std::find(out.variables.begin(), out.variables.end(), name) == out.variables.end())
      out.variables.push_back(name);
  }
  out.name = out.variables[0];
  std::vector<std::vector<int32_t>> sentences;
  for (size_t v = 0; v < out.variables.size(); ++v)
    sentences.push_back(encode(assignment_text(
        out.variables[v], v == 0 ? std::to_string(out.key) : out.variables[v - 1])));
  const std::vector<int32_t> question = encode(variable_question_text(out.key));
  for (const auto& name : out.variables) {
    out.answer_names.push_back(encode(" " + name));
    append(out.answer, out.answer_names.back());
  }
  out.answer_stop = encode(".");
  append(out.answer, out.answer_stop);

  int64_t fixed = int64_t(question.size() + out.answer.size());
  for (const auto& sentence : sentences) fixed += int64_t(sentence.size());
  const int64_t filler = length < 0 ? 0 : length - fixed;
  if (filler < 0)
    throw ConfigError("retrieval task variable_tracking: an instance of " + std::to_string(length) +
                      " tokens is too short; it needs at least " + std::to_string(fixed) +
                      " (the assignment sentences, question and answer)");
  // The value's assignment nearest the depth, each later one at a uniform boundary at or after
  // the one before; at one boundary they keep chain order.
  const std::vector<int64_t> starts = boundaries(filler);
  std::vector<Placement> placements{{nearest_boundary(starts, filler, depth, out), 0, 0}};
  for (size_t v = 1; v < sentences.size(); ++v) {
    const auto first = std::lower_bound(starts.begin(), starts.end(), placements.back().at);
    const auto choices = uint64_t(starts.end() - first);
    placements.push_back({*(first + long(random.below(choices))), uint64_t(v), v});
  }
  out.tokens.reserve(size_t(std::max<int64_t>(length, fixed)));
  out.statement_begins = lay_out(filler, placements, sentences, out.tokens);
  out.key_begin = out.statement_begins[0];
  out.key_end = out.key_begin + int64_t(sentences[0].size());
  append(out.tokens, question);
  out.prompt_length = int64_t(out.tokens.size());
  append(out.tokens, out.answer);
  TORCH_CHECK(length < 0 || int64_t(out.tokens.size()) == length, "retrieval instance has ",
              out.tokens.size(), " tokens, not ", length);
  check_joined(out.tokens, starts.front());
  return out;
}

std::string TaskGenerator::text(const std::vector<int32_t>& tokens) const {
  if (corpus_.sentencepiece) return corpus_.sentencepiece->decode(tokens);
  if (corpus_.hf) return corpus_.hf->decode(tokens);
  std::string out;
  for (int32_t t : tokens) {
    if (!corpus_.byte_level() && !out.empty()) out += ' ';
    out += corpus_.token_text(t);
  }
  return out;
}

}  // namespace extrap
