// RULER's variable tracking (core/data/retrieval_task.h): instances rebuilt from their text (a
// chain of five assignments in chain order, the value's nearest the depth), the answer matched
// as a set (any order of the names, then the stop) by match_answer and by greedy decoding that
// goes on past a departure to another name, the word-level form and its refusals, and a small
// model whose every verdict equals greedy decoding with the KV cache, read back as text.
#include "core/data/retrieval_task.h"
#include "core/eval/generate.h"
#include "core/eval/retrieval_eval.h"
#include "core/train/trainer.h"
#include "tests/support/retrieval_support.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <regex>
#include <set>
#include <sstream>

using namespace extrap;
using namespace extrap::testing;
using testing::TempDir;

namespace {

std::vector<int32_t> as_bytes(const std::string& text) { return {text.begin(), text.end()}; }

// A generated answer read as text: the names it lists and whether it ends with the stop.
bool names_and_stop_match(const std::string& generated, const std::vector<std::string>& names) {
  if (generated.empty() || generated.back() != '.') return false;
  std::istringstream words(generated.substr(0, generated.size() - 1));
  std::vector<std::string> listed;
  for (std::string w; words >> w;) listed.push_back(w);
  // Each name once, separated by single spaces, the first after one space.
  std::string rebuilt;
  for (const auto& w : listed) rebuilt += " " + w;
  std::vector<std::string> want = names, got = listed;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  return rebuilt + "." == generated && got == want;
}

}  // namespace

TEST_CASE("variable_tracking instances: five assignments in chain order, rebuilt from the text",
          "[retrieval]") {
  const Corpus corpus = task_byte_corpus();
  const TaskGenerator generator(RetrievalTask::variable_tracking, corpus);
  const std::string question_words = "Which names hold 12345? They are";
  // Five 15-byte sentences ("ABCDE = 12345. "), the question, five " ABCDE" and the stop.
  REQUIRE(generator.min_length() == int64_t(5 * 15 + question_words.size() + 5 * 6 + 1));
  REQUIRE(generator.min_length() == 138);
  const std::regex assignment("([A-Z]{5}) = ([0-9]{5}|[A-Z]{5})\\. ");
  for (int64_t length : {int64_t(138), int64_t(256), int64_t(1000)})
    for (double depth : {0.0, 0.3, 1.0})
      for (uint64_t seed = 1; seed <= 5; ++seed) {
        CAPTURE(length, depth, seed);
        const TaskInstance t = generator.make(length, depth, seed);
        REQUIRE(int64_t(t.tokens.size()) == length);
        REQUIRE(t.key >= 10000);
        REQUIRE(t.key <= 99999);
        const std::string prompt = bytes_text(t.tokens, 0, size_t(t.prompt_length));
        const std::string question = "Which names hold " + std::to_string(t.key) + "? They are";
        REQUIRE(prompt.substr(prompt.size() - question.size()) == question);
        // The assignments, as the text has them.
        std::vector<std::string> names;
        std::vector<int64_t> begins;
        std::string filler;  // the prompt without assignments and question
        size_t last = 0;
        const std::string body = prompt.substr(0, prompt.size() - question.size());
        for (auto it = std::sregex_iterator(body.begin(), body.end(), assignment);
             it != std::sregex_iterator(); ++it) {
          const auto& m = *it;
          if (names.empty()) {
            REQUIRE(m[2] == std::to_string(t.key));
          } else {
            REQUIRE(m[2] == names.back());  // each assigns the one before it
          }
          names.push_back(m[1]);
          begins.push_back(int64_t(m.position()));
          filler += body.substr(last, size_t(m.position()) - last);
          last = size_t(m.position() + m.length());
        }
        filler += body.substr(last);
        REQUIRE(names.size() == 5);
        REQUIRE(std::set<std::string>(names.begin(), names.end()).size() == 5);
        REQUIRE(t.variables == names);
        REQUIRE(t.name == names[0]);
        REQUIRE(t.statement_begins == begins);
        REQUIRE(t.key_begin == begins[0]);
        REQUIRE(t.key_end == begins[0] + 15);
        // The answer lists them in chain order; its pieces join into it.
        std::string answer;
        for (const auto& n : names) answer += " " + n;
        REQUIRE(bytes_text(t.tokens, size_t(t.prompt_length), t.tokens.size()) == answer + ".");
        REQUIRE(t.answer ==
                std::vector<int32_t>(t.tokens.begin() + t.prompt_length, t.tokens.end()));
        REQUIRE(t.answer_names.size() == 5);
        for (size_t n = 0; n < 5; ++n) REQUIRE(t.answer_names[n] == as_bytes(" " + names[n]));
        REQUIRE(t.answer_stop == as_bytes("."));
        // What is left is the filler's tail; every assignment starts at one of its sentences.
        REQUIRE(filler == filler_tail(filler.size()));
        const auto is_start = [&](size_t i) { return filler_sentence_start(filler.size(), i); };
        std::vector<size_t> at;  // in filler coordinates
        for (size_t v = 0; v < 5; ++v) at.push_back(size_t(begins[v]) - 15 * v);
        for (size_t v = 0; v < 5; ++v) REQUIRE(is_start(at[v]));
        // The value's assignment is the one nearest the depth.
        for (size_t i = 0; i <= filler.size(); ++i)
          if (is_start(i))
            REQUIRE(std::abs(double(i) - depth * double(filler.size())) >=
                    std::abs(double(at[0]) - depth * double(filler.size())) - 1e-9);
        if (!filler.empty()) REQUIRE(t.depth == Approx(double(at[0]) / double(filler.size())));
        REQUIRE(generator.make(length, depth, seed).tokens == t.tokens);
      }
  // Over many seeds: values over their range, every letter used, the hops spread out.
  std::set<char> letters;
  int64_t low = 99999, high = 0, spread = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    const TaskInstance t = generator.make(1000, 0.0, seed);
    low = std::min(low, t.key);
    high = std::max(high, t.key);
    for (const auto& n : t.variables) letters.insert(n.begin(), n.end());
    spread += t.statement_begins.back() - t.statement_begins.front() > 400;
  }
  CHECK(low < 11000);
  CHECK(high > 98000);
  CHECK(letters.size() == 26);
  CHECK(spread > 100);
  // Pinned: the same instance on every platform.
  const TaskInstance pinned = generator.make(200, 0.3, 3);
  CHECK(pinned.key == 29053);
  CHECK(pinned.variables == std::vector<std::string>{"DBHIZ", "MGWKA", "JIDWC", "YPYNA", "UTNCJ"});
  CHECK(pinned.key_begin == 28);
  REQUIRE_THROWS_WITH(generator.make(137, 0.5, 1),
                      Catch::Contains("137 tokens is too short") &&
                          Catch::Contains("at least 138"));
}

