// Corpus loading: exact token ids for both tokenisers, single-file splits, the token cache's
// reuse / staleness / corruption handling, and WikiText-2 when ../shared/data has it.
#include "core/base/yaml_options.h"
#include "core/data/corpus.h"
#include "core/data/tokenizer.h"
#include "core/eval/evaluator.h"
#include "core/model/config.h"
#include "core/model/model.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace fs = std::filesystem;
using extrap::CacheStatus;
using extrap::Corpus;
using extrap::CorpusOptions;
using extrap::load_corpus;
using extrap::testing::read_text;
using extrap::testing::TempDir;
using extrap::testing::write_text;

namespace {

std::vector<int32_t> tokens(const extrap::TokenStream& stream) {
  return std::vector<int32_t>(stream.data(), stream.data() + stream.size());
}

// Captures what std::cerr receives while alive.
struct CaptureStderr {
  std::ostringstream text;
  std::streambuf* old = std::cerr.rdbuf(text.rdbuf());
  ~CaptureStderr() { std::cerr.rdbuf(old); }
};

CorpusOptions options_for(const TempDir& dir, const fs::path& path, const std::string& tokenizer) {
  CorpusOptions options;
  options.path = path.string();
  options.tokenizer = extrap::parse_enum<extrap::Tokenizer>(tokenizer, "tokenizer");
  options.cache_dir = (dir.root / "cache").string();
  return options;
}

// A small WikiText-format corpus: words by count the(3) =(2) sat(2), then by first appearance
// Title cat on mat dog, so ids the=3 "="=4 sat=5 Title=6 cat=7 on=8 mat=9 dog=10.
void write_wikitext(const fs::path& dir) {
  fs::create_directories(dir);
  write_text(dir / "wiki.train.tokens", " = Title = \n\n the cat sat on the mat \n the dog sat \n");
  write_text(dir / "wiki.valid.tokens", "the bird sat <unk>\nno newline at end");
  write_text(dir / "wiki.test.tokens", "the\r\ncat\xc2\xa0\x64og\n");  // "\r\n" ends a line; U+00A0 splits
}

}  // namespace

TEST_CASE("word level: <eos> after every line, vocabulary from train by count, <unk>",
          "[corpus]") {
  TempDir dir;
  write_wikitext(dir.root / "tiny");
  const Corpus corpus = load_corpus(options_for(dir, dir.root / "tiny", "word"));

  CHECK(corpus.name == "tiny");
  CHECK_FALSE(corpus.byte_level());
  CHECK(corpus.eos_token == 0);
  CHECK(corpus.unk_token == 1);
  CHECK(corpus.mask_token == 2);
  CHECK(corpus.vocabulary == std::vector<std::string>{"<eos>", "<unk>", "<mask>", "the", "=", "sat",
                                                      "Title", "cat", "on", "mat", "dog"});
  CHECK(corpus.vocab_size == 11);
  // " = Title = " / "" / " the cat sat on the mat " / " the dog sat "
  CHECK(tokens(corpus.train) == std::vector<int32_t>{4, 6, 4, 0, 0, 3, 7, 5, 8, 3, 9, 0, 3, 10, 5, 0});
  // "bird" is not in train; the literal <unk> is the <unk> id; the last line has no line break.
  CHECK(tokens(corpus.valid) == std::vector<int32_t>{3, 1, 5, 1, 0, 1, 1, 1, 1, 0});
  CHECK(tokens(corpus.test) == std::vector<int32_t>{3, 0, 7, 10, 0});
  CHECK(corpus.train.num_bytes() == 52);
  CHECK(corpus.valid.num_bytes() == 36);
  CHECK(corpus.test.num_bytes() == 14);
  CHECK(&corpus.split(extrap::Split::valid) == &corpus.valid);
  CHECK(&corpus.split(extrap::Split::test) == &corpus.test);
  CHECK_THROWS_AS(extrap::parse_enum<extrap::Split>("dev", "eval.split"), extrap::ConfigError);
  CHECK(corpus.token_text(7) == "cat");
}

