// Hugging Face tokenizer.json files (core/data/hf_tokenizer.h) against HF tokenizers itself: small
// byte-level BPEs of each family's style (GPT-2, GPT-NeoX, BLOOM, Llama 3, Qwen2, and the other
// stages extrap reads) and SentencePiece-style ones (Llama 2's and Mistral's files, converted by
// transformers from a tokenizer.model; Metaspace with split) trained by tests/data/check_hf_tokenizer.py on the default corpus, and
// the ids HF gives for the default corpus's splits, WikiText-2 and tinyshakespeare (where
// ../shared/data has them) and hard cases. extrap's ids must equal HF's exactly; the bytes
// credited to the tokens must sum to the text; the text cut at cut_points() and on threads
// must give the same; invalid UTF-8 is refused naming the byte.
#include "core/base/errors.h"
#include "core/data/corpus.h"
#include "core/data/hf_tokenizer.h"
#include "core/data/retrieval_task.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"


#include <cstring>
#include <set>

using namespace extrap;
using namespace extrap::testing;
using Catch::Matchers::Contains;

namespace {

std::vector<int32_t> read_ids(const fs::path& path) {
  const std::string bytes = read_text(path);
  std::vector<int32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

int64_t sum(const std::vector<int32_t>& v) {
  int64_t s = 0;
  for (int32_t x : v) s += x;
  return s;
}

}  // namespace

TEST_CASE("hf tokenizer: exactly HF's ids on real text and hard cases, in any pieces", "[data][hf_tokenizer][python]") {
  TempDir d("hf-tokenizer");
  std::string texts = EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt " EXTRAP_SOURCE_DIR "/data/pydoc/test.txt";
  const fs::path shared = fs::path(EXTRAP_SOURCE_DIR) / ".." / "shared" / "data";
  for (const char* file : {"wikitext-2/valid.txt", "wikitext-2/test.txt", "tinyshakespeare/input.txt"})
    if (fs::exists(shared / file)) texts += " " + (shared / file).string();
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/data/check_hf_tokenizer.py make " + (d.root / "ref").string() + " " + texts);
  INFO(read_text(d.root / "python.log"));
  REQUIRE(code == 0);
  const auto manifest = read_json(d.root / "ref" / "manifest.json");
  int checked = 0;
  for (const auto& style : manifest.at("styles")) {
    const fs::path dir = d.root / "ref" / style.get<std::string>();
    const HfTokenizer tokenizer = HfTokenizer::load((dir / "tokenizer.json").string());
    for (const auto& entry : manifest.at("texts")) {
      const std::string text = read_text(entry.at("path").get<std::string>());
      const std::string tag = style.get<std::string>() + " on " + entry.at("source").get<std::string>();
      INFO(tag);
      if (!entry.at("utf8").get<bool>()) {
        CHECK_THROWS_WITH(tokenizer.encode(text),
                          Contains("byte " + std::to_string(entry.at("invalid_at").get<int>()) + " "));
        continue;
      }
      const auto expected = read_ids(dir / (std::to_string(entry.at("n").get<int>()) + ".ids"));
      const auto whole = tokenizer.encode(text);
      CHECK(whole.ids == expected);
      CHECK(whole.bytes.size() == whole.ids.size());
      CHECK(sum(whole.bytes) == int64_t(text.size()));
      for (size_t piece : {size_t(200), size_t(65536)}) {
        const auto cuts = tokenizer.cut_points(text, piece);
        // The styles whose texts cut_points may cut (proofs in hf_tokenizer.cpp) do cut real text.
        const std::set<std::string> cuttable{"gpt2", "neox", "bloom", "llama3", "qwen2", "mistral-spm", "llama2-spm",
                                             "metaspace-split"};
        if (entry.at("n").get<int>() == 0 && piece == 200) CHECK(cuts.empty() != bool(cuttable.count(style)));
        std::vector<size_t> at{0};
        at.insert(at.end(), cuts.begin(), cuts.end());
        at.push_back(text.size());
        HfTokenizer::Encoded body;
        std::vector<std::string> later;  // the pieces after the first
        std::vector<HfTokenizer::Encoded> later_alone;
        for (size_t i = 0; i + 1 < at.size(); ++i) {
          const auto e = tokenizer.encode_piece(std::string_view(text).substr(at[i], at[i + 1] - at[i]), i == 0);
          body.ids.insert(body.ids.end(), e.ids.begin(), e.ids.end());
          body.bytes.insert(body.bytes.end(), e.bytes.begin(), e.bytes.end());
          if (i > 0) {
            later.push_back(text.substr(at[i], at[i + 1] - at[i]));
            later_alone.push_back(e);
          }
        }
        // One word cache through all of them: each piece's tokens as encode_piece gives them.
        const auto shared = tokenizer.encode_pieces(later, /*starts_text=*/false);
        REQUIRE(shared.size() == later_alone.size());
        for (size_t i = 0; i < shared.size(); ++i) {
          CHECK(shared[i].ids == later_alone[i].ids);
          CHECK(shared[i].bytes == later_alone[i].bytes);
        }
        const auto joined = tokenizer.add_special_tokens(body);
        CHECK(joined.ids == whole.ids);
        CHECK(joined.bytes == whole.bytes);
      }
      // The same text twice through one cache, the second time every word cached.
      const auto twice = tokenizer.encode_pieces({text, text}, /*starts_text=*/true);
      CHECK(tokenizer.add_special_tokens(twice[0]).ids == whole.ids);
      CHECK(twice[1].ids == twice[0].ids);
      CHECK(twice[1].bytes == twice[0].bytes);
      const auto threaded = tokenizer.encode(text, 3);
      CHECK(threaded.ids == whole.ids);
      ++checked;
    }
  }
  // Every style on every valid text (the default corpus's two splits and 17 hard cases at least).
  int64_t valid = 0;
  for (const auto& entry : manifest.at("texts")) valid += entry.at("utf8").get<bool>() ? 1 : 0;
  CHECK(valid >= 19);
  CHECK(checked == int64_t(manifest.at("styles").size()) * valid);
  CHECK(manifest.at("styles").size() == 10);
}

TEST_CASE("hf tokenizer: a corpus tokenised with tokenizer.json, with exact bits per byte", "[data][hf_tokenizer][python]") {
  TempDir d("hf-corpus");
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/data/check_hf_tokenizer.py make " + (d.root / "ref").string() +
                                     " " EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt");
  INFO(read_text(d.root / "python.log"));
  REQUIRE(code == 0);
  const std::string text = read_text(EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt");
  fs::create_directories(d.root / "prose");
  write_text(d.root / "prose/train.txt", text.substr(0, 30000));
  write_text(d.root / "prose/valid.txt", text);
  write_text(d.root / "prose/test.txt", text.substr(30000, 30000));
  CorpusOptions options;
  options.path = (d.root / "prose").string();
  options.tokenizer = Tokenizer::hf;
  options.tokenizer_model = (d.root / "ref" / "llama3" / "tokenizer.json").string();
  options.cache_dir = (d.root / "cache").string();
  const Corpus corpus = load_corpus(options);
  const auto expected = read_ids(d.root / "ref" / "llama3" / "0.ids");  // text 0: valid.txt whole
  REQUIRE(corpus.valid.size() == int64_t(expected.size()));
  CHECK(std::equal(expected.begin(), expected.end(), corpus.valid.data()));
  CHECK(corpus.counts_bytes());
  int64_t bytes = 0;
  for (int64_t i = 0; i < corpus.valid.size(); ++i) bytes += corpus.bytes_at(corpus.valid, i);
  CHECK(bytes == int64_t(text.size()));
  CHECK(corpus.mask_token == -1);
  // The cache is reused, and a model with more rows than the tokenizer has ids pads the vocabulary.
  options.vocab_size = corpus.vocab_size + 3;
  const Corpus padded = load_corpus(options);
  CHECK(padded.vocab_size == corpus.vocab_size + 3);
  CHECK(padded.valid.cache_status() == CacheStatus::reused);
  CHECK(padded.vocabulary_hash() != corpus.vocabulary_hash());
  options.vocab_size = corpus.vocab_size - 1;
  CHECK_THROWS_WITH(load_corpus(options), Contains("the tokenizer does not match the model"));
}

TEST_CASE("hf tokenizer: retrieval instances are the tokenizer's own tokens for their text", "[data][hf_tokenizer][retrieval][python]") {
  TempDir d("hf-retrieval");
  const std::string text = read_text(EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt");
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/data/check_hf_tokenizer.py make " + (d.root / "ref").string() +
                                     " " EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt");
  INFO(read_text(d.root / "python.log"));
  REQUIRE(code == 0);
  fs::create_directories(d.root / "prose");
  for (const char* split : {"train", "valid", "test"}) write_text(d.root / "prose" / (std::string(split) + ".txt"), text.substr(0, 20000));
  for (const std::string style : {"gpt2", "gpt2-prefix", "neox", "bloom", "llama3", "qwen2", "mistral-spm", "llama2-spm",
                                  "metaspace-split", "mixed"}) {
    CorpusOptions options;
    options.path = (d.root / "prose").string();
    options.tokenizer = Tokenizer::hf;
    options.tokenizer_model = (d.root / "ref" / style / "tokenizer.json").string();
    options.cache_dir = (d.root / ("cache-" + style)).string();
    const Corpus corpus = load_corpus(options);
    const HfTokenizer& hf = *corpus.hf;
    for (const RetrievalTask task : {RetrievalTask::passkey, RetrievalTask::multikey, RetrievalTask::variable_tracking}) {
      INFO(style << " " << enum_name(task));
      if (style == "metaspace-split") {
        // A 50-character alphabet without byte fallback: the task's letters become <unk>, refused.
        CHECK_THROWS_WITH(TaskGenerator(task, corpus), Contains("as its unk_token"));
        continue;
      }
      if (style == "mixed") {
        // ByteLevel's add_prefix_space after a Split on " ": every split piece gets a space, so the
        // task's pieces joined are not the tokens of their text; refused rather than scored.
        CHECK_THROWS_WITH(TaskGenerator(task, corpus), Contains("writes the task's text with other tokens than its pieces joined"));
        continue;
      }
      const TaskGenerator generator(task, corpus);
      // (variable tracking's min_length is one instance's: others' names may take more tokens)
      const int64_t shortest = generator.min_length() + (task == RetrievalTask::variable_tracking ? 20 : 0);
      for (const int64_t length : {shortest, shortest + 57, int64_t(400)})
        for (const double depth : {0.0, 0.5, 1.0}) {
          const TaskInstance t = generator.make(length, depth, 7);
          REQUIRE(int64_t(t.tokens.size()) == length);
          // The text from the key sentence on, as the tokenizer itself writes it: the same tokens.
          const std::vector<int32_t> tail(t.tokens.begin() + t.key_begin, t.tokens.end());
          const std::string tail_text = hf.decode(tail);
          CHECK(hf.encode_piece(tail_text, false).ids == tail);
          const std::string k = std::to_string(t.key);
          if (task == RetrievalTask::variable_tracking) {
            CHECK(hf.decode({t.tokens.begin() + t.key_begin, t.tokens.begin() + t.key_end}) == " " + t.name + " = " + k + ".");
            CHECK(hf.decode(t.answer).back() == '.');
          } else {
            CHECK(hf.decode({t.tokens.begin() + t.key_begin, t.tokens.begin() + t.key_end}) ==
                  " The " + t.name + " key is " + k + ". Remember it. " + k + " is the " + t.name + " key.");
            CHECK(hf.decode(t.answer) == " " + k + ".");
            CHECK(tail_text.size() >= std::string(" What is the " + t.name + " key? The " + t.name + " key is").size());
            CHECK_THAT(tail_text, Contains(" What is the " + t.name + " key? The " + t.name + " key is " + k + "."));
          }
        }
    }
  }
}
