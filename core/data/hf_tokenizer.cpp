#include "core/data/hf_tokenizer.h"

#include "core/base/errors.h"
#include "core/data/onig_regex.h"
#include "core/data/tokenizer.h"

#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <cctype>
#include <array>
#include <atomic>
#include <exception>
#include <fstream>
#include <functional>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace extrap {

// The parts of a loaded tokenizer (named, not anonymous: HfTokenizerState holds them).
namespace hf_detail {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8 (utf8 and next_code_point: core/data/onig_regex.h)

// The offset of the first byte that is not part of valid UTF-8 (as Python's strict decoder
// reads it: no overlong forms, surrogates or code points past U+10FFFF), or npos.
size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const uint8_t b = p[i];
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (i + k >= n || (p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

void check_utf8(std::string_view text) {
  const size_t bad = invalid_utf8_at(text);
  if (bad == std::string_view::npos) return;
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", unsigned(uint8_t(text[bad])));
  throw ConfigError("text is not valid UTF-8: byte " + std::to_string(bad) + " (" + hex +
                    ") does not start a character or ends one early (Hugging Face tokenizers "
                    "encode Unicode text only)");
}

bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// ---------------------------------------------------------------------------------------------
// GPT-2's byte-level alphabet (bytes_to_unicode): the printable bytes ! to ~, ¡ to ¬ and ® to ÿ
// stand for themselves, the other 68 bytes for U+0100 upwards in byte order.

struct ByteAlphabet {
  std::array<std::string, 256> symbol;         // byte -> its character, UTF-8
  std::unordered_map<uint32_t, uint8_t> byte;  // character -> byte
  ByteAlphabet() {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : 0x100 + extra++;
      symbol[b] = utf8(cp);
      byte[cp] = uint8_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet instance;
  return instance;
}

// A vocabulary entry's raw bytes: each alphabet character as its byte, any other character as
// its own UTF-8 (as HF's ByteLevel decoder does). `pure`: every character was in the alphabet.
std::string entry_bytes(std::string_view entry, bool* pure = nullptr) {
  std::string out;
  if (pure) *pure = true;
  for (size_t i = 0; i < entry.size();) {
    const size_t start = i;
    const uint32_t cp = next_code_point(entry, i);
    const auto it = alphabet().byte.find(cp);
    if (it != alphabet().byte.end()) {
      out += char(it->second);
    } else {
      out.append(entry.substr(start, i - start));
      if (pure) *pure = false;
    }
  }
  return out;
}

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// The patterns whose safe cuts cut_points knows (the proof is there).
const char* const kCuttablePatterns[] = {
    kGpt2Pattern,
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",  // Llama 3
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",  // Qwen2
    " ?[^(\\s|[.,!?…。，、।۔،])]+",     // BLOOM
};

// ---------------------------------------------------------------------------------------------
// NFC through ICU, keeping where each normalised byte came from.

const icu::Normalizer2& nfc() {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status) || !n) throw std::runtime_error(std::string("ICU has no NFC: ") + u_errorName(status));
  return *n;
}

bool is_nfc(std::string_view s) {
  UErrorCode status = U_ZERO_ERROR;
  const bool yes = nfc().isNormalizedUTF8(icu::StringPiece(s.data(), int32_t(s.size())), status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU NFC check failed: ") + u_errorName(status));
  return yes;
}

std::string to_nfc(std::string_view s) {
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  UErrorCode status = U_ZERO_ERROR;
  nfc().normalizeUTF8(0, icu::StringPiece(s.data(), int32_t(s.size())), sink, nullptr, status);
  if (U_FAILURE(status)) throw std::runtime_error(std::string("ICU NFC failed: ") + u_errorName(status));
  return out;
}

// HF's NFC (the unicode-normalization-alignments crate) has Unicode 9.0 data, ICU 72 has 15.0:
// the characters they can treat differently are those Unicode 10.0 or later assigned that NFC
// does not leave alone (not inert). check_hf_tokenizer.py's nfc.txt finds each of them
// normalised differently in some context, and no other character.
const std::vector<bool>& nfc_disagreements() {
  static const std::vector<bool> table = [] {
    std::vector<bool> t(0x110000);
    const icu::Normalizer2& n = nfc();
    for (UChar32 c = 0x80; c < 0x110000; ++c) {
      UVersionInfo age;
      u_charAge(c, age);
      t[size_t(c)] = age[0] >= 10 && !n.isInert(c);
    }
    return t;
  }();
  return table;
}

void check_nfc_agrees(std::string_view text) {
  const std::vector<bool>& table = nfc_disagreements();
  for (size_t i = 0; i < text.size();) {
    if (uint8_t(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t at = i;
    const uint32_t cp = next_code_point(text, i);
    if (table[cp]) {
      char name[16];
      std::snprintf(name, sizeof name, "U+%04X", cp);
      throw ConfigError("text byte " + std::to_string(at) + ": " + name +
                        " is newer than the Unicode 9.0 data of HF tokenizers' NFC, and ICU (Unicode " +
                        U_UNICODE_VERSION + ") may normalise it differently; refused rather than risk "
                        "other tokens");
    }
  }
}

// A span of the original text after the normaliser, and the way back to original offsets.
struct NormalizedSpan {
  std::string_view text;  // the original's own bytes when the normaliser changed nothing
  std::string storage;
  size_t origin = 0;  // where the span starts in the original text
  // Runs NFC changed (from one normalisation boundary to the next), in order; offsets are
  // relative to the span in each text.
  struct Change {
    size_t begin, end;            // normalised
    size_t orig_begin, orig_end;  // original
  };
  std::vector<Change> changes;

  // The original offset of normalised offset p: inside a changed run, the run's start.
  size_t original(size_t p) const {
    if (changes.empty()) return origin + p;
    auto it = std::upper_bound(changes.begin(), changes.end(), p,
                               [](size_t q, const Change& c) { return q <= c.begin; });
    if (it == changes.begin()) return origin + p;
    --it;
    if (p < it->end) return origin + it->orig_begin;
    return origin + it->orig_end + (p - it->end);
  }
};

NormalizedSpan normalize_span(std::string_view text, size_t begin, size_t end, bool apply_nfc) {
  NormalizedSpan span;
  span.origin = begin;
  const std::string_view s = text.substr(begin, end - begin);
  if (!apply_nfc || is_nfc(s)) {
    span.text = s;
    return span;
  }
  // Runs from one character with a boundary before it to the next: NFC of the span is NFC of
  // each run, one after the other.
  const icu::Normalizer2& n = nfc();
  size_t run = 0;
  auto flush = [&](size_t run_end) {
    const std::string_view piece = s.substr(run, run_end - run);
    if (is_nfc(piece)) {
      span.storage.append(piece);
    } else {
      const size_t at = span.storage.size();
      span.storage += to_nfc(piece);
      span.changes.push_back({at, span.storage.size(), run, run_end});
    }
    run = run_end;
  };
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const uint32_t cp = next_code_point(s, i);
    if (at > run && (cp < 0x80 || n.hasBoundaryBefore(UChar32(cp)))) flush(at);
  }
  flush(s.size());
  span.text = span.storage;
  return span;
}

// ---------------------------------------------------------------------------------------------
// Added tokens: the longest match among those starting leftmost, as HF's aho-corasick
// (MatchKind::LeftmostLongest) finds them.

class AddedTokenMatcher {
 public:
  void add(const std::string& content, int32_t id) {
    int32_t node = 0;
    for (const char c : content) {
      const auto key = uint8_t(c);
      auto& edges = nodes_[size_t(node)].next;
      auto it = std::find_if(edges.begin(), edges.end(), [&](const auto& e) { return e.first == key; });
      if (it == edges.end()) {
        nodes_.push_back({});
        nodes_[size_t(node)].next.emplace_back(key, int32_t(nodes_.size() - 1));
        node = int32_t(nodes_.size() - 1);
      } else {
        node = it->second;
      }
    }
    nodes_[size_t(node)].id = id;
    first_[uint8_t(content[0])] = true;
    contents_.push_back(content);
  }
  bool empty() const { return contents_.empty(); }
  const std::vector<std::string>& contents() const { return contents_; }

  // The leftmost-longest match in s[from, ...): true and [*begin, *end) and *id.
  bool find(std::string_view s, size_t from, size_t* begin, size_t* end, int32_t* id) const {
    if (contents_.empty()) return false;
    for (size_t i = from; i < s.size(); ++i) {
      if (!first_[uint8_t(s[i])]) continue;
      int32_t node = 0, found = -1;
      size_t found_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        const auto& edges = nodes_[size_t(node)].next;
        const auto key = uint8_t(s[j]);
        auto it = std::find_if(edges.begin(), edges.end(), [&](const auto& e) { return e.first == key; });
        if (it == edges.end()) break;
        node = it->second;
        if (nodes_[size_t(node)].id >= 0) {
          found = nodes_[size_t(node)].id;
          found_end = j + 1;
        }
      }
      if (found >= 0) {
        *begin = i;
        *end = found_end;
        *id = found;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t id = -1;
  };
  std::vector<Node> nodes_ = {Node{}};
  std::array<bool, 256> first_{};
  std::vector<std::string> contents_;
};

enum class SplitBehavior { Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStage {
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
};

// Where the SentencePiece style puts a "▁" before a span: Metaspace's prepend_scheme (first:
// before the span at the text's start; always: before every span) unless the span already
// starts with "▁", or the normaliser's Prepend (each: before every span between added tokens).
enum class MetaspacePrepend { never, first, always, each };

struct MergeRule {
  int32_t rank;
  int32_t id;
};

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace hf_detail
using namespace hf_detail;

// ---------------------------------------------------------------------------------------------

struct HfTokenizerState {
  std::string where;
  // Model.
  std::unordered_map<std::string, int32_t> vocab;      // entries as stored ("Ġthe")
  std::unordered_map<std::string, int32_t> raw_vocab;  // alphabet-only entries by their bytes
  std::vector<std::optional<std::string>> entries;     // id -> entry as stored
  std::array<int32_t, 256> byte_id{};                  // byte -> its symbol's id, or -1
  std::unordered_map<uint64_t, MergeRule> merges;
  bool ignore_merges = false;
  std::optional<int32_t> unk;
  bool fuse_unk = false;
  // Added tokens.
  std::unordered_map<int32_t, std::string> added_content;  // id -> content
  std::unordered_map<std::string, int32_t> added_ids;      // content -> id
  std::set<int32_t> added_special;
  AddedTokenMatcher raw_tokens;         // normalized=false: matched in the original text
  AddedTokenMatcher normalized_tokens;  // normalized=true: matched after the normaliser
  // Normaliser and pre-tokeniser.
  bool nfc = false;
  std::vector<SplitStage> splits;  // Split and Digits, in order, before ByteLevel
  bool add_prefix_space = false;
  std::unique_ptr<Regex> byte_level_regex;  // GPT-2's pattern when use_regex
  // SentencePiece style (Llama 2, Mistral): BPE over characters, " " as "▁" (the Metaspace
  // pre-tokeniser, or the normaliser's Replace), a "▁" put before a span (Prepend), unknown
  // characters as their bytes' <0xXX> tokens (byte_fallback).
  bool metaspace = false;
  MetaspacePrepend prepend = MetaspacePrepend::never;
  bool metaspace_split = false;    // every "▁" starts a pre-token (Metaspace's split)
  bool normalizer_replace = false;  // normalizer Replace " " -> "▁"
  bool normalizer_prepend = false;  // normalizer Prepend "▁"
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};           // byte -> its <0xXX> token, or -1
  std::unordered_map<uint32_t, int32_t> char_id;    // one-character entries by code point
  // No entry holds a character other than "▁" right before a "▁", and "▁" is an entry: no
  // merge joins across a "▁" that follows an ASCII character, so BPE may run on the pieces
  // between such places one at a time (metaspace_words) with the same result.
  bool word_cuts = false;
  // Post-processor.
  std::vector<int32_t> prefix, suffix;
  std::optional<int32_t> bos, eos;
  bool cuttable = false;
  int32_t size = 0;
};

namespace {

// ---------------------------------------------------------------------------------------------
// Reading tokenizer.json. Every object's keys are checked: a key this reader does not know
// may change the result, so it is refused rather than ignored.

const char* const kSentencePieceHint =
    "extrap reads BPE tokenizers, byte-level or SentencePiece-style; a SentencePiece Unigram model is "
    "not supported";
const char* const kMetaspace = kSentencePieceSpace;

class JsonReader {
 public:
  explicit JsonReader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& message) const { throw ConfigError(where_ + ": " + message); }

  static std::string shown(const Json& value) {
    std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
    if (text.size() > 80) text = text.substr(0, 77) + "...";
    return text;
  }

  void keys(const Json& object, const std::string& path, std::initializer_list<const char*> known) const {
    if (!object.is_object()) fail(path + " is " + shown(object) + ", not an object");
    for (const auto& item : object.items()) {
      if (std::none_of(known.begin(), known.end(), [&](const char* k) { return item.key() == k; })) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
        fail(path + "." + item.key() + " is not a key this reader knows (" + path + " has " + list +
             "; a newer tokenizers version may have added it: it is refused rather than ignored)");
      }
    }
  }

  const Json& need(const Json& object, const std::string& path, const char* key) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(path + "." + key + " is missing");
    return *it;
  }

  bool boolean(const Json& object, const std::string& path, const char* key,
               std::optional<bool> fallback = std::nullopt) const {
    const auto it = object.find(key);
    if (it == object.end()) {
      if (!fallback) fail(path + "." + key + " is missing");
      return *fallback;
    }
    if (!it->is_boolean()) fail(path + "." + key + " is " + shown(*it) + ", not true or false");
    return it->get<bool>();
  }

  std::string string(const Json& object, const std::string& path, const char* key) const {
    const Json& value = need(object, path, key);
    if (!value.is_string()) fail(path + "." + key + " is " + shown(value) + ", not a string");
    return value.get<std::string>();
  }

  int32_t id(const Json& value, const std::string& path) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= (int64_t(1) << 31))
      fail(path + " is " + shown(value) + ", not an id (an integer from 0 to 2^31-1)");
    return int32_t(value.get<int64_t>());
  }

  std::string type(const Json& object, const std::string& path) const { return string(object, path, "type"); }

 private:
  std::string where_;
};

void read_model(const JsonReader& r, const Json& model, HfTokenizerState& s) {
  if (!model.is_object()) r.fail("model is " + JsonReader::shown(model) + ", not an object");
  const std::string type = model.contains("type") ? r.type(model, "model") : "";
  if (type != "BPE")
    r.fail("model.type \"" + type + "\" is not supported (" + kSentencePieceHint + ")");
  r.keys(model, "model",
         {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
          "byte_fallback", "ignore_merges", "vocab", "merges"});
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    r.fail("model.dropout " + JsonReader::shown(model["dropout"]) +
           " is not supported (BPE dropout samples tokens at random; extrap needs null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && !(model[key].is_string() && model[key] == ""))
      r.fail(std::string("model.") + key + " " + JsonReader::shown(model[key]) +
             " is not supported (byte-level BPE has none; null or \"\" only)");
  }
  s.byte_fallback = r.boolean(model, "model", "byte_fallback", false);
  if (s.byte_fallback && !s.metaspace)
    r.fail("model.byte_fallback true is not supported with a ByteLevel pre-tokenizer (byte-level BPE has every "
           "byte as a symbol; byte fallback belongs to the SentencePiece style with Metaspace)");
  s.fuse_unk = r.boolean(model, "model", "fuse_unk", false);
  s.ignore_merges = r.boolean(model, "model", "ignore_merges", false);

  const Json& vocab = r.need(model, "model", "vocab");
  if (!vocab.is_object()) r.fail("model.vocab is not an object of token: id");
  for (const auto& item : vocab.items()) {
    const int32_t id = r.id(item.value(), "model.vocab[\"" + item.key() + "\"]");
    if (size_t(id) >= s.entries.size()) s.entries.resize(size_t(id) + 1);
    if (s.entries[size_t(id)])
      r.fail("model.vocab gives id " + std::to_string(id) + " to both \"" + *s.entries[size_t(id)] +
             "\" and \"" + item.key() + "\"");
    s.entries[size_t(id)] = item.key();
    s.vocab.emplace(item.key(), id);
    if (s.metaspace) {
      size_t end = 0;
      const uint32_t cp = item.key().empty() ? 0 : next_code_point(item.key(), end);
      if (!item.key().empty() && end == item.key().size()) s.char_id.emplace(cp, id);
      continue;
    }
    bool pure = false;
    const std::string raw = entry_bytes(item.key(), &pure);
    if (pure) s.raw_vocab.emplace(raw, id);
  }

  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    if (!model["unk_token"].is_string())
      r.fail("model.unk_token is " + JsonReader::shown(model["unk_token"]) + ", not a string or null");
    const auto it = s.vocab.find(model["unk_token"].get<std::string>());
    if (it != s.vocab.end()) s.unk = it->second;
  }
  if (s.metaspace) {
    // HF's BPE drops a character that is not an entry when neither its bytes' <0xXX> tokens
    // (byte_fallback) nor unk_token stand for it; extrap credits every byte to a token.
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", unsigned(b));
      const auto it = s.vocab.find(name);
      s.fallback_id[size_t(b)] = it == s.vocab.end() ? -1 : it->second;
      if (s.byte_fallback && it == s.vocab.end())
        r.fail("model.byte_fallback is true but model.vocab has no byte token \"" + std::string(name) +
               "\" (SentencePiece's byte_fallback has all 256)");
      if (!s.unk && !s.byte_fallback)
        r.fail(std::string("model.unk_token is null and ") +
               "model.byte_fallback is false" +
               ": HF would drop a character outside the vocabulary silently, and extrap credits every byte to a "
               "token");
    }
  }
  for (int b = 0; b < 256 && !s.metaspace; ++b) {
    const auto it = s.vocab.find(alphabet().symbol[size_t(b)]);
    s.byte_id[size_t(b)] = it == s.vocab.end() ? -1 : it->second;
    if (it == s.vocab.end() && !s.unk) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", unsigned(b));
      r.fail("model.vocab has no byte-level symbol \"" + alphabet().symbol[size_t(b)] + "\" for byte " + hex +
             " and model.unk_token is null: HF would drop that byte silently, and extrap credits every "
             "byte to a token (train with initial_alphabet=ByteLevel.alphabet())");
    }
  }

  const Json& merges = r.need(model, "model", "merges");
  if (!merges.is_array()) r.fail("model.merges is not a list");
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    const std::string path = "model.merges[" + std::to_string(rank) + "]";
    std::string a, b;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        r.fail(path + " " + JsonReader::shown(m) + " is not two tokens split by one space");
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      r.fail(path + " " + JsonReader::shown(m) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = s.vocab.find(a), ib = s.vocab.find(b), ij = s.vocab.find(a + b);
    if (ia == s.vocab.end() || ib == s.vocab.end() || ij == s.vocab.end())
      r.fail(path + " " + JsonReader::shown(m) + ": \"" +
             (ia == s.vocab.end() ? a : ib == s.vocab.end() ? b : a + b) + "\" is not in model.vocab");
    // A later duplicate replaces an earlier one, as in HF's merge map.
    s.merges[pair_key(ia->second, ib->second)] = MergeRule{int32_t(rank), ij->second};
  }
}

