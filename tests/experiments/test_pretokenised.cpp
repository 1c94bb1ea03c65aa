// data.tokenizer: ids — splits tokenised elsewhere, as NumPy writes them (.npy, and nanoGPT's
// raw .bin of uint16 or uint32): loaded with the right ids and vocabulary, trained and
// evaluated through the CLI, and every bad file refused in one line naming it.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/data/corpus.h"
#include "core/data/retrieval_task.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using namespace extrap;
using namespace extrap::testing;

namespace {

constexpr int64_t kVocab = 1000;

// The id at position i of split s (0 train, 1 valid, 2 test): what the NumPy script writes too.
int64_t id_at(int64_t s, int64_t i) { return (i * 7919 + i / 3 + s * 101) % kVocab; }

// Writes, with NumPy, tok-npy/ (train uint16, valid int64, test uint32 .npy) and tok-bin/
// (nanoGPT-style raw uint16 .bin) with the ids of id_at, plus the bad files the test needs.
const char* const kWriter = R"(import numpy as np, os
def ids(s, n):
    i = np.arange(n, dtype=np.int64)
    return (i * 7919 + i // 3 + s * 101) % 1000
sizes = {"train": 6000, "valid": 1500, "test": 1500}
os.makedirs("tok-npy", exist_ok=True); os.makedirs("tok-bin", exist_ok=True)
for s, (name, n) in enumerate(sizes.items()):
    dtype = {"train": np.uint16, "valid": np.int64, "test": np.uint32}[name]
    np.save(f"tok-npy/{name}.npy", ids(s, n).astype(dtype))
    ids(s, n).astype(np.uint16).tofile(f"tok-bin/{name}.bin")
    ids(s, n).astype(np.uint32).tofile(f"tok-bin32-{name}.bin")
np.save("two-d.npy", ids(0, 20).reshape(10, 2).astype(np.uint16))
# data.token_bytes: id i stands for (i * 37) % 7 bytes of text (0 for some, as a control id).
np.save("bytes.npy", ((np.arange(1000) * 37) % 7).astype(np.uint8))
np.save("bytes-short.npy", np.ones(999, dtype=np.int32))
negative = np.ones(1000, dtype=np.int16); negative[3] = -1; np.save("bytes-negative.npy", negative)
np.save("floats.npy", ids(0, 20).astype(np.float32))
print("written")
)";

const char* const kIdsTrain = R"(data: {path: tok-bin, tokenizer: ids, vocab_size: 1000, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: alibi
train: {seq_len: 16, batch_tokens: 256, steps: 10, lr: 0.003, warmup: 2, validate_every: 5,
        validate_tokens: 512, checkpoint_every: 5, log_every: 5, threads: 1, out_dir: runs/ids}
eval: {lengths: [16, 32], max_tokens: 1024}
)";

// A test directory with the NumPy-written splits of kWriter.
struct IdsDir : SweepDir {
  IdsDir() {
    write_text(root / "writer.py", kWriter);
    std::string out;
    REQUIRE(run_python(*this, "writer.py", &out) == 0);
  }
};

CorpusOptions ids_options(const TempDir& d, const std::string& dir, IdsType dtype = IdsType::uint16) {
  CorpusOptions options;
  options.path = (d.root / dir).string();
  options.tokenizer = Tokenizer::ids;
  options.vocab_size = kVocab;
  options.ids_dtype = dtype;
  options.cache_dir = (d.root / "cache").string();
  return options;
}

void require_ids(const Corpus& corpus) {
  CHECK(corpus.vocab_size == kVocab + 1);
  CHECK(corpus.mask_token == kVocab);
  const std::array<const TokenStream*, 3> streams = {&corpus.train, &corpus.valid, &corpus.test};
  const std::array<int64_t, 3> sizes = {6000, 1500, 1500};
  for (int64_t s = 0; s < 3; ++s) {
    REQUIRE(streams[size_t(s)]->size() == sizes[size_t(s)]);
    for (int64_t i = 0; i < sizes[size_t(s)]; ++i)
      if (streams[size_t(s)]->data()[i] != id_at(s, i)) FAIL("split " << s << " position " << i);
  }
}

void require_refused(const CorpusOptions& options, const std::string& message) {
  CHECK_THROWS_WITH(load_corpus(options), Catch::Contains(message));
}

}  // namespace