TEST_CASE("word level: {train,valid,test}.txt directories and blank lines", "[corpus]") {
  TempDir dir;
  fs::create_directories(dir.root / "plain");
  write_text(dir.root / "plain" / "train.txt", "b a b\n\n\n");
  write_text(dir.root / "plain" / "valid.txt", "\n");
  write_text(dir.root / "plain" / "test.txt", "");
  const Corpus corpus = load_corpus(options_for(dir, dir.root / "plain", "word"));
  CHECK(corpus.vocabulary == std::vector<std::string>{"<eos>", "<unk>", "<mask>", "b", "a"});
  CHECK(tokens(corpus.train) == std::vector<int32_t>{3, 4, 3, 0, 0, 0});
  CHECK(tokens(corpus.valid) == std::vector<int32_t>{0});
  CHECK(corpus.test.size() == 0);
}

TEST_CASE("byte level: the exact UTF-8 bytes, <mask> = 256", "[corpus]") {
  TempDir dir;
  const std::string text = "h\xc3\xa9llo \xe2\x82\xac\n\xf0\x9f\x99\x82";  // "héllo €\n🙂"
  fs::create_directories(dir.root / "bytes");
  write_text(dir.root / "bytes" / "train.txt", text);
  write_text(dir.root / "bytes" / "valid.txt", "ab");
  write_text(dir.root / "bytes" / "test.txt", "\n");
  const Corpus corpus = load_corpus(options_for(dir, dir.root / "bytes", "byte"));

  CHECK(corpus.byte_level());
  CHECK(corpus.vocab_size == 257);
  CHECK(corpus.mask_token == 256);
  CHECK(corpus.vocabulary.empty());
  CHECK(tokens(corpus.train) == std::vector<int32_t>{0x68, 0xc3, 0xa9, 0x6c, 0x6c, 0x6f, 0x20, 0xe2,
                                                     0x82, 0xac, 0x0a, 0xf0, 0x9f, 0x99, 0x82});
  CHECK(corpus.train.num_bytes() == 15);
  CHECK(tokens(corpus.valid) == std::vector<int32_t>{'a', 'b'});
  CHECK(tokens(corpus.test) == std::vector<int32_t>{'\n'});
  std::string decoded;
  for (const int32_t id : tokens(corpus.train)) decoded += corpus.token_text(id);
  CHECK(decoded == text);
  CHECK(corpus.token_text(256) == "<mask>");
}

TEST_CASE("single file: contiguous splits cut at line boundaries", "[corpus]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20; ++i) text += "line " + std::string(i % 7, 'x') + std::to_string(i) + "\n";
  write_text(dir.root / "book.txt", text);
  auto options = options_for(dir, dir.root / "book.txt", "byte");
  options.split_fractions = {0.7, 0.2, 0.1};
  const Corpus corpus = load_corpus(options);

  CHECK(corpus.name == "book");
  std::string joined;
  for (const auto* split : {&corpus.train, &corpus.valid, &corpus.test}) {
    std::string part;
    for (const int32_t id : tokens(*split)) part += static_cast<char>(id);
    REQUIRE_FALSE(part.empty());
    CHECK(part.back() == '\n');  // every split ends at a line end, so the next starts a line
    CHECK(split->num_bytes() == static_cast<int64_t>(part.size()));
    joined += part;
  }
  CHECK(joined == text);
  // The first cut is the first line end at or after 70% of the bytes.
  const size_t target = static_cast<size_t>(std::llround(0.7 * text.size()));
  CHECK(static_cast<size_t>(corpus.train.size()) == text.find('\n', target - 1) + 1);

  // Word level over a single file takes its vocabulary from the train range only.
  write_text(dir.root / "words.txt", "a a b\nc\nd\n");
  auto word_options = options_for(dir, dir.root / "words.txt", "word");
  word_options.split_fractions = {0.6, 0.2, 0.2};
  const Corpus words = load_corpus(word_options);
  CHECK(words.vocabulary == std::vector<std::string>{"<eos>", "<unk>", "<mask>", "a", "b"});
  CHECK(tokens(words.train) == std::vector<int32_t>{3, 3, 4, 0});
  CHECK(tokens(words.valid) == std::vector<int32_t>{1, 0});
  CHECK(tokens(words.test) == std::vector<int32_t>{1, 0});

  write_text(dir.root / "one-line.txt", "no line breaks at all");
  CHECK_THROWS_AS(load_corpus(options_for(dir, dir.root / "one-line.txt", "byte")),
                  extrap::ConfigError);
}