TEST_CASE("variable_tracking answers: the names in any order, then the stop, and greedy "
          "decoding goes on past a departure to another name",
          "[retrieval]") {
  const Corpus corpus = task_byte_corpus();
  const TaskGenerator generator(RetrievalTask::variable_tracking, corpus);
  const TaskInstance t = generator.make(300, 0.5, 11);
  std::vector<size_t> order{0, 1, 2, 3, 4};
  int permutations = 0;
  do {
    std::string text;
    for (size_t n : order) text += " " + t.variables[n];
    const std::vector<int32_t> tokens = as_bytes(text + ".");
    REQUIRE(tokens.size() == t.answer.size());
    REQUIRE(match_answer(t, tokens) == AnswerMatch::complete);
    for (size_t k = 0; k < tokens.size(); ++k)
      REQUIRE(match_answer(t, {tokens.begin(), tokens.begin() + long(k)}) == AnswerMatch::partial);
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  REQUIRE(permutations == 120);
  const auto names = [&](std::vector<size_t> which, const std::string& end) {
    std::string text;
    for (size_t n : which) text += " " + t.variables[n];
    return as_bytes(text + end);
  };
  CHECK(match_answer(t, names({0, 1, 2, 3, 0}, ".")) == AnswerMatch::wrong);  // one twice
  CHECK(match_answer(t, names({0, 1, 2, 3}, ".")) == AnswerMatch::wrong);     // one left out
  CHECK(match_answer(t, names({0, 1, 2, 3, 4}, ". ")) == AnswerMatch::wrong);  // past the stop
  CHECK(match_answer(t, names({0, 1, 2, 3, 4}, " ")) == AnswerMatch::wrong);
  CHECK(match_answer(t, names({4, 3}, "")) == AnswerMatch::partial);
  CHECK(match_answer(t, as_bytes(" a")) == AnswerMatch::wrong);  // begins no name
  CHECK(match_answer(t, {}) == AnswerMatch::partial);

  // Greedy decoding with a stand-in for the model that writes a given answer: each step sees
  // the instance's length with the tokens chosen so far in place, and the answer's tail after.
  const auto decode = [&](const std::vector<int32_t>& writes, std::vector<int32_t> first,
                          int* steps) {
    *steps = 0;
    const GreedyStep step = [&](const std::vector<int64_t>& sequence, int64_t row) {
      ++*steps;
      REQUIRE(sequence.size() == t.tokens.size());
      const size_t chosen = size_t(row - t.prompt_length + 1);
      for (size_t p = 0; p < sequence.size(); ++p) {
        const size_t a = p - size_t(t.prompt_length);
        const bool chosen_here = p >= size_t(t.prompt_length) && a < chosen;
        const int64_t expected = chosen_here ? writes[a] : t.tokens[p];
        REQUIRE(sequence[p] == expected);
      }
      return writes[chosen];
    };
    return greedy_answer_is_right(t, std::move(first), step);
  };
  int steps = 0;
  // The canonical answer followed to the end: no step.
  CHECK(decode(t.answer, t.answer, &steps));
  CHECK(steps == 0);
  // The first name right, then another of the names: the batched pass saw 7 + 1 tokens.
  std::vector<int32_t> other = names({0, 2, 1, 4, 3}, ".");
  CHECK(decode(other, {other.begin(), other.begin() + 8}, &steps));
  CHECK(steps == int(other.size()) - 8);
  // Names in reverse order from the first letter on.
  other = names({4, 3, 2, 1, 0}, ".");
  CHECK(decode(other, {other.begin(), other.begin() + 2}, &steps));
  CHECK(steps == int(other.size()) - 2);
  // A name twice: wrong at the first of its letters that begins none of the names left, with
  // no step after it.
  other = names({0, 2, 2, 1, 4}, ".");
  size_t wrong_at = 13;  // tokens; the second copy begins at token 12 with a space
  const auto begins_a_name_left = [&](size_t end) {
    for (size_t n : {1, 3, 4}) {
      const std::string piece = " " + t.variables[n];
      if (std::equal(other.begin() + 12, other.begin() + long(end), piece.begin())) return true;
    }
    return false;
  };
  while (begins_a_name_left(wrong_at)) ++wrong_at;
  REQUIRE(wrong_at <= 18);
  CHECK_FALSE(decode(other, {other.begin(), other.begin() + 8}, &steps));
  CHECK(steps == int(wrong_at) - 8);
  // A departure that begins no name: wrong at once.
  CHECK_FALSE(decode(t.answer, {t.answer[0], '?'}, &steps));
  CHECK(steps == 0);

  // passkey's one answer: a departure is wrong at once.
  const TaskGenerator passkey(RetrievalTask::passkey, corpus);
  const TaskInstance p = passkey.make(200, 0.5, 3);
  CHECK(match_answer(p, p.answer) == AnswerMatch::complete);
  CHECK(match_answer(p, {p.answer.begin(), p.answer.end() - 1}) == AnswerMatch::partial);
  std::vector<int32_t> longer = p.answer;
  longer.push_back('0');
  CHECK(match_answer(p, longer) == AnswerMatch::wrong);
  CHECK(match_answer(p, {p.answer[0], p.answer[1] == '9' ? '8' : '9'}) == AnswerMatch::wrong);
}

TEST_CASE("variable_tracking at word level: names letter by letter, a missing letter refused, "
          "and passkey needs only its own words",
          "[retrieval]") {
  std::string words =
      "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back "
      "again . Which names hold ? They are = 0 1 2 3 4 5 6 7 8 9";
  for (char c = 'A'; c <= 'Z'; ++c) words += std::string(" ") + c;
  const auto corpus_of = [](const std::string& text, const TempDir& dir) {
    for (const char* split : {"train", "valid", "test"})
      testing::write_text(dir.root / (std::string(split) + ".txt"), text + "\n");
    CorpusOptions options;
    options.path = dir.root.string();
    options.tokenizer = Tokenizer::word;
    options.cache_dir = (dir.root / "cache").string();
    return load_corpus(options);
  };
  TempDir dir("vt-words");
  const Corpus corpus = corpus_of(words, dir);
  const TaskGenerator generator(RetrievalTask::variable_tracking, corpus);
  const TaskInstance t = generator.make(120, 0.5, 4);
  REQUIRE(t.tokens.size() == 120);
  const auto spelled = [](const std::string& s) {
    std::string out;
    for (char c : s) out.append(out.empty() ? "" : " ").append(1, c);
    return out;
  };
  std::string answer;
  for (const auto& n : t.variables) answer.append(answer.empty() ? "" : " ").append(spelled(n));
  CHECK(generator.text(t.answer) == answer + " .");
  CHECK(generator.text({t.tokens.begin() + t.key_begin, t.tokens.begin() + t.key_end}) ==
        spelled(t.variables[0]).append(" = ").append(spelled(std::to_string(t.key))).append(" ."));
  CHECK(generator.text({t.tokens.begin() + t.statement_begins[1],
                        t.tokens.begin() + t.statement_begins[1] + 12}) ==
        spelled(t.variables[1]) + " = " + spelled(t.variables[0]) + " .");
  std::vector<int32_t> reversed;
  for (size_t n = t.answer_names.size(); n-- > 0;)
    reversed.insert(reversed.end(), t.answer_names[n].begin(), t.answer_names[n].end());
  reversed.insert(reversed.end(), t.answer_stop.begin(), t.answer_stop.end());
  CHECK(match_answer(t, reversed) == AnswerMatch::complete);

  TempDir lacking_dir("vt-words-lacking");
  std::string lacking = words;
  lacking.erase(lacking.find(" Q "), 2);
  const Corpus lacking_corpus = corpus_of(lacking, lacking_dir);
  CHECK_THROWS_WITH(TaskGenerator(RetrievalTask::variable_tracking, lacking_corpus),
                    Catch::Contains("no word 'Q'") && Catch::Contains("word level"));
  // passkey's words without capital letters or multikey's names: passkey is written, multikey
  // refused for the name it lacks.
  TempDir passkey_dir("vt-words-passkey");
  const Corpus plain = corpus_of(
      "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back "
      "again . pass key Remember it the What ? 0 1 2 3 4 5 6 7 8 9",
      passkey_dir);
  CHECK(TaskGenerator(RetrievalTask::passkey, plain).make(120, 0.5, 1).tokens.size() == 120);
  CHECK_THROWS_WITH(TaskGenerator(RetrievalTask::multikey, plain), Catch::Contains("no word '"));
}

TEST_CASE("a small model trained on variable_tracking: each verdict equal to greedy decoding "
          "with the KV cache, read back as names",
          "[retrieval][slow]") {
  auto corpus = testing::tiny_byte_corpus();
  // Not long enough to learn the task: what is checked is that each verdict is greedy
  // decoding's, right or wrong.
  Config config = task_config(RetrievalTask::variable_tracking, 160, 8, 300);
  TempDir dir("vt-train");
  config.train.out_dir = (dir.root / "run").string();
  {
    Config short_window = config;
    short_window.train.seq_len = 120;
    REQUIRE_THROWS_WITH(Trainer(short_window, corpus),
                        Catch::Contains("data.task variable_tracking needs 138-token instances"));
  }
  Trainer trainer(config, corpus);
  trainer.quiet = true;
  trainer.run(RunStart::fresh);
  TransformerLM& model = trainer.model();

  RetrievalSpec spec;
  spec.task = RetrievalTask::variable_tracking;
  spec.depths = {0, 50, 100};
  spec.samples = 5;
  spec.seed = 4;
  const TaskGenerator generator(RetrievalTask::variable_tracking, corpus);
  int64_t names_first = 0;  // instances whose greedy answer begins with a name of the chain
  int64_t continued = 0;    // instances decoded on past the batched pass
  for (int64_t length : {int64_t(161), int64_t(320)}) {
    spec.length = length;
    const RetrievalResult r = evaluate_retrieval(model, corpus, spec);
    REQUIRE(r.trials == 15);
    size_t trial = 0;
    for (double depth : spec.depths)
      for (int64_t s = 0; s < spec.samples; ++s, ++trial) {
        const TaskInstance t = generator.make(
            length, depth / 100.0, retrieval_instance_seed(spec.seed, length, depth, s));
        const auto out = greedy_after(model, t.tokens, t.prompt_length, int64_t(t.answer.size()),
                                      corpus.mask_token);
        const std::string text = bytes_text(out, 0, out.size());
        CAPTURE(length, depth, s, text);
        REQUIRE(bool(r.correct_by_trial[trial]) == names_and_stop_match(text, t.variables));
        for (const auto& n : t.variables) names_first += text.rfind(" " + n, 0) == 0;
        // Where greedy decoding left the answer for the start of another right one, the
        // evaluation decoded on.
        size_t departure = 0;
        while (departure < out.size() && out[departure] == t.answer[departure]) ++departure;
        if (departure < out.size())
          continued += match_answer(t, {out.begin(), out.begin() + long(departure) + 1}) ==
                       AnswerMatch::partial;
      }
  }
  WARN("greedy answers that begin with one of the chain's names: " << names_first << " of 30; "
       << continued << " decoded on past a departure");

  // The greedy step that decodes on, against generate's first token with the KV cache from
  // the same prefix, at rows across an instance.
  const TaskInstance t = generator.make(320, 0.5, 77);
  const GreedyStep step = model_greedy_step(model, corpus.mask_token, torch::kCPU);
  model->eval();
  const std::vector<int64_t> sequence(t.tokens.begin(), t.tokens.end());
  for (int64_t row : {int64_t(0), int64_t(100), t.prompt_length - 1, int64_t(318)}) {
    const auto first = greedy_after(model, t.tokens, row + 1, 1, corpus.mask_token);
    CHECK(step(sequence, row) == first[0]);
  }
}
