// data.tokenizer: sentencepiece — models trained in the test with extrap's trainer; every byte of
// a text credited to exactly one token (checked against the pieces' own text, not extrap's
// attribution); corpora loaded, cached and refused by name; retrieval tasks written in pieces.
#include <catch2/catch.hpp>

#include "core/data/corpus.h"
#include "core/data/retrieval_task.h"
#include "core/data/sentencepiece.h"
#include "tests/support/test_support.h"

#include <ATen/Parallel.h>

#include <filesystem>
#include <numeric>

namespace fs = std::filesystem;
using namespace extrap;
using namespace extrap::testing;

namespace {

SentencePieceModel train_model(const std::string& type, int64_t vocab, bool byte_fallback = true,
                               const std::string& text = synthetic_prose(60000, 7)) {
  SentencePieceTraining t;
  t.model_type = type;
  t.vocab_size = vocab;
  t.byte_fallback = byte_fallback;
  t.threads = 2;
  return SentencePieceModel::from_bytes(train_sentencepiece(text, t, "the test's text"), "trained");
}

// The text a piece stands for when it starts a word: "▁" as a space.
std::string spaced(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += piece[i++];
    }
  }
  return out;
}

// Checks encode_lines' contract on `text` whose lines are `lines` with line breaks of
// `breaks` bytes: each line ends with </s>, its tokens' bytes sum to the line and its break.
void require_lines_credited(const SentencePieceModel& model, const std::string& text,
                            const std::vector<std::string>& lines, const std::vector<size_t>& breaks) {
  const auto encoded = model.encode_lines(text);
  REQUIRE(encoded.ids.size() == encoded.bytes.size());
  CHECK(std::accumulate(encoded.bytes.begin(), encoded.bytes.end(), int64_t(0)) == int64_t(text.size()));
  size_t line = 0;
  int64_t sum = 0;
  for (size_t i = 0; i < encoded.ids.size(); ++i) {
    REQUIRE(encoded.bytes[i] >= 0);
    sum += encoded.bytes[i];
    if (encoded.ids[i] != model.eos()) continue;
    REQUIRE(line < lines.size());
    INFO("line " << line << ": '" << lines[line] << "'");
    CHECK(sum == int64_t(lines[line].size() + breaks[line]));
    sum = 0;
    ++line;
  }
  CHECK(line == lines.size());
  CHECK(sum == 0);
}

}  // namespace

TEST_CASE("SentencePiece credits every byte of a text to exactly one token, line by line",
          "[sentencepiece]") {
  for (const std::string type : {"bpe", "unigram"}) {
    INFO(type);
    const SentencePieceModel model = train_model(type, 400);
    CHECK(model.size() == 400);
    CHECK(model.eos() == 2);
    CHECK(model.unk() == 0);

    // Plain single-spaced ASCII lines: a piece covers its own text, the first piece of a line
    // without its word-boundary mark (the model's dummy prefix is not in the text), and </s>
    // the line break. Written from the pieces' text, not from extrap's attribution.
    const std::string plain = "The model was trained on short inputs.\nIt stays flat at 1234 tokens.\n";
    const auto encoded = model.encode_lines(plain);
    bool line_start = true;
    for (size_t i = 0; i < encoded.ids.size(); ++i) {
      const int32_t id = encoded.ids[i];
      INFO("token " << i << " '" << model.piece(id) << "'");
      if (id == model.eos()) {
        CHECK(encoded.bytes[i] == 1);
        line_start = true;
        continue;
      }
      std::string text = spaced(model.piece(id));
      if (line_start && !text.empty() && text[0] == ' ') text.erase(0, 1);
      CHECK(encoded.bytes[i] == int64_t(text.size()));
      line_start = false;
    }
    CHECK(model.decode(model.encode("It stays flat at 1234 tokens.")) == "It stays flat at 1234 tokens.");

    // Blank and whitespace-only lines, "\r\n" and a lone "\r", leading, doubled and trailing
    // whitespace the normaliser drops, characters the model never saw (byte fallback), and a
    // final line without a break.
    const std::vector<std::string> lines = {"  Leading spaces and  doubled  spaces ",
                                            "",
                                            " \t ",
                                            "Windows line",
                                            "old Mac line",
                                            "caf\xC3\xA9 \xE2\x82\xAC 5 \xE6\x97\xA5\xE6\x9C\xAC",
                                            "no break at the end"};
    const std::vector<size_t> breaks = {1, 1, 1, 2, 1, 1, 0};
    const std::string text = lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n" + lines[3] +
                             "\r\n" + lines[4] + "\r" + lines[5] + "\n" + lines[6];
    require_lines_credited(model, text, lines, breaks);
    CHECK(model.decode(model.encode(lines[5])) == lines[5]);  // bytes round-trip
    CHECK(model.piece_text(model.eos()) == "\n");
    CHECK(model.encode_lines("").ids.empty());
  }
}