TEST_CASE("cache: reused on the second load, rebuilt when the source changes", "[corpus]") {
  TempDir dir;
  const fs::path tiny = dir.root / "tiny";
  write_wikitext(tiny);
  const auto options = options_for(dir, tiny, "word");
  {
    const Corpus first = load_corpus(options);
    CHECK(first.vocabulary_cache == CacheStatus::created);
    CHECK(first.train.cache_status() == CacheStatus::created);
    CHECK(fs::exists(first.train.cache_path()));
    CHECK(fs::path(first.cache_dir).parent_path() == dir.root / "cache");
  }
  {
    const Corpus second = load_corpus(options);
    CHECK(second.vocabulary_cache == CacheStatus::reused);
    for (const auto* split : {&second.train, &second.valid, &second.test}) {
      CHECK(split->cache_status() == CacheStatus::reused);
    }
    CHECK(tokens(second.valid) == std::vector<int32_t>{3, 1, 5, 1, 0, 1, 1, 1, 1, 0});
    CHECK(second.vocab_size == 11);
  }
  SECTION("a changed valid split rebuilds only that split") {
    write_text(tiny / "wiki.valid.tokens", "dog dog\n");
    CaptureStderr captured;
    const Corpus corpus = load_corpus(options);
    CHECK(corpus.vocabulary_cache == CacheStatus::reused);
    CHECK(corpus.train.cache_status() == CacheStatus::reused);
    CHECK(corpus.valid.cache_status() == CacheStatus::rebuilt_stale);
    CHECK(tokens(corpus.valid) == std::vector<int32_t>{10, 10, 0});
    CHECK(corpus.valid.num_bytes() == 8);
    CHECK(captured.text.str().find("stale cache (source changed") != std::string::npos);
  }
  SECTION("a changed train split rebuilds the vocabulary and every split that used it") {
    write_text(tiny / "wiki.train.tokens", "sat sat the\n");
    CaptureStderr captured;
    const Corpus corpus = load_corpus(options);
    CHECK(captured.text.str().find("vocabulary: stale cache (source changed") != std::string::npos);
    CHECK(corpus.vocabulary_cache == CacheStatus::rebuilt_stale);
    CHECK(corpus.vocabulary == std::vector<std::string>{"<eos>", "<unk>", "<mask>", "sat", "the"});
    CHECK(corpus.train.cache_status() == CacheStatus::rebuilt_stale);
    CHECK(corpus.valid.cache_status() == CacheStatus::rebuilt_stale);  // the vocabulary changed
    CHECK(tokens(corpus.valid) == std::vector<int32_t>{4, 1, 3, 1, 0, 1, 1, 1, 1, 0});
  }
}

