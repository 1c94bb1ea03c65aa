#include "core/data/sentencepiece.h"

#include "core/base/errors.h"
#include "core/base/files.h"
#include "core/data/tokenizer.h"

#include <ATen/Parallel.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>

namespace extrap {

struct SentencePieceModel::State {
  sentencepiece::SentencePieceProcessor processor;
  std::string bytes;
};

namespace {

// The lines of a text with their offsets, and the bytes of the break after each.
struct Line {
  size_t begin = 0;
  size_t size = 0;
  size_t break_bytes = 0;
};

std::vector<Line> split_lines(std::string_view text) {
  std::vector<Line> lines;
  for_each_line(text, [&](std::string_view line, size_t break_bytes) {
    lines.push_back({size_t(line.data() - text.data()), line.size(), break_bytes});
  });
  return lines;
}

// Feeds the trainer the non-blank lines of a text.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : text_(text), lines_(split_lines(text)) { skip(); }
  bool done() const override { return next_ >= lines_.size(); }
  void Next() override {
    ++next_;
    skip();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void skip() {
    for (; next_ < lines_.size(); ++next_) {
      const std::string_view line = text_.substr(lines_[next_].begin, lines_[next_].size);
      if (line.find_first_not_of(" \t") != std::string_view::npos) {
        value_.assign(line);
        return;
      }
    }
  }
  std::string_view text_;
  std::vector<Line> lines_;
  size_t next_ = 0;
  std::string value_;
};

}  // namespace

SentencePieceModel::SentencePieceModel(std::shared_ptr<const State> state)
    : state_(std::move(state)) {}

SentencePieceModel SentencePieceModel::from_bytes(const std::string& serialized,
                                                  const std::string& where) {
  auto state = std::make_shared<State>();
  const auto status = state->processor.LoadFromSerializedProto(serialized);
  if (!status.ok())
    throw ConfigError(where + ": not a SentencePiece model (" + status.ToString() + ")");
  if (state->processor.eos_id() < 0)
    throw ConfigError(where + ": the model has no end-of-sentence piece (eos_id -1); extrap ends "
                      "every line with one: train the model with one (extrap tokenizer train does)");
  state->bytes = serialized;
  return SentencePieceModel(std::move(state));
}

SentencePieceModel SentencePieceModel::load(const std::string& path) {
  const std::string where = "tokenizer model '" + path + "' (data.tokenizer_model)";
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error))
    throw ConfigError(where + ": " + (std::filesystem::exists(path, error) ? "not a file" : "no such file") +
                      " (extrap tokenizer train makes one)");
  const std::string bytes = read_file(path);
  if (bytes.empty()) throw ConfigError(where + ": an empty file, not a SentencePiece model");
  return from_bytes(bytes, where);
}

const std::string& SentencePieceModel::bytes() const { return state_->bytes; }
int32_t SentencePieceModel::size() const { return state_->processor.GetPieceSize(); }
int32_t SentencePieceModel::eos() const { return state_->processor.eos_id(); }
int32_t SentencePieceModel::unk() const { return state_->processor.unk_id(); }

std::string SentencePieceModel::piece(int32_t id) const {
  TORCH_CHECK(id >= 0 && id < size(), "SentencePiece id ", id, " is outside the model's ", size(),
              " pieces");
  return state_->processor.IdToPiece(id);
}

std::string SentencePieceModel::piece_text(int32_t id) const {
  const auto& p = state_->processor;
  const std::string text = piece(id);
  if (id == p.eos_id()) return "\n";
  if (p.IsUnknown(id)) return " \xE2\x81\x87 ";  // U+2047, as SentencePiece decodes <unk>
  if (p.IsControl(id)) return "";
  if (p.IsByte(id)) return std::string(1, char(std::stoi(text.substr(3, 2), nullptr, 16)));  // <0xAB>
  return spaces_for_metaspace(text);
}