void read_normalizer(const JsonReader& r, const Json& normalizer, const std::string& path,
                     HfTokenizerState& s) {
  if (normalizer.is_null()) return;
  if (!normalizer.is_object()) r.fail(path + " is " + JsonReader::shown(normalizer) + ", not an object or null");
  const std::string type = r.type(normalizer, path);
  if (type == "NFC") {
    r.keys(normalizer, path, {"type"});
    s.nfc = true;
  } else if (type == "Sequence") {
    r.keys(normalizer, path, {"type", "normalizers"});
    const Json& list = r.need(normalizer, path, "normalizers");
    if (!list.is_array()) r.fail(path + ".normalizers is not a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(r, list[i], path + ".normalizers[" + std::to_string(i) + "]", s);
  } else if (type == "Prepend") {  // Llama 2's and Mistral's: "▁" before each span
    r.keys(normalizer, path, {"type", "prepend"});
    const std::string prepend = r.string(normalizer, path, "prepend");
    if (prepend != kMetaspace)
      r.fail(path + ".prepend " + JsonReader::shown(prepend) + " is not supported (\"▁\" only, as SentencePiece's)");
    s.normalizer_prepend = true;
  } else if (type == "Replace") {  // ... and " " as "▁"
    r.keys(normalizer, path, {"type", "pattern", "content"});
    const Json& pattern = r.need(normalizer, path, "pattern");
    const std::string content = r.string(normalizer, path, "content");
    if (pattern != Json{{"String", " "}} || content != kMetaspace)
      r.fail(path + " replaces " + JsonReader::shown(pattern) + " by " + JsonReader::shown(content) +
             ", which is not supported (only {\"String\": \" \"} by \"▁\", as SentencePiece's)");
    s.normalizer_replace = true;
  } else {
    r.fail(path + ".type \"" + type + "\" is not supported (extrap reads NFC, Prepend \"▁\", Replace \" \" by \"▁\" " +
           "and Sequence)");
  }
}

struct ByteLevelSeen {
  bool seen = false;
  bool last = false;
};

void read_pre_tokenizer(const JsonReader& r, const Json& pre, const std::string& path, HfTokenizerState& s,
                        ByteLevelSeen& byte_level) {
  if (!pre.is_object()) r.fail(path + " is " + JsonReader::shown(pre) + ", not an object");
  const std::string type = r.type(pre, path);
  if (byte_level.seen)
    r.fail(path + ".type \"" + type + "\" comes after the ByteLevel pre-tokenizer (extrap needs ByteLevel last)");
  if (type == "Sequence") {
    r.keys(pre, path, {"type", "pretokenizers"});
    const Json& list = r.need(pre, path, "pretokenizers");
    if (!list.is_array()) r.fail(path + ".pretokenizers is not a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(r, list[i], path + ".pretokenizers[" + std::to_string(i) + "]", s, byte_level);
  } else if (type == "ByteLevel") {
    r.keys(pre, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    s.add_prefix_space = r.boolean(pre, path, "add_prefix_space");
    r.boolean(pre, path, "trim_offsets");  // offsets only
    if (r.boolean(pre, path, "use_regex", true)) s.byte_level_regex = compile_onig(kGpt2Pattern);
    byte_level.seen = true;
  } else if (type == "Split") {
    r.keys(pre, path, {"type", "pattern", "behavior", "invert"});
    SplitStage stage;
    const Json& pattern = r.need(pre, path, "pattern");
    const std::string behavior = r.string(pre, path, "behavior");
    stage.invert = r.boolean(pre, path, "invert");
    if (behavior == "Isolated") stage.behavior = SplitBehavior::Isolated;
    else if (behavior == "MergedWithPrevious") stage.behavior = SplitBehavior::MergedWithPrevious;
    else if (behavior == "MergedWithNext") stage.behavior = SplitBehavior::MergedWithNext;
    else if (behavior == "Contiguous") stage.behavior = SplitBehavior::Contiguous;
    else
      r.fail(path + ".behavior \"" + behavior +
             "\" is not supported (Isolated, MergedWithPrevious, MergedWithNext or Contiguous; "
             "Removed would leave bytes no token covers)");
    const bool is_regex = pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") &&
                          pattern["Regex"].is_string();
    const bool is_string = pattern.is_object() && pattern.size() == 1 && pattern.contains("String") &&
                           pattern["String"].is_string();
    if (!is_regex && !is_string)
      r.fail(path + ".pattern " + JsonReader::shown(pattern) + " is not {\"Regex\": ...} or {\"String\": ...}");
    const std::string text = pattern[is_regex ? "Regex" : "String"].get<std::string>();
    try {
      stage.regex = is_regex ? compile_onig(text) : compile_literal(text);
    } catch (const std::invalid_argument& e) {
      r.fail(path + ".pattern." + (is_regex ? "Regex " : "String ") + JsonReader::shown(text) +
             " cannot be matched exactly as HF's Oniguruma does: " + e.what());
    }
    s.splits.push_back(std::move(stage));
  } else if (type == "Metaspace") {
    if (path != "pre_tokenizer")
      r.fail(path + ".type \"Metaspace\" inside a Sequence is not supported (extrap reads Metaspace alone)");
    r.keys(pre, path, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    const std::string replacement = r.string(pre, path, "replacement");
    if (replacement != kMetaspace)
      r.fail(path + ".replacement " + JsonReader::shown(replacement) + " is not supported (\"▁\" only)");
    if (pre.contains("str_rep") && pre["str_rep"] != kMetaspace)
      r.fail(path + ".str_rep " + JsonReader::shown(pre["str_rep"]) + " is not supported (\"▁\" only)");
    // Files older than prepend_scheme say add_prefix_space (true: always).
    const std::string scheme = pre.contains("prepend_scheme")
                                   ? r.string(pre, path, "prepend_scheme")
                                   : r.boolean(pre, path, "add_prefix_space", true) ? "always" : "never";
    if (scheme == "first") s.prepend = MetaspacePrepend::first;
    else if (scheme == "always") s.prepend = MetaspacePrepend::always;
    else if (scheme == "never") s.prepend = MetaspacePrepend::never;
    else r.fail(path + ".prepend_scheme \"" + scheme + "\" is not supported (first, always or never)");
    s.metaspace_split = r.boolean(pre, path, "split", true);
    s.metaspace = true;
  } else if (type == "Digits") {
    r.keys(pre, path, {"type", "individual_digits"});
    SplitStage stage;
    // HF splits on char::is_numeric (Nd, Nl, No): each alone, or runs kept together.
    const std::string numeric = std::string("[\\p{N}") + kNewerNumeric + "]";
    stage.regex = compile_pcre2(r.boolean(pre, path, "individual_digits") ? numeric : numeric + "+", "Digits");
    s.splits.push_back(std::move(stage));
  } else {
    r.fail(path + ".type \"" + type + "\" is not supported (" +
           std::string("extrap reads Split, Digits, ByteLevel, Metaspace and Sequence") +
           ")");
  }
}

// TemplateProcessing's single template: the special tokens before and after $A.
void read_template(const JsonReader& r, const Json& post, const std::string& path, std::vector<int32_t>& prefix,
                   std::vector<int32_t>& suffix, const HfTokenizerState& s) {
  r.keys(post, path, {"type", "single", "pair", "special_tokens"});
  if (!r.need(post, path, "pair").is_array()) r.fail(path + ".pair is not a list");
  const Json& specials = r.need(post, path, "special_tokens");
  if (!specials.is_object()) r.fail(path + ".special_tokens is not an object");
  const Json& single = r.need(post, path, "single");
  if (!single.is_array()) r.fail(path + ".single is not a list");
  bool seen_a = false;
  std::vector<int32_t> before, after;
  for (size_t i = 0; i < single.size(); ++i) {
    const Json& piece = single[i];
    const std::string at = path + ".single[" + std::to_string(i) + "]";
    if (piece.is_object() && piece.size() == 1 && piece.contains("Sequence")) {
      r.keys(piece["Sequence"], at + ".Sequence", {"id", "type_id"});
      const Json& id = r.need(piece["Sequence"], at + ".Sequence", "id");
      if (id != "A" || seen_a)
        r.fail(at + ".Sequence.id " + JsonReader::shown(id) + ": the single template must hold $A once");
      seen_a = true;
    } else if (piece.is_object() && piece.size() == 1 && piece.contains("SpecialToken")) {
      r.keys(piece["SpecialToken"], at + ".SpecialToken", {"id", "type_id"});
      const std::string name = r.string(piece["SpecialToken"], at + ".SpecialToken", "id");
      if (!specials.contains(name)) r.fail(at + ".SpecialToken.id \"" + name + "\" is not in " + path + ".special_tokens");
      const Json& special = specials[name];
      const std::string sp = path + ".special_tokens[\"" + name + "\"]";
      r.keys(special, sp, {"id", "ids", "tokens"});
      const Json& ids = r.need(special, sp, "ids");
      if (!ids.is_array()) r.fail(sp + ".ids is not a list");
      for (size_t k = 0; k < ids.size(); ++k) {
        const int32_t id = r.id(ids[k], sp + ".ids[" + std::to_string(k) + "]");
        const bool known = s.added_content.count(id) || (size_t(id) < s.entries.size() && s.entries[size_t(id)]);
        if (!known) r.fail(sp + ".ids[" + std::to_string(k) + "] " + std::to_string(id) + " is not a token");
        (seen_a ? after : before).push_back(id);
      }
    } else {
      r.fail(at + " " + JsonReader::shown(piece) + " is neither {\"SpecialToken\": ...} nor {\"Sequence\": ...}");
    }
  }
  if (!seen_a) r.fail(path + ".single has no $A");
  prefix.insert(prefix.begin(), before.begin(), before.end());
  suffix.insert(suffix.end(), after.begin(), after.end());
}

void read_post_processor(const JsonReader& r, const Json& post, const std::string& path, HfTokenizerState& s) {
  if (post.is_null()) return;
  if (!post.is_object()) r.fail(path + " is " + JsonReader::shown(post) + ", not an object or null");
  const std::string type = r.type(post, path);
  if (type == "ByteLevel") {
    r.keys(post, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"});  // offsets only
  } else if (type == "TemplateProcessing") {
    read_template(r, post, path, s.prefix, s.suffix, s);
  } else if (type == "Sequence") {
    r.keys(post, path, {"type", "processors"});
    const Json& list = r.need(post, path, "processors");
    if (!list.is_array()) r.fail(path + ".processors is not a list");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(r, list[i], path + ".processors[" + std::to_string(i) + "]", s);
  } else {
    r.fail(path + ".type \"" + type +
           "\" is not supported (extrap reads ByteLevel, TemplateProcessing and Sequence)");
  }
}

void read_decoder(const JsonReader& r, const Json& decoder, bool metaspace) {
  if (decoder.is_null()) return;
  if (!decoder.is_object()) r.fail("decoder is " + JsonReader::shown(decoder) + ", not an object or null");
  const std::string type = r.type(decoder, "decoder");
  // The decoder turns ids back into text; extrap's own decode() (token_bytes) does that, so
  // only the kind is checked against the model's.
  if (type == "ByteLevel" && !metaspace) {
    r.keys(decoder, "decoder", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  } else if (metaspace && (type == "Metaspace" || type == "Sequence")) {
    if (type == "Sequence") {
      const Json& list = r.need(decoder, "decoder", "decoders");
      if (!list.is_array()) r.fail("decoder.decoders is not a list");
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string at = "decoder.decoders[" + std::to_string(i) + "]";
        const std::string t = r.type(list[i], at);
        if (t != "Replace" && t != "ByteFallback" && t != "Fuse" && t != "Strip")
          r.fail(at + ".type \"" + t + "\" is not supported (Replace, ByteFallback, Fuse and Strip)");
      }
    }
  } else {
    r.fail("decoder.type \"" + type + "\" is not supported (" +
           (metaspace ? "Metaspace, or a Sequence of Replace, ByteFallback, Fuse and Strip, with a Metaspace model"
                      : "ByteLevel with a ByteLevel model") +
           ")");
  }
}

// The added tokens, with the ids HF gives them on loading (sorted by their stored id: an entry
// already in the vocabulary keeps its id, a new one gets the next id after the vocabulary's
// entry count or the largest added id); a stored id that differs is refused.
void read_added_tokens(const JsonReader& r, const Json& list, HfTokenizerState& s) {
  if (!list.is_array()) r.fail("added_tokens is not a list");
  struct Added {
    size_t index;
    int32_t id;
    std::string content;
    bool special, normalized;
  };
  std::vector<Added> tokens;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& t = list[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    r.keys(t, path, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    Added a{i, r.id(r.need(t, path, "id"), path + ".id"), r.string(t, path, "content"),
            r.boolean(t, path, "special"), r.boolean(t, path, "normalized")};
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (r.boolean(t, path, key))
        r.fail(path + "." + key + " true is not supported (\"" + a.content + "\"; extrap matches added tokens exactly)");
    if (a.content.empty()) r.fail(path + ".content is empty");
    if (invalid_utf8_at(a.content) != std::string_view::npos) r.fail(path + ".content is not UTF-8");
    tokens.push_back(std::move(a));
  }
  std::stable_sort(tokens.begin(), tokens.end(), [](const Added& a, const Added& b) { return a.id < b.id; });
  const int32_t vocab_count = int32_t(s.vocab.size());
  std::optional<int32_t> max_added;
  for (const Added& a : tokens) {
    const std::string path = "added_tokens[" + std::to_string(a.index) + "]";
    if (s.added_ids.count(a.content)) r.fail(path + ".content \"" + a.content + "\" is added twice");
    int32_t hf_id;
    const auto in_vocab = s.vocab.find(a.content);
    if (in_vocab != s.vocab.end()) {
      hf_id = in_vocab->second;
    } else if (!max_added) {
      hf_id = vocab_count;
    } else {
      hf_id = (*max_added >= vocab_count || vocab_count == 0) ? *max_added + 1 : vocab_count;
    }
    if (hf_id != a.id)
      r.fail(path + ".id " + std::to_string(a.id) + " (\"" + a.content + "\") is not the id HF gives it on loading (" +
             std::to_string(hf_id) + ")");
    if (in_vocab == s.vocab.end() && size_t(hf_id) < s.entries.size() && s.entries[size_t(hf_id)])
      r.fail(path + ".id " + std::to_string(a.id) + " (\"" + a.content + "\") is also model.vocab's \"" +
             *s.entries[size_t(hf_id)] + "\"");
    max_added = std::max(max_added.value_or(hf_id), hf_id);
    s.added_content[hf_id] = a.content;
    s.added_ids[a.content] = hf_id;
    if (a.special) s.added_special.insert(hf_id);
    if (a.normalized) s.normalized_tokens.add(s.nfc ? to_nfc(a.content) : a.content, hf_id);
    else s.raw_tokens.add(a.content, hf_id);
  }
}

// SentencePiece style: whether BPE may run word by word (HfTokenizerState::word_cuts).
bool metaspace_word_cuts(const HfTokenizerState& s) {
  if (!s.vocab.count(kMetaspace)) return false;
  const std::string_view space = kMetaspace;
  for (const auto& [entry, id] : s.vocab) {
    for (size_t at = entry.find(space, 1); at != std::string::npos; at = entry.find(space, at + 1)) {
      if (at < space.size() || entry.compare(at - space.size(), space.size(), space) != 0) return false;
    }
  }
  return true;
}

// Whether cut_points may cut this tokenizer's texts (see there).
bool cuttable(const HfTokenizerState& s) {
  if (s.metaspace) {
    if (!s.word_cuts && !s.metaspace_split) return false;
    if (!s.metaspace_split && !s.vocab.count(kMetaspace)) return false;
    for (const auto* m : {&s.raw_tokens, &s.normalized_tokens})
      for (const std::string& c : m->contents())
        if (c.find(' ') != std::string::npos || c.find(kMetaspace) != std::string::npos ||
            std::isalnum(static_cast<unsigned char>(c.back())))
          return false;
    if (s.nfc && !nfc().hasBoundaryBefore(' ')) return false;
    return true;
  }
  for (const auto* m : {&s.raw_tokens, &s.normalized_tokens})
    for (const std::string& c : m->contents())
      if (c.find('\n') != std::string::npos) return false;
  if (s.nfc) {
    const icu::Normalizer2& n = nfc();
    for (int c = 0; c < 128; ++c)
      if ((ascii_letter(char(c)) || c == ' ') && !n.hasBoundaryBefore(c)) return false;
  }
  const Regex* first = s.splits.empty() ? s.byte_level_regex.get() : s.splits.front().regex.get();
  if (!first) return false;
  if (s.splits.empty() && s.add_prefix_space) return false;
  if (!s.splits.empty() && s.splits.front().behavior != SplitBehavior::Isolated) return false;
  return std::any_of(std::begin(kCuttablePatterns), std::end(kCuttablePatterns),
                     [&](const char* p) { return first->source == p; });
}

// ---------------------------------------------------------------------------------------------
// Encoding one piece of text.

// Pre-token -> its BPE tokens, for one piece of text. Open addressing over keys kept in one
// string (8% faster than std::unordered_map<std::string, ...> on WikiText-2: 26.3 -> 28.3 MB/s,
// gpt2 style); most pre-tokens repeat, so BPE itself runs on few of them.
class WordCache {
 public:
  static constexpr size_t kMaxWords = size_t(1) << 20;  // then it starts again, empty

  // The slot of `w`: its tokens (a range of tokens()) when found, else where to put them.
  struct Lookup {
    size_t slot;
    bool found;
    uint32_t first, count;
  };
  Lookup find(std::string_view w) {
    if (slots_.empty()) reset(size_t(1) << 12);
    const uint64_t h = std::hash<std::string_view>()(w);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.count == kEmpty) return {i, false, 0, 0};
      if (s.hash == h && s.key_len == w.size() && keys_.compare(s.key_at, s.key_len, w) == 0)
        return {i, true, s.first, s.count};
    }
  }
  // Stores the tokens appended to tokens() since `first` as w's, in the slot find() gave.
  void insert(const Lookup& at, std::string_view w, uint32_t first) {
    slots_[at.slot] = {std::hash<std::string_view>()(w), uint32_t(keys_.size()), uint32_t(w.size()), first,
                       uint32_t(tokens_.size()) - first};
    keys_.append(w);
    if (++words_ * 2 > slots_.size()) grow();
  }
  std::vector<std::pair<int32_t, uint32_t>>& tokens() { return tokens_; }  // (id, end in word)
  // Makes room for a word of `bytes` more tokens at most; may empty the cache.
  void reserve_word() {
    if (words_ >= kMaxWords) {
      keys_.clear();
      tokens_.clear();
      reset(size_t(1) << 12);
    }
  }

 private:
  static constexpr uint32_t kEmpty = ~uint32_t(0);
  struct Slot {
    uint64_t hash;
    uint32_t key_at, key_len, first, count;
  };
  void reset(size_t n) {
    slots_.assign(n, Slot{0, 0, 0, 0, kEmpty});
    words_ = 0;
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{0, 0, 0, 0, kEmpty});
    for (const Slot& s : old) {
      if (s.count == kEmpty) continue;
      size_t i = s.hash & (slots_.size() - 1);
      while (slots_[i].count != kEmpty) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<std::pair<int32_t, uint32_t>> tokens_;
  size_t words_ = 0;
};

// What every encoding checks first: valid UTF-8, and (for a tokenizer with NFC) a text NFC
// leaves as HF's would.
void check_text(const HfTokenizerState& s, std::string_view text) {
  check_utf8(text);
  if (s.nfc) check_nfc_agrees(text);
}

class PieceEncoder {
 public:
  // `starts_text`: the piece is the text's start (not a piece after a cut_points cut).
  PieceEncoder(const HfTokenizerState& s, bool starts_text) : s_(s), starts_text_(starts_text) {}

  // May run again on another text: each run starts afresh but for the word cache (words'
  // tokens, which depend on nothing else).
  HfTokenizer::Encoded run(std::string_view text) {
    out_ = HfTokenizer::Encoded();
    covered_ = 0;
    size_t pos = 0, begin = 0, end = 0;
    int32_t id = 0;
    while (s_.raw_tokens.find(text, pos, &begin, &end, &id)) {
      if (begin > pos) plain(text, pos, begin);
      emit(id, end);
      pos = end;
    }
    if (pos < text.size()) plain(text, pos, text.size());
    if (!out_.ids.empty()) out_.bytes.back() += int32_t(text.size() - covered_);
    return std::move(out_);
  }

 private:
  void emit(int32_t id, size_t original_end) {
    out_.ids.push_back(id);
    out_.bytes.push_back(int32_t(original_end - covered_));
    covered_ = original_end;
  }

  // A span between raw added tokens: normalised, then split around normalised added tokens.
  void plain(std::string_view text, size_t begin, size_t end) {
    const NormalizedSpan span = normalize_span(text, begin, end, s_.nfc);
    size_t pos = 0, b = 0, e = 0;
    int32_t id = 0;
    while (s_.normalized_tokens.find(span.text, pos, &b, &e, &id)) {
      if (b > pos) split(0, span, pos, b);
      emit(id, span.original(e));
      pos = e;
    }
    if (pos < span.text.size()) split(0, span, pos, span.text.size());
  }

  // Split stage k on span.text[begin, end); each piece goes on to stage k + 1.
  void split(size_t k, const NormalizedSpan& span, size_t begin, size_t end) {
    if (k == s_.splits.size()) return s_.metaspace ? metaspace(span, begin, end) : byte_level(span, begin, end);
    const SplitStage& stage = s_.splits[k];
    const std::string_view subject = span.text.substr(begin, end - begin);
    auto next = [&](size_t b, size_t e) {
      if (e > b) split(k + 1, span, begin + b, begin + e);
    };
    // Pieces in order with their match flag, folded as HF's SplitDelimiterBehavior does.
    struct Pending {
      bool open = false;
      size_t begin = 0, end = 0;
      bool match = false;
    } pending;
    bool last_match = false;
    auto entry = [&](size_t b, size_t e, bool match) {
      match = match != stage.invert;
      switch (stage.behavior) {
        case SplitBehavior::Isolated:
          next(b, e);
          break;
        case SplitBehavior::Contiguous:
          if (pending.open && pending.match == match) {
            pending.end = e;
          } else {
            if (pending.open) next(pending.begin, pending.end);
            pending = {true, b, e, match};
          }
          break;
        case SplitBehavior::MergedWithPrevious:
          if (match && !last_match && pending.open) {
            pending.end = e;
          } else {
            if (pending.open) next(pending.begin, pending.end);
            pending = {true, b, e, match};
          }
          break;
        case SplitBehavior::MergedWithNext:
          // A match joins the piece after it when that piece is not a match.
          if (pending.open) {
            if (!match) {
              next(pending.begin, e);
              pending.open = false;
              break;
            }
            next(pending.begin, pending.end);
            pending.open = false;
          }
          if (match) pending = {true, b, e, true};
          else next(b, e);
          break;
      }
      last_match = match;
    };
    size_t pos = 0, b = 0, e = 0;
    while (pos < subject.size() && matcher_.find(*stage.regex, subject, pos, &b, &e)) {
      if (b > pos) entry(pos, b, false);
      entry(b, e, true);
      pos = e;
    }
    if (pos < subject.size()) entry(pos, subject.size(), false);
    if (pending.open) next(pending.begin, pending.end);
  }

  // The ByteLevel stage on span.text[begin, end): the prefix space, GPT-2's pattern, then BPE.
  void byte_level(const NormalizedSpan& span, size_t begin, size_t end) {
    std::string_view subject = span.text.substr(begin, end - begin);
    bool prefixed = false;
    if (s_.add_prefix_space && subject[0] != ' ') {
      prefixed_.assign(" ").append(subject);
      subject = prefixed_;
      prefixed = true;
    }
    // Offset t of the subject -> the original text (the added space covers nothing).
    auto original = [&](size_t t) { return span.original(begin + (prefixed ? (t > 0 ? t - 1 : 0) : t)); };
    if (!s_.byte_level_regex) return word(subject, 0, original);
    size_t pos = 0, b = 0, e = 0;
    while (pos < subject.size() && matcher_.find(*s_.byte_level_regex, subject, pos, &b, &e)) {
      if (b > pos) word(subject.substr(pos, b - pos), pos, original);
      word(subject.substr(b, e - b), b, original);
      pos = e;
    }
    if (pos < subject.size()) word(subject.substr(pos), pos, original);
  }

  // The SentencePiece style on span.text[begin, end): each " " as "▁", a "▁" before it as the
  // prepend scheme says, then BPE one word at a time: a word ends before every "▁" with
  // Metaspace's split, before a "▁" that follows an ASCII character when word_cuts holds (no
  // merge joins across it), and otherwise only at the span's end.
  void metaspace(const NormalizedSpan& span, size_t begin, size_t end) {
    const std::string_view seg = span.text.substr(begin, end - begin);
    const std::string_view space = kMetaspace;
    const bool at_start = span.original(begin) == 0;
    const bool starts_with_space = seg[0] == ' ' || seg.substr(0, space.size()) == space;
    // A span at the start of a piece that continues a text (starts_text false) is no span of
    // its own: only "first" at the text's start, and "always"/"each" at a span's start, prepend.
    bool prepend = false;
    switch (s_.prepend) {
      case MetaspacePrepend::never: break;
      case MetaspacePrepend::first: prepend = !starts_with_space && at_start && starts_text_; break;
      case MetaspacePrepend::always: prepend = !starts_with_space && (!at_start || starts_text_); break;
      case MetaspacePrepend::each: prepend = !at_start || starts_text_; break;  // not a cut's continuation
    }
    word_.clear();
    word_original_.clear();
    auto original = [&](size_t t) { return word_original_[t]; };
    auto flush = [&](size_t original_end) {
      if (word_.empty()) return;
      word_original_.push_back(original_end);
      word(word_, 0, original);
      word_.clear();
      word_original_.clear();
    };
    if (prepend) {  // covers nothing of the text
      word_.append(space);
      word_original_.insert(word_original_.end(), space.size(), span.original(begin));
    }
    for (size_t i = 0; i < seg.size();) {
      const size_t o = span.original(begin + i);
      const bool blank = seg[i] == ' ';
      if ((blank || seg.compare(i, space.size(), space) == 0) && !word_.empty() &&
          (s_.metaspace_split || (s_.word_cuts && uint8_t(word_.back()) < 0x80)))
        flush(o);
      if (blank) {
        word_.append(space);
        word_original_.insert(word_original_.end(), space.size(), o);
        ++i;
        continue;
      }
      const size_t from = i;
      next_code_point(seg, i);
      for (size_t k = from; k < i; ++k) {
        word_ += seg[k];
        word_original_.push_back(span.original(begin + k));
      }
    }
    flush(span.original(end));
  }

  // One pre-token through BPE, from the cache when seen before in this piece.
  template <class Original>
  void word(std::string_view w, size_t at, const Original& original) {
    cache_.reserve_word();
    WordCache::Lookup found = cache_.find(w);
    if (!found.found) {
      found.first = uint32_t(cache_.tokens().size());
      bpe(w);
      cache_.insert(found, w, found.first);
      found.count = uint32_t(cache_.tokens().size()) - found.first;
    }
    const auto& tokens = cache_.tokens();
    for (uint32_t i = found.first; i < found.first + found.count; ++i)
      emit(tokens[i].first, original(at + tokens[i].second));
  }

  // HF's BPE::merge_word and Word::merge_all: byte symbols (unknown bytes as <unk>, fused with
  // fuse_unk), then the lowest-ranked merge first, the leftmost among equals. Appends (id, end
  // offset in w) to the cache's tokens.
  void bpe(std::string_view w) {
    auto& out = cache_.tokens();
    if (s_.ignore_merges) {
      key_.assign(w);
      const auto& entries = s_.metaspace ? s_.vocab : s_.raw_vocab;
      const auto whole = entries.find(key_);
      if (whole != entries.end()) {
        out.emplace_back(whole->second, uint32_t(w.size()));
        return;
      }
    }
    std::vector<BpeSymbol>& symbols = symbols_;
    symbols.clear();
    bool pending_unk = false;
    // SentencePiece style: characters (an entry, else their bytes' <0xXX> tokens, else <unk>).
    for (size_t i = 0; i < w.size() && s_.metaspace;) {
      const size_t from = i;
      const uint32_t cp = next_code_point(w, i);
      const auto it = s_.char_id.find(cp);
      if (it != s_.char_id.end()) {
        symbols.push_back({it->second, 0, 0, uint32_t(i), true});
        pending_unk = false;
      } else if (s_.byte_fallback) {  // every <0xXX> is an entry (checked when loading)
        for (size_t k = from; k < i; ++k) symbols.push_back({s_.fallback_id[uint8_t(w[k])], 0, 0, uint32_t(k + 1), true});
        pending_unk = false;
      } else if (pending_unk && s_.fuse_unk) {
        symbols.back().end = uint32_t(i);
      } else {
        symbols.push_back({*s_.unk, 0, 0, uint32_t(i), true});
        pending_unk = true;
      }
    }
    for (size_t i = 0; i < w.size() && !s_.metaspace; ++i) {
      const int32_t id = s_.byte_id[uint8_t(w[i])];
      if (id < 0) {  // only with an unk token (checked when loading)
        if (pending_unk && s_.fuse_unk) {
          symbols.back().end = uint32_t(i + 1);
        } else {
          symbols.push_back({*s_.unk, 0, 0, uint32_t(i + 1), true});
        }
        pending_unk = true;
        continue;
      }
      pending_unk = false;
      symbols.push_back({id, 0, 0, uint32_t(i + 1), true});
    }
    const auto n = int32_t(symbols.size());
    for (int32_t i = 0; i < n; ++i) {
      symbols[size_t(i)].prev = i - 1;
      symbols[size_t(i)].next = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
      int32_t rank, pos, id;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    auto rule = [&](int32_t a, int32_t b) -> const MergeRule* {
      const auto m = s_.merges.find(pair_key(a, b));
      return m == s_.merges.end() ? nullptr : &m->second;
    };
    for (int32_t i = 0; i + 1 < n; ++i)
      if (const MergeRule* m = rule(symbols[size_t(i)].id, symbols[size_t(i) + 1].id)) queue.push({m->rank, i, m->id});
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      BpeSymbol& left = symbols[size_t(top.pos)];
      if (!left.alive || left.next < 0) continue;
      BpeSymbol& right = symbols[size_t(left.next)];
      const MergeRule* m = rule(left.id, right.id);
      if (!m || m->id != top.id) continue;  // stale: a neighbour has changed
      left.id = top.id;
      left.end = right.end;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
      if (left.prev >= 0)
        if (const MergeRule* p = rule(symbols[size_t(left.prev)].id, left.id)) queue.push({p->rank, left.prev, p->id});
      if (left.next >= 0)
        if (const MergeRule* q = rule(left.id, symbols[size_t(left.next)].id)) queue.push({q->rank, top.pos, q->id});
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[size_t(i)].next)
      out.emplace_back(symbols[size_t(i)].id, symbols[size_t(i)].end);
  }

  const HfTokenizerState& s_;
  const bool starts_text_;
  std::string word_;                   // metaspace: the word being built
  std::vector<size_t> word_original_;  // ... and the original offset of each of its offsets
  HfTokenizer::Encoded out_;
  size_t covered_ = 0;  // the original text credited so far
  MatchState matcher_;
  std::string prefixed_, key_;
  WordCache cache_;
  struct BpeSymbol {
    int32_t id, prev, next;
    uint32_t end;
    bool alive;
  };
  std::vector<BpeSymbol> symbols_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(std::shared_ptr<const HfTokenizerState> state) : state_(std::move(state)) {}

HfTokenizer HfTokenizer::from_json(const std::string& text, const std::string& where) {
  const JsonReader r(where);
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    r.fail(std::string("not a tokenizer.json (not valid JSON: ") + e.what() + ")");
  }
  r.keys(root, "tokenizer.json",
         {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "model",
          "post_processor", "decoder"});
  auto state = std::make_shared<HfTokenizerState>();
  state->where = where;
  for (const char* key : {"truncation", "padding"})
    if (root.contains(key) && !root[key].is_null())
      r.fail(std::string(key) + " " + JsonReader::shown(root[key]) +
             " is not supported (it changes the ids; extrap needs null)");
  HfTokenizerState& s = *state;
  read_normalizer(r, root.value("normalizer", Json()), "normalizer", s);
  const Json pre = root.value("pre_tokenizer", Json());
  ByteLevelSeen byte_level;
  if (!pre.is_null()) read_pre_tokenizer(r, pre, "pre_tokenizer", s, byte_level);
  // Byte-level (ByteLevel last), or SentencePiece-style: Metaspace alone, or no pre-tokeniser
  // with the normaliser's Replace " " -> "▁" (and perhaps Prepend "▁"), as Llama 2's file.
  const bool by_normalizer = s.normalizer_replace || s.normalizer_prepend;
  if (s.metaspace && by_normalizer)
    r.fail("normalizer Replace/Prepend \"▁\" together with pre_tokenizer Metaspace is not supported (one or the "
           "other)");
  if (byte_level.seen && by_normalizer)
    r.fail("normalizer Replace/Prepend \"▁\" with a ByteLevel pre-tokenizer is not supported");
  if (!s.metaspace && !byte_level.seen) {
    if (!pre.is_null() || !s.normalizer_replace)
      r.fail("pre_tokenizer " + JsonReader::shown(pre) +
             " has neither a ByteLevel pre-tokenizer (last) nor Metaspace, and the normalizer does not replace \" \" "
             "by \"▁\" (" + kSentencePieceHint + ")");
    s.metaspace = true;
    s.metaspace_split = false;
    s.prepend = s.normalizer_prepend ? MetaspacePrepend::each : MetaspacePrepend::never;
  }
  read_model(r, r.need(root, "tokenizer.json", "model"), s);
  read_added_tokens(r, root.value("added_tokens", Json::array()), s);
  if (s.metaspace && by_normalizer)
    for (const auto& c : s.normalized_tokens.contents())
      r.fail("added token \"" + c + "\" has normalized true with the normalizer's Replace/Prepend \"▁\" (not "
             "supported: HF matches it after its own content is normalised, \"▁\" included)");
  read_post_processor(r, root.value("post_processor", Json()), "post_processor", s);
  read_decoder(r, root.value("decoder", Json()), s.metaspace);
  if (s.metaspace) s.word_cuts = metaspace_word_cuts(s);

  s.size = int32_t(s.entries.size());
  for (const auto& [id, content] : s.added_content) s.size = std::max(s.size, id + 1);
  if (!s.prefix.empty()) s.bos = s.prefix.back();
  if (!s.suffix.empty()) s.eos = s.suffix.front();
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    if (s.eos) break;
    const auto it = s.added_ids.find(name);
    if (it != s.added_ids.end() && s.added_special.count(it->second)) s.eos = it->second;
  }
  s.cuttable = cuttable(s);
  return HfTokenizer(std::move(state));
}

HfTokenizer HfTokenizer::load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw ConfigError(path + ": cannot read the tokenizer (no such file, or not readable)");
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return from_json(bytes.str(), path);
}

int32_t HfTokenizer::size() const { return state_->size; }
std::optional<int32_t> HfTokenizer::bos() const { return state_->bos; }
std::optional<int32_t> HfTokenizer::eos() const { return state_->eos; }
std::optional<int32_t> HfTokenizer::unk() const { return state_->unk; }

std::optional<int32_t> HfTokenizer::id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = state_->added_ids.find(key); it != state_->added_ids.end()) return it->second;
  if (const auto it = state_->vocab.find(key); it != state_->vocab.end()) return it->second;
  return std::nullopt;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  const HfTokenizerState& s = *state_;
  if (const auto it = s.added_content.find(id); it != s.added_content.end()) return it->second;
  if (id < 0 || size_t(id) >= s.entries.size() || !s.entries[size_t(id)])
    throw std::out_of_range("token id " + std::to_string(id) + " is not a token of " + s.where);
  const std::string& entry = *s.entries[size_t(id)];
  if (!s.metaspace) return entry_bytes(entry);
  // SentencePiece style: "▁" is a space, a byte token its byte.
  if (s.byte_fallback && entry.size() == 6 && entry.compare(0, 3, "<0x") == 0 && entry[5] == '>' &&
      s.fallback_id[size_t(std::stoi(entry.substr(3, 2), nullptr, 16))] == id)
    return std::string(1, char(std::stoi(entry.substr(3, 2), nullptr, 16)));
  return spaces_for_metaspace(entry);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) out += token_bytes(id);
  return out;
}

