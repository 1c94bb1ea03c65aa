#include "core/data/tokenizer.h"

#include <algorithm>
#include <numeric>

namespace extrap {
namespace {

// The length in bytes of the whitespace character starting at p, or 0 if there is none. Matches
// Python's str.isspace() on UTF-8 text (line breaks are handled by the caller).
size_t whitespace_length(const unsigned char* p, const unsigned char* end) {
  const unsigned c = p[0];
  if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) ? 1 : 0;
  const auto at = [&](size_t i) -> unsigned { return p + i < end ? p[i] : 0u; };
  switch (c) {
    case 0xc2:  // U+0085 next line, U+00A0 no-break space
      return (at(1) == 0x85 || at(1) == 0xa0) ? 2 : 0;
    case 0xe1:  // U+1680 ogham space mark
      return (at(1) == 0x9a && at(2) == 0x80) ? 3 : 0;
    case 0xe2:  // U+2000..U+200A, U+2028, U+2029, U+202F, U+205F
      if (at(1) == 0x80) {
        const unsigned t = at(2);
        return ((t >= 0x80 && t <= 0x8a) || t == 0xa8 || t == 0xa9 || t == 0xaf) ? 3 : 0;
      }
      return (at(1) == 0x81 && at(2) == 0x9f) ? 3 : 0;
    case 0xe3:  // U+3000 ideographic space
      return (at(1) == 0x80 && at(2) == 0x80) ? 3 : 0;
    default:
      return 0;
  }
}

// Calls on_word(word) for every word and on_line_end() at the end of every line, in text order.
template <class OnWord, class OnLineEnd>
void for_each_word(std::string_view text, OnWord&& on_word, OnLineEnd&& on_line_end) {
  for_each_line(text, [&](std::string_view line, size_t) {
    const auto* p = reinterpret_cast<const unsigned char*>(line.data());
    const auto* const end = p + line.size();
    const unsigned char* word = nullptr;  // start of the word being read, if any
    const auto finish_word = [&](const unsigned char* at) {
      if (word) on_word(std::string_view(reinterpret_cast<const char*>(word), at - word));
      word = nullptr;
    };
    while (p < end) {
      if (const size_t space = whitespace_length(p, end)) {
        finish_word(p);
        p += space;
        continue;
      }
      if (!word) word = p;
      ++p;
    }
    finish_word(end);
    on_line_end();
  });
}

// The special id a literal word stands for, or -1.
int32_t special_id(std::string_view word) {
  if (word.empty() || word.front() != '<') return -1;
  for (int32_t id = 0; id < kWordSpecials; ++id) {
    if (word == kWordSpecialNames[id]) return id;
  }
  return -1;
}

}  // namespace

std::vector<int32_t> byte_tokens(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  return std::vector<int32_t>(bytes, bytes + text.size());
}

std::string spaces_for_metaspace(std::string_view piece) {
  const std::string_view space = kSentencePieceSpace;
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, space.size(), space) == 0) {
      out += ' ';
      i += space.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

WordVocabulary::WordVocabulary(std::vector<std::string> words) : words_(std::move(words)) {
  for (int32_t id = 0; id < kWordSpecials; ++id) {
    if (static_cast<int32_t>(words_.size()) <= id || words_[id] != kWordSpecialNames[id]) {
      throw std::invalid_argument(std::string("WordVocabulary: id ") + std::to_string(id) +
                                  " must be " + kWordSpecialNames[id]);
    }
  }
  ids_.reserve(words_.size());
  for (size_t id = 0; id < words_.size(); ++id) {
    ids_.emplace(std::string_view(words_[id]), static_cast<int32_t>(id));
  }
}

WordVocabulary WordVocabulary::from_text(std::string_view train_text) {
  std::unordered_map<std::string_view, int32_t> first_seen;  // word -> index in `seen`
  first_seen.reserve(1 << 16);
  std::vector<std::string_view> seen;
  std::vector<int64_t> counts;
  for_each_word(
      train_text,
      [&](std::string_view word) {
        if (special_id(word) >= 0) return;
        const auto [it, inserted] = first_seen.try_emplace(word, static_cast<int32_t>(seen.size()));
        if (inserted) {
          seen.push_back(word);
          counts.push_back(0);
        }
        ++counts[it->second];
      },
      [] {});

  std::vector<int32_t> order(seen.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  std::vector<std::string> words(kWordSpecialNames, kWordSpecialNames + kWordSpecials);
  words.reserve(kWordSpecials + seen.size());
  for (const int32_t i : order) words.emplace_back(seen[i]);
  return WordVocabulary(std::move(words));
}

int32_t WordVocabulary::id(std::string_view word) const {
  const auto it = ids_.find(word);
  return it == ids_.end() ? kWordUnk : it->second;
}

std::vector<int32_t> WordVocabulary::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4);
  for_each_word(
      text, [&](std::string_view word) { ids.push_back(id(word)); },
      [&] { ids.push_back(kWordEos); });
  return ids;
}

}  // namespace extrap
