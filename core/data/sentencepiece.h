// SentencePiece subword tokens (data.tokenizer: sentencepiece), through Debian's
// libsentencepiece: a trained BPE or unigram .model file, and training one on a corpus's
// training split (`extrap tokenizer train`).
//
// A text is read as lines (universal newlines, as word level reads them: "\n", "\r\n" or a lone
// "\r" ends a line), and each line yields its pieces, then the model's end-of-sentence piece;
// a final line without a line break still yields it. Every byte of the text is credited to
// exactly one token, so that the bytes behind the scored tokens give exact bits per byte: a
// piece covers the text from its own start to the next piece's (the whitespace the model's
// normaliser dropped goes with the piece before it, a line's leading whitespace with its first
// piece), and the end-of-sentence piece covers the line break (and the whole line when it has
// no pieces). The line's counts sum to its bytes.
//
// Ids: the model's pieces 0..N-1 (unknown, control and byte pieces as the model defines them),
// then <mask> = N, which the model never produces.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace extrap {

// A loaded SentencePiece model. Encoding is const and safe from several threads at once.
class SentencePieceModel {
 public:
  // The model in file `path`; a missing or unreadable file, or one that is not a SentencePiece
  // model, is a ConfigError naming `path`, as is a model without an end-of-sentence piece.
  static SentencePieceModel load(const std::string& path);
  // The model in `serialized` (a .model file's bytes); `where` names it in errors.
  static SentencePieceModel from_bytes(const std::string& serialized, const std::string& where);

  const std::string& bytes() const;  // the .model file's bytes
  int32_t size() const;              // pieces
  int32_t eos() const;
  int32_t unk() const;
  std::string piece(int32_t id) const;  // as the model stores it ("▁the", "<0x0A>", "</s>")
  // What a generated token prints: the piece with "▁" as a space, a byte piece as its byte,
  // the end-of-sentence piece as a newline, another control piece as nothing, <unk> as " ⁇ ".
  std::string piece_text(int32_t id) const;

  // A text's tokens, line by line with end-of-sentence pieces, and the bytes each covers.
  struct Encoded {
    std::vector<int32_t> ids;
    std::vector<int32_t> bytes;  // bytes[i]: the bytes of text credited to ids[i]
  };
  // Blocks of lines are encoded on LibTorch's threads; the result is the same for any count.
  Encoded encode_lines(std::string_view text) const;
  // The pieces of one piece of text (no end-of-sentence piece; line breaks are whitespace).
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  struct State;
  explicit SentencePieceModel(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;
};

// How `extrap tokenizer train` trains a model.
struct SentencePieceTraining {
  std::string model_type = "unigram";  // unigram | bpe
  int64_t vocab_size = 8000;
  // The share of characters the model must cover; the rest are <unk>, or their UTF-8 bytes
  // with byte_fallback.
  double character_coverage = 1.0;
  bool byte_fallback = true;  // unknown characters as byte pieces, never <unk>
  bool split_digits = true;   // every digit its own piece (numbers, passkeys)
  uint32_t seed = 1;
  int threads = 1;
};

// Trains a model on `text`'s lines (blank lines skipped) and returns the .model file's bytes.
// Refused (ConfigError) with SentencePiece's reason, e.g. a vocabulary larger than the text
// supports; `where` names the text.
std::string train_sentencepiece(std::string_view text, const SentencePieceTraining& options,
                                const std::string& where);

}  // namespace extrap