TEST_CASE("pre-tokenised splits load as NumPy wrote them, and bad files are refused by name",
          "[corpus][ids]") {
  IdsDir d;
  std::string out;

  // .npy of three dtypes, raw uint16 .bin, raw uint32 .bin: the same ids, twice (made, then
  // reused from the cache).
  for (int pass = 0; pass < 2; ++pass) {
    require_ids(load_corpus(ids_options(d, "tok-npy")));
    require_ids(load_corpus(ids_options(d, "tok-bin")));
  }
  fs::create_directories(d.root / "tok-bin32");
  for (const char* split : {"train", "valid", "test"})
    fs::rename(d.root / (std::string("tok-bin32-") + split + ".bin"),
               d.root / "tok-bin32" / (std::string(split) + ".bin"));
  require_ids(load_corpus(ids_options(d, "tok-bin32", IdsType::uint32)));
  // uint32 files read as uint16: a different corpus, and every id is checked.
  const Corpus misread = load_corpus(ids_options(d, "tok-bin32"));
  CHECK(misread.train.size() == 12000);
  CHECK(misread.identity()["train"].as<std::string>() !=
        load_corpus(ids_options(d, "tok-bin32", IdsType::uint32)).identity()["train"].as<std::string>());

  // Retrieval tasks need text.
  const Corpus corpus = load_corpus(ids_options(d, "tok-bin"));
  CHECK_THROWS_WITH(TaskGenerator(RetrievalTask::passkey, corpus),
                    Catch::Contains("is pre-tokenised (data.tokenizer: ids): its ids have no words"));
  CHECK(corpus.token_text(17) == "17");

  // Bad files, each named.
  fs::path bin = d.root / "tok-bin";
  std::string train = read_text(bin / "train.bin");
  write_text(bin / "train.bin", train + "x");  // an odd byte count
  require_refused(ids_options(d, "tok-bin"),
                  "train.bin: 12001 bytes is not a whole number of uint16 ids (2 bytes each)");
  std::string bad = train;
  bad[6] = char(0xE8), bad[7] = char(0x03);  // id 1000 at position 3
  write_text(bin / "train.bin", bad);
  require_refused(ids_options(d, "tok-bin"),
                  "train.bin: id 1000 at position 3 is outside the vocabulary (data.vocab_size 1000)");
  write_text(bin / "train.bin", train);
  write_text(bin / "valid.bin", "");
  require_refused(ids_options(d, "tok-bin"), "valid.bin: holds no token ids (an empty split)");
  fs::copy_file(d.root / "tok-npy/valid.npy", bin / "valid.npy");
  require_refused(ids_options(d, "tok-bin"), "has both valid.bin and valid.npy: keep one");
  fs::remove(bin / "valid.bin");
  require_ids(load_corpus(ids_options(d, "tok-bin")));  // .bin and .npy splits mix
  fs::path npy = d.root / "tok-npy";
  fs::copy_file(d.root / "two-d.npy", npy / "test.npy", fs::copy_options::overwrite_existing);
  require_refused(ids_options(d, "tok-npy"), "test.npy: shape (10, 2): the ids must be one-dimensional");
  fs::copy_file(d.root / "floats.npy", npy / "test.npy", fs::copy_options::overwrite_existing);
  require_refused(ids_options(d, "tok-npy"), "test.npy: dtype '<f4' is not an integer type");
  const std::string whole = read_text(npy / "train.npy");
  write_text(npy / "test.npy", whole.substr(0, whole.size() - 4));
  require_refused(ids_options(d, "tok-npy"),
                  "test.npy: holds 11996 bytes of data, its header says 6000 ids of 2 bytes: the "
                  "file is truncated or damaged");
  write_text(npy / "test.npy", "not numpy");
  require_refused(ids_options(d, "tok-npy"), "test.npy: not a .npy file (no \\x93NUMPY magic)");
  fs::remove(npy / "test.npy");
  require_refused(ids_options(d, "tok-npy"), "has no test split: expected");
  CorpusOptions file = ids_options(d, "two-d.npy");
  require_refused(file, "is a file; data.tokenizer ids reads a directory");
}