// An edit that keeps a split's size (a typo fixed, a word swapped for one as long) must be seen
// by content: the split is tokenised again, and what it scores changes, exactly as a load into
// an empty cache gives it.
TEST_CASE("cache: a same-size edit is seen by content and re-tokenised, and the numbers follow",
          "[corpus]") {
  TempDir dir;
  // The tokens of `split` and a tiny model's perplexity over them.
  const auto score = [](const Corpus& corpus, const extrap::TokenStream& split) {
    extrap::Config config = extrap::testing::tiny_config("alibi");
    torch::manual_seed(3);
    auto model = extrap::build_model(config, corpus.vocab_size);
    extrap::EvalSpec spec;
    spec.length = 4;
    return std::make_pair(tokens(split), extrap::evaluate(model, corpus, split, spec).perplexity);
  };
  // The same corpus loaded into a cache directory of its own, for the tokens it must give.
  const auto fresh = [&](const fs::path& path, const std::string& tokenizer) {
    CorpusOptions options = options_for(dir, path, tokenizer);
    options.cache_dir = (dir.root / "fresh-cache").string();
    return load_corpus(options);
  };

  // One letter in the middle, then the last one alone (a hash of part of the text would pass it).
  for (const auto& [valid, edited] : std::vector<std::pair<std::string, std::string>>{
           {"the validation text, long enough\n", "the validatiom text, long enough\n"},
           {"the validation text, long enough.", "the validation text, long enough!"}})
    DYNAMIC_SECTION("byte level: " << edited) {
      const fs::path bytes = dir.root / "bytes";
      fs::create_directories(bytes);
      write_text(bytes / "train.txt", "some training text\n");
      write_text(bytes / "valid.txt", valid);
      write_text(bytes / "test.txt", "test\n");
      const auto options = options_for(dir, bytes, "byte");
      const Corpus first = load_corpus(options);
      const auto before = score(first, first.valid);
      write_text(bytes / "valid.txt", edited);
      CaptureStderr captured;
      const Corpus corpus = load_corpus(options);
      CHECK(corpus.valid.cache_status() == CacheStatus::rebuilt_stale);
      CHECK(corpus.train.cache_status() == CacheStatus::reused);
      CHECK(captured.text.str().find("stale cache (source changed: 33 bytes") != std::string::npos);
      const auto after = score(corpus, corpus.valid);
      const Corpus reference = fresh(bytes, "byte");
      CHECK(after == score(reference, reference.valid));
      CHECK(after.first != before.first);
      CHECK(after.second != before.second);
    }
  SECTION("word level: a word of the valid split swapped for another known word") {
    const fs::path tiny = dir.root / "tiny";
    write_wikitext(tiny);
    const auto options = options_for(dir, tiny, "word");
    CHECK(tokens(load_corpus(options).valid) == std::vector<int32_t>{3, 1, 5, 1, 0, 1, 1, 1, 1, 0});
    write_text(tiny / "wiki.valid.tokens", "the bird mat <unk>\nno newline at end");  // sat -> mat
    CaptureStderr captured;
    const Corpus corpus = load_corpus(options);
    CHECK(corpus.vocabulary_cache == CacheStatus::reused);
    CHECK(corpus.valid.cache_status() == CacheStatus::rebuilt_stale);
    CHECK(tokens(corpus.valid) == std::vector<int32_t>{3, 1, 9, 1, 0, 1, 1, 1, 1, 0});
  }
  SECTION("word level: a word of the train split swapped for a new one changes the vocabulary") {
    const fs::path tiny = dir.root / "tiny";
    write_wikitext(tiny);
    const auto options = options_for(dir, tiny, "word");
    const Corpus first = load_corpus(options);
    CHECK(tokens(first.test) == std::vector<int32_t>{3, 0, 7, 10, 0});  // dog = 10
    const auto before = score(first, first.test);
    // dog -> cow: the same bytes in train, one word out of the vocabulary and one in; test's
    // own text is unchanged, but its "dog" is now unknown.
    write_text(tiny / "wiki.train.tokens", " = Title = \n\n the cat sat on the mat \n the cow sat \n");
    CaptureStderr captured;
    const Corpus corpus = load_corpus(options);
    CHECK(corpus.vocabulary_cache == CacheStatus::rebuilt_stale);
    CHECK(corpus.vocabulary.back() == "cow");
    CHECK(corpus.test.cache_status() == CacheStatus::rebuilt_stale);
    CHECK(tokens(corpus.test) == std::vector<int32_t>{3, 0, 7, 1, 0});  // dog is <unk> now
    const auto after = score(corpus, corpus.test);
    const Corpus reference = fresh(tiny, "word");
    CHECK(reference.vocabulary == corpus.vocabulary);
    CHECK(after == score(reference, reference.test));
    CHECK(after.second != before.second);
  }
}