HfTokenizer::Encoded HfTokenizer::encode_piece(std::string_view piece, bool starts_text) const {
  check_text(*state_, piece);
  return PieceEncoder(*state_, starts_text).run(piece);
}

std::vector<HfTokenizer::Encoded> HfTokenizer::encode_pieces(const std::vector<std::string>& pieces,
                                                             bool starts_text) const {
  PieceEncoder encoder(*state_, starts_text);
  std::vector<Encoded> out;
  out.reserve(pieces.size());
  for (const auto& piece : pieces) {
    check_text(*state_, piece);
    out.push_back(encoder.run(piece));
  }
  return out;
}

HfTokenizer::Encoded HfTokenizer::add_special_tokens(Encoded body) const {
  const HfTokenizerState& s = *state_;
  if (s.prefix.empty() && s.suffix.empty()) return body;
  Encoded out;
  out.ids.reserve(s.prefix.size() + body.ids.size() + s.suffix.size());
  out.ids = s.prefix;
  out.ids.insert(out.ids.end(), body.ids.begin(), body.ids.end());
  out.ids.insert(out.ids.end(), s.suffix.begin(), s.suffix.end());
  out.bytes.assign(s.prefix.size(), 0);
  out.bytes.insert(out.bytes.end(), body.bytes.begin(), body.bytes.end());
  out.bytes.insert(out.bytes.end(), s.suffix.size(), 0);
  return out;
}