TEST_CASE("a pre-tokenised corpus trains and evaluates through the CLI, and its keys are checked",
          "[cli][ids]") {
  IdsDir d;
  std::string out;
  write_text(d.root / "ids.yaml", kIdsTrain);
  REQUIRE(run_cli(d, {"train", "-c", "ids.yaml", "--json", "ids.json"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("corpus tok-bin (ids, vocabulary 1001)"));
  CHECK_THAT(out, Catch::Contains("scoring the first 1024 of 1500 tokens"));
  CHECK_THAT(out, Catch::Contains("ids tokens here do not say how many bytes they cover"));
  CHECK(out.find("nan") == std::string::npos);
  // A uniform guess over 1001 tokens scores ln 1001 = 6.91; ten steps must stay below 2 ln V.
  CHECK_THAT(read_text(d.root / "ids.json"), Catch::Contains("\"status\": \"ok\""));
  REQUIRE(run_cli(d, {"generate", "--checkpoint", "runs/ids", "--prompt", "17 42 7", "--max-new", "4"},
                  &out) == 0);
  CHECK(run_cli(d, {"generate", "--checkpoint", "runs/ids", "--prompt", "17 x", "--max-new", "4"},
                &out) == 2);
  require_one_line_error(out, "--prompt: 'x' is not a token id below 1000");

  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.vocab_size=0"}, &out) == 2);
  require_one_line_error(out, "key 'data.vocab_size' (set on the command line or by a sweep's grid): "
                              "is required with tokenizer ids");
  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.tokenizer=byte", "--set",
                    "data.path=corpus"},
                &out) == 2);
  require_one_line_error(out, "key 'data.vocab_size': is an option of tokenizer ids");
  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "train.out_dir=runs/task", "--set",
                    "data.task=passkey", "--set", "data.task_fraction=0.5"},
                &out) == 2);
  require_one_line_error(out, "its ids have no words to write the task with");
}

TEST_CASE("data.token_bytes: bits per byte of pre-tokenised text, from the bytes behind each id",
          "[cli][ids]") {
  IdsDir d;
  std::string out;
  write_text(d.root / "ids.yaml", kIdsTrain);
  REQUIRE(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.token_bytes=bytes.npy", "--set",
                      "train.out_dir=runs/tb", "--json", "tb.json"},
                  &out) == 0);
  CHECK(out.find("do not say how many bytes") == std::string::npos);
  // Written from the definition: the non-overlapping windows over the first 1024 ids of valid
  // score targets 1 .. 1023, each standing for (id * 37) % 7 bytes.
  int64_t bytes = 0;
  for (int64_t i = 1; i < 1024; ++i) bytes += (id_at(1, i) * 37) % 7;
  const auto document = nlohmann::json::parse(read_text(d.root / "tb.json"));
  const auto& rows = document.at("evaluation").at("results");
  REQUIRE(rows.size() == 2);
  for (const auto& row : rows) {
    INFO(row.dump());
    REQUIRE(row.at("status") == "ok");
    CHECK(row.at("scored_tokens").get<int64_t>() == 1023);
    CHECK(row.at("scored_bytes").get<int64_t>() == bytes);
    const double expected = row.at("nll_sum").get<double>() / (std::log(2.0) * double(bytes));
    CHECK(std::abs(row.at("bits_per_byte").get<double>() - expected) <= 1e-12 * expected);
  }

  // The table must fit the vocabulary, hold counts, be a .npy, and belong to tokenizer ids.
  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.token_bytes=bytes-short.npy", "--set",
                    "train.out_dir=runs/tb2"},
                &out) == 2);
  require_one_line_error(out, "bytes-short.npy (data.token_bytes): holds 999 byte counts; data.vocab_size is 1000");
  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.token_bytes=bytes-negative.npy", "--set",
                    "train.out_dir=runs/tb2"},
                &out) == 2);
  require_one_line_error(out, "bytes-negative.npy (data.token_bytes): id 3 has -1 bytes");
  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.token_bytes=tok-bin/train.bin", "--set",
                    "train.out_dir=runs/tb2"},
                &out) == 2);
  require_one_line_error(out, "expected a .npy file of one byte count per id");
  CHECK(run_cli(d, {"train", "-c", "ids.yaml", "--set", "data.tokenizer=byte", "--set", "data.path=tok-bin",
                    "--set", "data.vocab_size=0", "--set", "data.token_bytes=bytes.npy"},
                &out) == 2);
  require_one_line_error(out, "key 'data.token_bytes'");
  CHECK_THAT(out, Catch::Contains("is an option of tokenizer ids"));
}