TEST_CASE("cache: a corrupt file is detected and rebuilt, never used", "[corpus]") {
  TempDir dir;
  const fs::path bytes = dir.root / "bytes";
  fs::create_directories(bytes);
  write_text(bytes / "train.txt", "some training text\n");
  write_text(bytes / "valid.txt", "validation text\n");
  write_text(bytes / "test.txt", "test\n");
  const auto options = options_for(dir, bytes, "byte");
  std::string cache_file;
  std::string good;
  {
    const Corpus corpus = load_corpus(options);
    cache_file = corpus.valid.cache_path();
    good = read_text(cache_file);
  }
  const std::vector<int32_t> expected(std::begin("validation text\n"),
                                      std::end("validation text\n") - 1);

  std::string damaged = good;
  std::string reason;
  SECTION("truncated") {
    damaged.resize(damaged.size() - 4);
    reason = "size";
  }
  SECTION("shorter than the header") {
    damaged.resize(10);
    reason = "truncated";
  }
  SECTION("bad magic") {
    damaged[0] = 'X';
    reason = "bad magic";
  }
  SECTION("a flipped payload byte") {
    damaged[damaged.size() - 3] ^= 0x10;
    reason = "payload checksum";
  }
  SECTION("the payload's last byte flipped") {  // a checksum of part of the payload would pass it
    damaged[damaged.size() - 1] ^= 0x01;
    reason = "payload checksum";
  }
  SECTION("a flipped header byte") {
    damaged[40] ^= 0x01;
    reason = "header checksum";
  }
  write_text(cache_file, damaged);
  CaptureStderr captured;
  const Corpus corpus = load_corpus(options);
  CHECK(corpus.valid.cache_status() == CacheStatus::rebuilt_corrupt);
  CHECK(corpus.train.cache_status() == CacheStatus::reused);
  CHECK(tokens(corpus.valid) == expected);
  CHECK(read_text(cache_file) == good);
  const std::string log = captured.text.str();
  CHECK(log.find("corrupt cache (") != std::string::npos);
  CHECK(log.find(reason) != std::string::npos);
  CHECK(std::count(log.begin(), log.end(), '\n') == 1);
}