TEST_CASE("SentencePiece training is deterministic, encoding does not depend on threads, and bad "
          "input is refused by name",
          "[sentencepiece]") {
  const std::string text = synthetic_prose(60000, 11);
  SentencePieceTraining t;
  t.vocab_size = 350;
  t.threads = 2;
  CHECK(train_sentencepiece(text, t, "text") == train_sentencepiece(text, t, "text"));
  const SentencePieceModel model = SentencePieceModel::from_bytes(train_sentencepiece(text, t, "text"), "m");

  // More than one block of lines (about 1 MB each): the same tokens on one thread and on two.
  const std::string big = synthetic_prose(2500000, 3);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = model.encode_lines(big);
  at::set_num_threads(2);
  const auto two = model.encode_lines(big);
  at::set_num_threads(threads);
  CHECK(one.ids == two.ids);
  CHECK(one.bytes == two.bytes);
  CHECK(std::accumulate(one.bytes.begin(), one.bytes.end(), int64_t(0)) == int64_t(big.size()));

  CHECK_THROWS_WITH(SentencePieceModel::from_bytes("not a model", "garbage.model"),
                    Catch::Contains("garbage.model: not a SentencePiece model"));
  TempDir d("spm");
  CHECK_THROWS_WITH(SentencePieceModel::load((d.root / "missing.model").string()),
                    Catch::Contains("missing.model' (data.tokenizer_model): no such file"));
  CHECK_THROWS_WITH(SentencePieceModel::load(d.root.string()), Catch::Contains("not a file"));
  write_text(d.root / "empty.model", "");
  CHECK_THROWS_WITH(SentencePieceModel::load((d.root / "empty.model").string()),
                    Catch::Contains("an empty file, not a SentencePiece model"));
  t.vocab_size = 100000;
  CHECK_THROWS_WITH(train_sentencepiece(text, t, "corpus/train.txt"),
                    Catch::Contains("corpus/train.txt: SentencePiece could not train a unigram model of "
                                    "100000 pieces"));
  t.vocab_size = 350;
  t.model_type = "wordpiece";
  CHECK_THROWS_WITH(train_sentencepiece(text, t, "x"), Catch::Contains("must be unigram or bpe"));
  t.model_type = "bpe";
  CHECK_THROWS_WITH(train_sentencepiece(" \n\n \t\n", t, "blank.txt"),
                    Catch::Contains("blank.txt: has no text to train a tokenizer on"));
}

namespace {

// The retrieval tasks in pieces: a passkey instance reads as the task's text; variable
// tracking encodes each assignment, the question and each name of the answer on its own, and its
// stop too, so that it reads " ." after the last name.
void check_task_texts(const Corpus& corpus) {
  const TaskGenerator passkey(RetrievalTask::passkey, corpus);
  const TaskInstance instance = passkey.make(200, 0.5, 9);
  CHECK(instance.tokens.size() == 200);
  const std::string k = std::to_string(instance.key);
  const std::vector<int32_t> prompt(instance.tokens.begin(), instance.tokens.begin() + instance.prompt_length);
  CHECK_THAT(passkey.text(prompt), Catch::Contains("The pass key is " + k + ". Remember it. " + k +
                                                   " is the pass key."));
  CHECK_THAT(passkey.text(prompt), Catch::EndsWith("What is the pass key? The pass key is"));
  CHECK(passkey.text(instance.answer) == k + ".");  // the leading space is the pieces' boundary
  const std::vector<int32_t> key(instance.tokens.begin() + instance.key_begin,
                                 instance.tokens.begin() + instance.key_end);
  CHECK(passkey.text(key) == "The pass key is " + k + ". Remember it. " + k + " is the pass key.");

  // Variable tracking in pieces: each assignment, the question and each name of the answer
  // encoded on its own; the stop too, so it reads " ." after the last name.
  const TaskGenerator tracking(RetrievalTask::variable_tracking, corpus);
  const TaskInstance chain = tracking.make(400, 0.5, 9);
  CHECK(chain.tokens.size() == 400);
  const std::string chain_prompt =
      tracking.text({chain.tokens.begin(), chain.tokens.begin() + chain.prompt_length});
  CHECK_THAT(chain_prompt, Catch::Contains(chain.variables[0] + " = " + std::to_string(chain.key) + "."));
  for (size_t v = 1; v < chain.variables.size(); ++v)
    CHECK_THAT(chain_prompt, Catch::Contains(chain.variables[v] + " = " + chain.variables[v - 1] + "."));
  CHECK_THAT(chain_prompt, Catch::EndsWith("Which names hold " + std::to_string(chain.key) + "? They are"));
  std::string listed;
  for (const auto& n : chain.variables) listed += (listed.empty() ? "" : " ") + n;
  CHECK(tracking.text(chain.answer) == listed + " .");
  std::vector<int32_t> reversed;
  for (size_t n = chain.answer_names.size(); n-- > 0;)
    reversed.insert(reversed.end(), chain.answer_names[n].begin(), chain.answer_names[n].end());
  reversed.insert(reversed.end(), chain.answer_stop.begin(), chain.answer_stop.end());
  CHECK(match_answer(chain, reversed) == AnswerMatch::complete);
}

}  // namespace