// Safe cuts. A cut at p must leave every stage's pieces as they are in the whole text: no
// added token covers p (none contains "\n"), NFC has a boundary before text[p] (" " and ASCII
// letters have one), and the first pattern's pieces (later stages only see those pieces) have
// a boundary at p and are the same when the text ends at p. p comes right after a "\n" and
//   (A) text[p-2] is ASCII other than whitespace and text[p] an ASCII letter, or
//   (B) text[p] is " " and text[p+1] an ASCII letter.
// None of the four patterns has lookbehind, so matching from p sees what the whole text's
// matching sees once a match ends at p; it remains to show that one does, and that the pieces
// before p do not change when the text ends at p. Let W be the run of whitespace holding the
// "\n" at p-1.
//  - GPT-2: no alternative but \s+(?!\S) and \s+ takes whitespace after its first character,
//    so a match ends where W starts. On W, \s+(?!\S) takes W less its last character (followed
//    by whitespace); the last, \n in (A) or " " in (B), is then its own match or, in (B), the
//    start of " ?\p{L}+". In (A) W is the "\n" alone, matched by \s+ in the whole text and by
//    \s+(?!\S) at the end of the piece: the same span. In (B) the match on W ends at p in the
//    whole text ((?!\S) sees " " there) and at the end of the piece.
//  - Llama 3, Qwen2: the "\n" is taken by " ?[^\s\p{L}\p{N}]+[\r\n]*" (which stops at the
//    first character that is no line break) or by \s*[\r\n]+ (which ends at the last line
//    break of W): at p in both texts, since W holds no line break from p on. No alternative
//    takes a letter after a line break ([^\r\n\p{L}\p{N}]? excludes them).
//  - BLOOM: neither "\n" nor anything before it joins a match that goes on past p (the class
//    excludes \s, and " ?" takes " " only first), so p ends a gap between matches in both.
// tests/data/check_hf_tokenizer.py's texts check that the pieces give the whole text's ids.
//
// SentencePiece style: a cut at p where text[p] is " " and text[p-1] an ASCII letter or digit.
// No added token covers p (none contains " "), none ends at p (none ends with a letter or a
// digit: a span starting at p would get the normaliser's Prepend), and NFC has a boundary
// before " ". The piece from p starts with "▁", so no prepend scheme puts one before it
// (PieceEncoder's starts_text keeps Prepend off); in the whole text a word starts at p too:
// with Metaspace's split before every "▁", else by word_cuts (no entry holds a character other
// than "▁" right before a "▁", so no merge joins across p).
std::vector<size_t> HfTokenizer::cut_points(std::string_view text, size_t piece_bytes) const {
  std::vector<size_t> cuts;
  if (!state_->cuttable || piece_bytes == 0) return cuts;
  if (state_->metaspace) {
    for (size_t from = piece_bytes; from < text.size();) {
      const size_t p = text.find(' ', from);
      if (p == std::string_view::npos) break;
      if (std::isalnum(static_cast<unsigned char>(text[p - 1])) && static_cast<unsigned char>(text[p - 1]) < 0x80) {
        cuts.push_back(p);
        from = p + piece_bytes;
      } else {
        from = p + 1;
      }
    }
    return cuts;
  }
  size_t from = piece_bytes;
  while (from < text.size()) {
    const size_t newline = text.find('\n', from - 1);
    if (newline == std::string_view::npos) break;
    const size_t p = newline + 1;
    const bool a = p < text.size() && ascii_letter(text[p]) && p >= 2 && text[p - 2] > ' ' && text[p - 2] < 0x7F;
    const bool b = p + 1 < text.size() && text[p] == ' ' && ascii_letter(text[p + 1]);
    if (a || b) {
      cuts.push_back(p);
      from = p + piece_bytes;
    } else {
      from = p + 1;
    }
  }
  return cuts;
}

