// Tokenisers: text bytes to token ids. Pure functions of their input, no I/O.
//
// Word level follows fairseq's language-model preprocessing (fairseq-preprocess --only-source,
// then --sample-break-mode none): the text is read as lines (universal newlines: "\n", "\r\n"
// or a lone "\r" ends a line), each line is split on whitespace as Python's str.split() does
// (ASCII whitespace, the separators 0x1c-0x1f and the Unicode White_Space characters), and
// every line, blank lines included, yields its words then <eos>. A final line without a line
// break still yields <eos>.
//
// Ids: word level has <eos> = 0, <unk> = 1, <mask> = 2, then the training words by descending
// count, ties by first appearance. A literal "<eos>", "<unk>" or "<mask>" in the text maps to
// that special id and is never counted as a word. Byte level maps byte b to id b and has
// <mask> = 256.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace extrap {

inline constexpr int32_t kWordEos = 0;
inline constexpr int32_t kWordUnk = 1;
inline constexpr int32_t kWordMask = 2;
inline constexpr int32_t kWordSpecials = 3;  // ids below this are special
inline constexpr const char* kWordSpecialNames[kWordSpecials] = {"<eos>", "<unk>", "<mask>"};

inline constexpr int32_t kByteMask = 256;
inline constexpr int64_t kByteVocabSize = 257;

// The ids of a text's bytes (0..255).
std::vector<int32_t> byte_tokens(std::string_view text);

// SentencePiece's word boundary "▁" (U+2581), as pieces store it.
inline constexpr const char* kSentencePieceSpace = "\xE2\x96\x81";
// A piece's text: each "▁" a space, everything else as it is.
std::string spaces_for_metaspace(std::string_view piece);

// Calls on_line(line, break_bytes) for every line of `text` in order, with universal newlines:
// "\n", "\r\n" or a lone "\r" ends a line (break_bytes 1, 2, 1; the line excludes it). A final
// line without a line break is a line too (break_bytes 0); an empty text has none.
template <class OnLine>
void for_each_line(std::string_view text, OnLine&& on_line) {
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find_first_of("\r\n", begin);
    if (end == std::string_view::npos) {
      on_line(text.substr(begin), size_t(0));
      return;
    }
    const size_t brk = (text[end] == '\r' && end + 1 < text.size() && text[end + 1] == '\n') ? 2 : 1;
    on_line(text.substr(begin, end - begin), brk);
    begin = end + brk;
  }
}

// A word vocabulary: id -> word and word -> id. Not copyable (the lookup table holds views into
// the word list); move it instead.
class WordVocabulary {
 public:
  // id -> word, the specials first in their fixed order.
  explicit WordVocabulary(std::vector<std::string> words);
  WordVocabulary(WordVocabulary&&) = default;
  WordVocabulary& operator=(WordVocabulary&&) = default;
  WordVocabulary(const WordVocabulary&) = delete;
  WordVocabulary& operator=(const WordVocabulary&) = delete;

  // The vocabulary of a training text: the specials, then its words by descending count, ties
  // broken by first appearance.
  static WordVocabulary from_text(std::string_view train_text);

  const std::vector<std::string>& words() const { return words_; }
  int64_t size() const { return static_cast<int64_t>(words_.size()); }
  // The id of `word`; <unk> when it is not in the vocabulary.
  int32_t id(std::string_view word) const;
  // The token ids of a text: each line's words, then <eos>.
  std::vector<int32_t> encode(std::string_view text) const;

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string_view, int32_t> ids_;  // views into words_
};

}  // namespace extrap