TEST_CASE("a sentencepiece corpus loads with the bytes behind its tokens, is cached per model, and is "
          "refused by name",
          "[corpus][sentencepiece]") {
  TempDir d("spm-corpus");
  fs::create_directories(d.root / "corpus");
  const std::array<std::string, 3> texts = {synthetic_prose(40000, 1), synthetic_prose(6000, 2), synthetic_prose(5000, 3) + "tail"};
  const std::array<const char*, 3> names = {"train.txt", "valid.txt", "test.txt"};
  for (size_t i = 0; i < 3; ++i) write_text(d.root / "corpus" / names[i], texts[i]);
  const SentencePieceModel model = train_model("unigram", 400, true, texts[0]);
  write_text(d.root / "m.model", model.bytes());

  CorpusOptions options;
  options.path = (d.root / "corpus").string();
  options.tokenizer = Tokenizer::sentencepiece;
  options.tokenizer_model = (d.root / "m.model").string();
  options.cache_dir = (d.root / "cache").string();
  for (const CacheStatus expected : {CacheStatus::created, CacheStatus::reused}) {
    const Corpus corpus = load_corpus(options);
    CHECK(corpus.vocab_size == 401);
    CHECK(corpus.mask_token == 400);
    CHECK(corpus.eos_token == 2);
    CHECK(corpus.vocabulary.size() == 400);
    CHECK(corpus.counts_bytes());
    CHECK(corpus.token_text(400) == "<mask>");
    CHECK(corpus.token_text(2) == "</s>");
    const std::array<const TokenStream*, 3> streams = {&corpus.train, &corpus.valid, &corpus.test};
    for (size_t i = 0; i < 3; ++i) {
      INFO(names[i]);
      const TokenStream& s = *streams[i];
      CHECK(s.cache_status() == expected);
      const auto encoded = model.encode_lines(texts[i]);
      REQUIRE(s.size() == int64_t(encoded.ids.size()));
      REQUIRE(s.text_bytes() != nullptr);
      CHECK(std::equal(encoded.ids.begin(), encoded.ids.end(), s.data()));
      CHECK(std::accumulate(s.text_bytes(), s.text_bytes() + s.size(), int64_t(0)) == int64_t(texts[i].size()));
      CHECK(s.num_bytes() == int64_t(texts[i].size()));
      CHECK(corpus.bytes_at(s, 5) == s.text_bytes()[5]);
    }
  }

  // Another model on the same corpus has caches of its own: switching back and forth rebuilds
  // nothing; a changed split is rebuilt.
  const SentencePieceModel other = train_model("bpe", 420, true, texts[0]);
  write_text(d.root / "other.model", other.bytes());
  CorpusOptions with_other = options;
  with_other.tokenizer_model = (d.root / "other.model").string();
  CHECK(load_corpus(with_other).valid.cache_status() == CacheStatus::created);
  CHECK(load_corpus(options).valid.cache_status() == CacheStatus::reused);
  CHECK(load_corpus(with_other).vocab_size == 421);
  CHECK(load_corpus(options).identity()["vocabulary"].as<std::string>() !=
        load_corpus(with_other).identity()["vocabulary"].as<std::string>());
  write_text(d.root / "corpus" / "valid.txt", texts[1] + "more\n");
  CHECK(load_corpus(options).valid.cache_status() == CacheStatus::rebuilt_stale);

  check_task_texts(load_corpus(options));

  // A model that writes the task's digits as <unk> (no digits in its text, no byte fallback).
  std::string letters = texts[0];
  letters.erase(std::remove_if(letters.begin(), letters.end(), [](char c) { return c >= '0' && c <= '9'; }),
                letters.end());
  write_text(d.root / "letters.model", train_model("bpe", 200, false, letters).bytes());
  CorpusOptions no_digits = options;
  no_digits.tokenizer_model = (d.root / "letters.model").string();
  CHECK_THROWS_WITH(TaskGenerator(RetrievalTask::passkey, load_corpus(no_digits)),
                    Catch::Contains("the tokenizer model of corpus 'corpus' writes part of"));

  // Refusals name the key or the file.
  CorpusOptions missing = options;
  missing.tokenizer_model.clear();
  CHECK_THROWS_WITH(load_corpus(missing), Catch::Contains("data.tokenizer sentencepiece needs data.tokenizer_model"));
  missing.tokenizer_model = (d.root / "nope.model").string();
  CHECK_THROWS_WITH(load_corpus(missing), Catch::Contains("nope.model' (data.tokenizer_model): no such file"));
  write_text(d.root / "text.model", "just text");
  missing.tokenizer_model = (d.root / "text.model").string();
  CHECK_THROWS_WITH(load_corpus(missing), Catch::Contains("text.model' (data.tokenizer_model): not a SentencePiece model"));
  CorpusOptions ids_text = options;
  ids_text.tokenizer = Tokenizer::ids;
  CHECK_THROWS_WITH(training_text(ids_text), Catch::Contains("has no text to train a tokenizer on"));
  CHECK(training_text(options).text == texts[0]);
}