TEST_CASE("corpus errors name the path at fault", "[corpus]") {
  TempDir dir;
  const auto message = [&](const CorpusOptions& options) {
    try {
      load_corpus(options);
    } catch (const extrap::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const fs::path missing = dir.root / "missing";
  CHECK_THAT(message(options_for(dir, missing, "word")), Catch::Contains(missing.string()));

  const fs::path partial = dir.root / "partial";
  fs::create_directories(partial);
  write_text(partial / "train.txt", "a b\n");
  write_text(partial / "test.txt", "a b\n");
  CHECK_THAT(message(options_for(dir, partial, "word")),
             Catch::Contains((partial / "valid.txt").string()));

  const fs::path blank = dir.root / "blank";
  fs::create_directories(blank);
  write_text(blank / "train.txt", " \n\t\n");
  write_text(blank / "valid.txt", "a\n");
  write_text(blank / "test.txt", "a\n");
  CHECK_THAT(message(options_for(dir, blank, "word")),
             Catch::Contains((blank / "train.txt").string()) && Catch::Contains("no words"));
  write_text(blank / "train.txt", "");
  CHECK_THAT(message(options_for(dir, blank, "word")), Catch::Contains("is empty"));

  // A split that is a directory (a stream on Linux whose size reads as 2^63 - 1): named, not
  // "out of memory"; for both tokenizers and both split names.
  const fs::path folder = dir.root / "folder";
  fs::create_directories(folder / "valid.txt");
  write_text(folder / "train.txt", "a b\n");
  write_text(folder / "test.txt", "a b\n");
  for (const char* tokenizer : {"word", "byte"})
    CHECK_THAT(message(options_for(dir, folder, tokenizer)),
               Catch::Equals("corpus file '" + (folder / "valid.txt").string() + "' is a directory, not a file"));
  fs::create_directories(folder / "wiki.train.tokens");
  CHECK_THAT(message(options_for(dir, folder, "byte")), Catch::Contains("wiki.train.tokens' is a directory"));
  // No path at all (an empty config file): the key to set.
  CHECK_THAT(message(options_for(dir, "", "byte")), Catch::StartsWith("data.path is not set"));

  // The tokenizer is an enum, decoded once with the config: an unknown one names the key.
  CHECK_THROWS_WITH(extrap::load_config("", {"data.tokenizer=bpe"}),
                    Catch::Contains("data.tokenizer") && Catch::Contains("'bpe' is not one of byte | word"));
}

TEST_CASE("TokenStream::slice is a view that keeps the mapping alive", "[corpus]") {
  TempDir dir;
  write_wikitext(dir.root / "tiny");
  torch::Tensor view;
  {
    const Corpus corpus = load_corpus(options_for(dir, dir.root / "tiny", "word"));
    view = corpus.train.slice(5, 4);
    CHECK(view.data_ptr<int32_t>() == corpus.train.data() + 5);
    CHECK_THROWS(corpus.train.slice(14, 3));
  }
  CHECK(view.dtype() == torch::kInt32);
  CHECK(view.sizes().vec() == std::vector<int64_t>{4});
  CHECK(std::vector<int32_t>(view.data_ptr<int32_t>(), view.data_ptr<int32_t>() + 4) ==
        std::vector<int32_t>{3, 7, 5, 8});

  const auto memory = extrap::TokenStream::from_tokens({5, 6, 7});
  CHECK(memory.num_bytes() == 3);
  CHECK(memory.cache_status() == CacheStatus::not_cached);
  CHECK(memory.slice(1, 2)[1].item<int32_t>() == 7);
}

TEST_CASE("WikiText-2 loads as fairseq would count it", "[corpus]") {
  const fs::path data = fs::path(EXTRAP_SOURCE_DIR) / ".." / "shared" / "data" / "wikitext-2";
  if (!fs::exists(data / "valid.txt") || !fs::exists(data / "test.txt")) {
    extrap::testing::skip_test("no WikiText-2 at " + data.string());
    return;
  }
  // Only valid and test are shared: train on valid, through links (never copies).
  TempDir dir;
  const fs::path corpus_dir = dir.root / "wikitext-2";
  fs::create_directories(corpus_dir);
  fs::create_symlink(fs::canonical(data / "valid.txt"), corpus_dir / "train.txt");
  fs::create_symlink(fs::canonical(data / "valid.txt"), corpus_dir / "valid.txt");
  fs::create_symlink(fs::canonical(data / "test.txt"), corpus_dir / "test.txt");
  const Corpus corpus = load_corpus(options_for(dir, corpus_dir, "word"));

  // fairseq: whitespace tokens of every line, plus one <eos> per line.
  const auto expected_size = [](const fs::path& path) {
    std::ifstream in(path);
    int64_t count = 0;
    for (std::string line; std::getline(in, line); ++count) {
      std::istringstream words(line);
      for (std::string word; words >> word;) ++count;
    }
    return count;
  };
  CHECK(corpus.train.size() == expected_size(data / "valid.txt"));
  CHECK(corpus.test.size() == expected_size(data / "test.txt"));
  CHECK(corpus.valid.num_bytes() == static_cast<int64_t>(fs::file_size(data / "valid.txt")));
  CHECK(tokens(corpus.train) == tokens(corpus.valid));
  CHECK(corpus.vocab_size > 10000);
  CHECK(corpus.vocab_size < 20000);
  CHECK(corpus.vocabulary[3] == "the");

  int64_t eos = 0, unk = 0, out_of_range = 0;
  for (const int32_t id : tokens(corpus.train)) {
    out_of_range += id < 0 || id >= corpus.vocab_size;
    eos += id == corpus.eos_token;
    unk += id == corpus.unk_token;
  }
  CHECK(out_of_range == 0);
  const std::string text = read_text(data / "valid.txt");
  CHECK(eos == std::count(text.begin(), text.end(), '\n'));
  int64_t literal_unk = 0;
  for (size_t at = text.find("<unk>"); at != std::string::npos; at = text.find("<unk>", at + 1)) {
    ++literal_unk;
  }
  CHECK(unk == literal_unk);  // train is valid, so every other word is in the vocabulary
  // The test split has words valid never saw.
  int64_t test_unk = 0;
  for (const int32_t id : tokens(corpus.test)) test_unk += id == corpus.unk_token;
  CHECK(test_unk > 15000);
}
