// data.tokenizer: sentencepiece through the command line: `extrap tokenizer train` makes a model
// from a corpus's training split, a run trains and evaluates on its pieces with bits per byte of
// the scored text (checked against the file's own size), generates text, writes passkey
// instances and retrieval scores, and bad keys are refused in one line.
#include <catch2/catch.hpp>

#include "core/data/sentencepiece.h"
#include "tests/support/cli_harness.h"

#include <nlohmann/json.hpp>

#include <cmath>

using namespace extrap;
using namespace extrap::testing;

namespace {

const char* const kPiecesTrain = R"(data: {path: corpus, tokenizer: sentencepiece, tokenizer_model: spm.model, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: alibi
train: {seq_len: 16, batch_tokens: 256, steps: 30, lr: 0.01, warmup: 2, validate_every: 15,
        validate_tokens: 512, checkpoint_every: 15, log_every: 15, threads: 1, out_dir: runs/pieces}
eval: {lengths: [16, 32], strides: [8]}
)";

struct PiecesDir : TempDir {
  PiecesDir() : TempDir("pieces") {
    fs::create_directories(root / "corpus");
    write_text(root / "corpus" / "train.txt", synthetic_prose(40000, 21));
    write_text(root / "corpus" / "valid.txt", synthetic_prose(2500, 22));
    write_text(root / "corpus" / "test.txt", synthetic_prose(2500, 23));
    write_text(root / "pieces.yaml", kPiecesTrain);
  }
};

}  // namespace