HfTokenizer::Encoded HfTokenizer::encode(std::string_view text, int threads) const {
  check_text(*state_, text);
  if (threads <= 1) return add_special_tokens(PieceEncoder(*state_, true).run(text));
  // Pieces of about 1 MB, taken by the threads in turn and appended in order.
  const std::vector<size_t> cuts = cut_points(text, size_t(1) << 20);
  std::vector<size_t> bounds{0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(text.size());
  std::vector<Encoded> pieces(bounds.size() - 1);
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(threads, int(pieces.size())); ++t) {
    pool.emplace_back([&, t] {
      try {
        for (size_t i; (i = next++) < pieces.size();)
          pieces[i] = PieceEncoder(*state_, i == 0).run(text.substr(bounds[i], bounds[i + 1] - bounds[i]));
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  }
  for (auto& thread : pool) thread.join();
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  Encoded body;
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.ids.size();
  body.ids.reserve(total);
  body.bytes.reserve(total);
  for (auto& piece : pieces) {
    body.ids.insert(body.ids.end(), piece.ids.begin(), piece.ids.end());
    body.bytes.insert(body.bytes.end(), piece.bytes.begin(), piece.bytes.end());
    Encoded().ids.swap(piece.ids);
    Encoded().bytes.swap(piece.bytes);
  }
  return add_special_tokens(std::move(body));
}

}  // namespace extrap