std::vector<int32_t> SentencePieceModel::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = state_->processor.Encode(text, &ids);
  TORCH_CHECK(status.ok(), "SentencePiece could not encode a text: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

SentencePieceModel::Encoded SentencePieceModel::encode_lines(std::string_view text) const {
  const std::vector<Line> lines = split_lines(text);
  // Lines in blocks of about 1 MB, each block encoded on its own and appended in order.
  std::vector<size_t> block_starts{0};
  for (size_t i = 0, bytes = 0; i < lines.size(); ++i) {
    bytes += lines[i].size + lines[i].break_bytes;
    if (bytes >= (size_t(1) << 20) && i + 1 < lines.size()) {
      block_starts.push_back(i + 1);
      bytes = 0;
    }
  }
  block_starts.push_back(lines.size());
  const int64_t blocks = int64_t(block_starts.size()) - 1;
  std::vector<Encoded> encoded(size_t(std::max<int64_t>(blocks, 0)));
  std::string failure;
  std::mutex failure_lock;
  const auto encode_block = [&](int64_t b) {
    Encoded& out = encoded[size_t(b)];
    sentencepiece::ImmutableSentencePieceText pieces;
    for (size_t i = block_starts[size_t(b)]; i < block_starts[size_t(b) + 1]; ++i) {
      const Line& line = lines[i];
      const auto status =
          state_->processor.Encode(text.substr(line.begin, line.size), pieces.mutable_proto());
      if (!status.ok()) {
        std::lock_guard<std::mutex> hold(failure_lock);
        failure = status.ToString();
        return;
      }
      // Piece k covers [start of k, start of k + 1): the line's bytes, each credited once. (The
      // starts never decrease; the max keeps every count at least 0 regardless.)
      const size_t first = out.ids.size();
      size_t boundary = 0;
      for (const auto& piece : pieces.pieces()) {
        out.ids.push_back(int32_t(piece.id()));
        const size_t start = out.ids.size() == first + 1 ? 0 : std::min<size_t>(piece.begin(), line.size);
        boundary = std::max(boundary, start);
        out.bytes.push_back(int32_t(boundary));  // the start, for now
      }
      for (size_t k = first; k < out.ids.size(); ++k) {
        const size_t end = k + 1 < out.ids.size() ? size_t(out.bytes[k + 1]) : line.size;
        out.bytes[k] = int32_t(end - size_t(out.bytes[k]));
      }
      const bool empty = out.ids.size() == first;
      out.ids.push_back(eos());
      out.bytes.push_back(int32_t(line.break_bytes + (empty ? line.size : 0)));
    }
  };
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) encode_block(b);
  });
  TORCH_CHECK(failure.empty(), "SentencePiece could not encode a line: ", failure);
  Encoded out;
  size_t total = 0;
  for (const auto& e : encoded) total += e.ids.size();
  out.ids.reserve(total);
  out.bytes.reserve(total);
  for (const auto& e : encoded) {
    out.ids.insert(out.ids.end(), e.ids.begin(), e.ids.end());
    out.bytes.insert(out.bytes.end(), e.bytes.begin(), e.bytes.end());
  }
  return out;
}

std::string SentencePieceModel::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const auto status = state_->processor.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  TORCH_CHECK(status.ok(), "SentencePiece could not decode: ", status.ToString());
  return text;
}

namespace {

// SentencePiece's reason in extrap's words: without the source position and the check that
// failed ("./src/trainer_interface.cc(580) [(...) <= (...)] "), and with its flags spelt as
// `extrap tokenizer train` takes them (--vocab-size, not vocab_size or --vocab_size).
std::string training_failure(const std::string& message) {
  std::string reason = message;
  if (reason.rfind("./", 0) == 0 || reason.rfind("src/", 0) == 0) {
    const size_t check = reason.find("] ");
    if (check != std::string::npos) reason = reason.substr(check + 2);
  }
  for (const auto& [theirs, ours] : {std::pair<const char*, const char*>{"--character_coverage", "--character-coverage"},
                                     {"--vocab_size", "--vocab-size"},
                                     {"character_coverage", "--character-coverage"},
                                     {"vocab_size", "--vocab-size"},
                                     {"--model_type", "--type"}}) {
    for (size_t at = reason.find(theirs); at != std::string::npos; at = reason.find(theirs, at + std::strlen(ours))) {
      // "--vocab_size" is replaced whole before its bare "vocab_size" is looked for.
      if (at >= 2 && reason.compare(at - 2, 2, "--") == 0) continue;
      reason.replace(at, std::strlen(theirs), ours);
    }
  }
  return reason;
}

}  // namespace

std::string train_sentencepiece(std::string_view text, const SentencePieceTraining& options,
                                const std::string& where) {
  if (options.model_type != "unigram" && options.model_type != "bpe")
    throw ConfigError("tokenizer type '" + options.model_type + "': must be unigram or bpe");
  if (options.vocab_size < 8)
    throw ConfigError("vocabulary size " + std::to_string(options.vocab_size) +
                      ": must be at least 8");
  if (!(options.character_coverage > 0 && options.character_coverage <= 1))
    throw ConfigError("character coverage " + number_text(options.character_coverage) +
                      ": must be in (0, 1]");
  LineIterator lines(text);
  if (lines.done()) throw ConfigError(where + ": has no text to train a tokenizer on");
  const std::unordered_map<std::string, std::string> arguments = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", number_text(options.character_coverage)},
      {"byte_fallback", options.byte_fallback ? "true" : "false"},
      {"split_digits", options.split_digits ? "true" : "false"},
      {"num_threads", std::to_string(std::max(1, options.threads))},
      // Every line of the split, however long (WikiText paragraphs run to thousands of bytes).
      {"max_sentence_length", std::to_string(1 << 20)},
      {"input_sentence_size", "0"},
      {"unk_id", "0"}, {"bos_id", "1"}, {"eos_id", "2"}, {"pad_id", "-1"},
      {"minloglevel", "2"},
  };
  sentencepiece::SetRandomGeneratorSeed(options.seed);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(arguments, &lines, &model);
  if (!status.ok())
    throw ConfigError(where + ": SentencePiece could not train a " + options.model_type +
                      " model of " + std::to_string(options.vocab_size) + " pieces: " +
                      training_failure(std::string(status.message())));
  return model;
}

}  // namespace extrap