TEST_CASE("extrap tokenizer train makes a model from the training split, and a run trains, "
          "evaluates, generates and retrieves in its pieces",
          "[cli][sentencepiece]") {
  PiecesDir d;
  std::string out;
  REQUIRE(run_cli(d, {"tokenizer", "train", "--data", "corpus", "--vocab-size", "400", "--out", "spm.model",
                      "--threads", "1"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("wrote spm.model: unigram, 400 pieces (<unk> 0, </s> 2, byte fallback)"));
  CHECK_THAT(out, Catch::Contains("tokenizer_model: spm.model"));
  const std::string model_bytes = read_text(d.root / "spm.model");
  CHECK(run_cli(d, {"tokenizer", "train", "--data", "corpus", "--vocab-size", "400", "--out", "spm.model"},
                &out) == 2);
  require_one_line_error(out, "--out spm.model exists (runs trained with it depend on it); --overwrite replaces it");
  CHECK(read_text(d.root / "spm.model") == model_bytes);
  CHECK(run_cli(d, {"tokenizer", "train", "--data", "nowhere", "--vocab-size", "400", "--out", "x.model"},
                &out) == 2);
  require_one_line_error(out, "corpus path 'nowhere' does not exist");
  // A single file: its training part, cut as the corpus cuts it.
  REQUIRE(run_cli(d, {"tokenizer", "train", "--data", "corpus/train.txt", "--split-fractions", "0.5", "0.25",
                      "0.25", "--vocab-size", "400", "--out", "half.model"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("trained on corpus/train.txt bytes [0, "));
  CHECK(run_cli(d, {"tokenizer", "train", "--data", "corpus/train.txt", "--split-fractions", "0.5", "0.25",
                    "--vocab-size", "400", "--out", "bad.model"},
                &out) == 2);
  require_one_line_error(out, "split_fractions must be three non-negative numbers");
  CHECK(run_cli(d, {"tokenizer", "train", "--data", "corpus", "--vocab-size", "90000", "--out", "x.model"},
                &out) == 2);
  require_one_line_error(out, "SentencePiece could not train a unigram model of 90000 pieces");
  CHECK(!fs::exists(d.root / "x.model"));
  REQUIRE(run_cli(d, {"tokenizer", "encode", "--model", "spm.model", "--text", "The model was trained.\nIt"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("for 25 bytes of text"));

  // Training and evaluation on the pieces, bits per byte of the scored text.
  REQUIRE(run_cli(d, {"train", "-c", "pieces.yaml", "--json", "pieces.json"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("corpus corpus (sentencepiece, vocabulary 401)"));
  CHECK(out.find("do not say how many bytes") == std::string::npos);
  // Written from the definition: causal windows score every token of valid but its first, and
  // the tokens' bytes cover the whole text, so the scored bytes are the file's size less the
  // first token's text: its piece without the word-boundary mark the text does not hold.
  const SentencePieceModel model = SentencePieceModel::load((d.root / "spm.model").string());
  const std::string valid = read_text(d.root / "corpus" / "valid.txt");
  const std::vector<int32_t> valid_ids = model.encode_lines(valid).ids;
  std::string first = model.piece(valid_ids[0]);
  REQUIRE(first.rfind("\xE2\x96\x81", 0) == 0);
  const int64_t first_bytes = int64_t(first.size()) - 3;
  const auto document = nlohmann::json::parse(read_text(d.root / "pieces.json"));
  const auto& rows = document.at("evaluation").at("results");
  REQUIRE(rows.size() == 4);  // 16 and 32, non-overlapping and stride 8
  for (const auto& row : rows) {
    INFO(row.dump());
    REQUIRE(row.at("status") == "ok");
    CHECK(row.at("scored_tokens").get<int64_t>() == int64_t(valid_ids.size()) - 1);
    CHECK(row.at("scored_bytes").get<int64_t>() == int64_t(valid.size()) - first_bytes);
    const double expected = row.at("nll_sum").get<double>() / (std::log(2.0) * double(valid.size() - first_bytes));
    CHECK(std::abs(row.at("bits_per_byte").get<double>() - expected) <= 1e-12 * expected);
  }

  // Generation: the prompt's pieces, continued in pieces.
  REQUIRE(run_cli(d, {"generate", "--checkpoint", "runs/pieces", "--prompt", "The model", "--max-new", "6",
                      "--temperature", "0"},
                  &out) == 0);
  CHECK_THAT(out, Catch::StartsWith("The model"));
  // A passkey instance in pieces, and retrieval scored on them.
  REQUIRE(run_cli(d, {"task", "--config", "pieces.yaml", "--length", "120", "--seed", "3"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("Remember it."));
  CHECK_THAT(out, Catch::Contains("What is the pass key? The pass key is"));
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/pieces", "--length", "120", "--retrieval", "passkey",
                      "--samples", "2", "--depths", "0", "100"},
                  &out) == 0);

  // The keys are checked before anything loads.
  CHECK(run_cli(d, {"train", "-c", "pieces.yaml", "--set", "data.tokenizer_model=null"}, &out) == 2);
  require_one_line_error(out, "key 'data.tokenizer_model' (set on the command line or by a sweep's grid): "
                              "is required with tokenizer sentencepiece");
  CHECK(run_cli(d, {"train", "-c", "pieces.yaml", "--set", "data.tokenizer=byte"}, &out) == 2);
  require_one_line_error(out, "key 'data.tokenizer_model'");
  CHECK_THAT(out, Catch::Contains("is an option of tokenizers sentencepiece and hf"));
  CHECK(run_cli(d, {"train", "-c", "pieces.yaml", "--set", "data.tokenizer_model=missing.model", "--set",
                    "train.out_dir=runs/missing"},
                &out) == 2);
  require_one_line_error(out, "tokenizer model 'missing.model' (data.tokenizer_model): no such file");
  CHECK(!fs::exists(d.root / "runs" / "missing"));

  // Another model under the same path: the run refuses it rather than resume on other tokens.
  REQUIRE(run_cli(d, {"tokenizer", "train", "--data", "corpus", "--vocab-size", "420", "--type", "bpe",
                      "--out", "spm.model", "--overwrite"},
                  &out) == 0);
  CHECK(run_cli(d, {"train", "-c", "pieces.yaml", "--set", "train.steps=40"}, &out) != 0);
  CHECK_THAT(out, Catch::Contains("runs/pieces"));
}
