// Loading a corpus: find its three splits, tokenise each once through the cache, map them.
#include "core/data/corpus.h"

#include "core/base/files.h"
#include "core/base/yaml_options.h"
#include "core/data/hf_tokenizer.h"
#include "core/data/sentencepiece.h"
#include "core/data/token_cache.h"
#include "core/data/tokenizer.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <optional>

namespace fs = std::filesystem;

namespace extrap {
namespace {

constexpr std::array<const char*, 3> kSplitNames = {"train", "valid", "test"};

// The text of one split and where it came from (for messages).
struct SplitSource {
  std::string where;
  std::string text;
};

std::string read_text(const fs::path& path) {
  // A directory opens as a stream on Linux and reports a size of 2^63 - 1: refused by name.
  std::error_code error;
  if (fs::is_directory(path, error)) throw ConfigError("corpus file '" + path.string() + "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read corpus file '" + path.string() + "'");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw ConfigError("cannot read corpus file '" + path.string() + "' (it has no size)");
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (size > 0 && !in.read(text.data(), size)) {
    throw ConfigError("cannot read corpus file '" + path.string() + "'");
  }
  return text;
}

std::array<SplitSource, 3> read_directory(const fs::path& dir) {
  std::array<SplitSource, 3> splits;
  for (size_t i = 0; i < kSplitNames.size(); ++i) {
    const std::string split = kSplitNames[i];
    const fs::path wiki = dir / ("wiki." + split + ".tokens");
    const fs::path plain = dir / (split + ".txt");
    const fs::path* found = fs::exists(wiki) ? &wiki : fs::exists(plain) ? &plain : nullptr;
    if (!found) {
      throw ConfigError("corpus directory '" + dir.string() + "' has no " + split +
                        " split: expected '" + wiki.string() + "' or '" + plain.string() + "'");
    }
    splits[i] = {found->string(), read_text(*found)};
  }
  return splits;
}

// The first line boundary at or after `target`: 0, the end, or a position just after a '\n'.
size_t line_boundary(const std::string& text, size_t target) {
  if (target == 0) return 0;
  if (target >= text.size()) return text.size();
  const size_t newline = text.find('\n', target - 1);
  return newline == std::string::npos ? text.size() : newline + 1;
}

std::array<SplitSource, 3> read_single_file(const fs::path& file,
                                            const std::vector<double>& fractions) {
  const std::string where = "corpus file '" + file.string() + "'";
  bool valid = fractions.size() == 3;
  double total = 0;
  for (const double f : fractions) {
    valid = valid && std::isfinite(f) && f >= 0;
    total += f;
  }
  if (!valid || !(total > 0)) {
    throw ConfigError(where + ": split_fractions must be three non-negative numbers " +
                      "(train, valid, test) with a positive sum");
  }
  const std::string text = read_text(file);
  const auto cut = [&](double fraction) {
    return line_boundary(text, static_cast<size_t>(std::llround(fraction / total * text.size())));
  };
  const size_t train_end = cut(fractions[0]);
  const size_t valid_end = std::max(train_end, cut(fractions[0] + fractions[1]));
  const std::array<size_t, 4> bounds = {0, train_end, valid_end, text.size()};

  std::array<SplitSource, 3> splits;
  for (size_t i = 0; i < 3; ++i) {
    const size_t begin = bounds[i], end = bounds[i + 1];
    if (fractions[i] > 0 && begin == end) {
      throw ConfigError(where + " is too small to split by line into train/valid/test: the " +
                        kSplitNames[i] + " split would be empty");
    }
    splits[i] = {file.string() + " bytes [" + std::to_string(begin) + ", " +
                     std::to_string(end) + ")",
                 text.substr(begin, end - begin)};
  }
  return splits;
}


// --- pre-tokenised splits (tokenizer ids) --------------------------------------------------

// A split's ids as the file holds them: element size, signedness and where the data starts.
struct IdsLayout {
  size_t item = 2;
  bool is_signed = false;
  size_t offset = 0;
  int64_t count = 0;
};

// The layout of a .npy file (NumPy's format, versions 1 to 3): a one-dimensional, C-order
// array of little-endian integers. Anything else is refused naming the file.
IdsLayout npy_layout(const std::string& where, const std::string& bytes) {
  const auto refuse = [&](const std::string& why) -> IdsLayout {
    throw ConfigError(where + ": " + why);
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    return refuse("not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_bytes = 0, start = 0;
  if (major == 1) {
    header_bytes = size_t(static_cast<unsigned char>(bytes[8])) |
                   size_t(static_cast<unsigned char>(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return refuse("truncated .npy header");
    for (int i = 0; i < 4; ++i) header_bytes |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    return refuse(".npy format version " + std::to_string(major) + " is not known (1 to 3 are)");
  }
  if (start + header_bytes > bytes.size()) return refuse("truncated .npy header");
  const std::string header = bytes.substr(start, header_bytes);
  const auto field = [&](const std::string& name) {
    const size_t at = header.find("'" + name + "'");
    if (at == std::string::npos) refuse(".npy header has no '" + name + "'");
    const size_t colon = header.find(':', at);
    size_t begin = header.find_first_not_of(" ", colon + 1);
    size_t end = header[begin] == '(' ? header.find(')', begin) + 1
                 : header[begin] == '\'' ? header.find('\'', begin + 1) + 1
                                         : header.find_first_of(",}", begin);
    return header.substr(begin, end - begin);
  };
  IdsLayout layout;
  const std::string descr = field("descr");
  static const std::map<std::string, std::pair<size_t, bool>> kTypes = {
      {"'|u1'", {1, false}}, {"'<u2'", {2, false}}, {"'<u4'", {4, false}}, {"'<u8'", {8, false}},
      {"'|i1'", {1, true}},  {"'<i2'", {2, true}},  {"'<i4'", {4, true}},  {"'<i8'", {8, true}}};
  const auto type = kTypes.find(descr);
  if (type == kTypes.end())
    return refuse("dtype " + descr + " is not an integer type extrap reads (uint8 to uint64 or "
                  "int8 to int64, little-endian)");
  layout.item = type->second.first;
  layout.is_signed = type->second.second;
  if (field("fortran_order") != "False") return refuse("a Fortran-order array; save it in C order");
  const std::string shape = field("shape");  // "(N,)"
  char* end = nullptr;
  const long long n = std::strtoll(shape.c_str() + 1, &end, 10);
  if (shape.size() < 3 || shape[0] != '(' || end == shape.c_str() + 1 || std::string(end) != ",)")
    return refuse("shape " + shape + ": the ids must be one-dimensional, as (N,)");
  layout.count = n;
  layout.offset = start + header_bytes;
  const size_t data = bytes.size() - layout.offset;
  if (data != size_t(n) * layout.item)
    return refuse("holds " + std::to_string(data) + " bytes of data, its header says " +
                  std::to_string(n) + " ids of " + std::to_string(layout.item) +
                  " bytes: the file is truncated or damaged");
  return layout;
}

// Element i of an integer array laid out as `layout` says, sign-extended where signed.
int64_t integer_at(const std::string& bytes, const IdsLayout& layout, int64_t i) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data() + layout.offset);
  uint64_t raw = 0;
  for (size_t b = 0; b < layout.item; ++b) raw |= uint64_t(data[i * layout.item + b]) << (8 * b);
  if (layout.is_signed && layout.item < 8 && (raw >> (8 * layout.item - 1)) & 1)
    return int64_t(raw) - (int64_t(1) << (8 * layout.item));
  return int64_t(raw);
}

// The ids of one split, checked against the vocabulary, as int32.
std::vector<int32_t> decode_ids(const std::string& where, const std::string& bytes,
                                const IdsLayout& layout, int64_t vocab_size) {
  if (layout.count == 0) throw ConfigError(where + ": holds no token ids (an empty split)");
  std::vector<int32_t> ids(static_cast<size_t>(layout.count));
  for (int64_t i = 0; i < layout.count; ++i) {
    const int64_t value = integer_at(bytes, layout, i);
    if (value < 0 || value >= vocab_size)
      throw ConfigError(where + ": id " + std::to_string(value) + " at position " +
                        std::to_string(i) + " is outside the vocabulary (data.vocab_size " +
                        std::to_string(vocab_size) + ")");
    ids[size_t(i)] = int32_t(value);
  }
  return ids;
}

// The three pre-tokenised splits of a directory: SPLIT.bin or SPLIT.npy (not both).
std::array<SplitSource, 3> read_ids_directory(const fs::path& dir) {
  std::array<SplitSource, 3> splits;
  for (size_t i = 0; i < kSplitNames.size(); ++i) {
    const fs::path bin = dir / (std::string(kSplitNames[i]) + ".bin");
    const fs::path npy = dir / (std::string(kSplitNames[i]) + ".npy");
    if (fs::exists(bin) && fs::exists(npy))
      throw ConfigError("corpus directory '" + dir.string() + "' has both " + bin.filename().string() +
                        " and " + npy.filename().string() + ": keep one");
    const fs::path* found = fs::exists(bin) ? &bin : fs::exists(npy) ? &npy : nullptr;
    if (!found)
      throw ConfigError("corpus directory '" + dir.string() + "' has no " + kSplitNames[i] +
                        " split: expected '" + bin.string() + "' or '" + npy.string() +
                        "' (data.tokenizer: ids)");
    splits[i] = {found->string(), read_text(*found)};
  }
  return splits;
}

// data.token_bytes: one count of bytes of text per id (vocab_size of them, each >= 0), then 0
// for <mask>. Anything else is refused naming the file and the key.
std::vector<int64_t> read_token_bytes(const std::string& path, int64_t vocab_size) {
  const std::string where = path + " (data.token_bytes)";
  if (fs::path(path).extension() != ".npy")
    throw ConfigError(where + ": expected a .npy file of one byte count per id (np.save)");
  if (!fs::is_regular_file(path)) throw ConfigError(where + ": no such file");
  const std::string bytes = read_text(path);
  const IdsLayout layout = npy_layout(where, bytes);
  if (layout.count != vocab_size)
    throw ConfigError(where + ": holds " + std::to_string(layout.count) + " byte counts; data.vocab_size is " +
                      std::to_string(vocab_size) + ": give one per id");
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size) + 1, 0);  // + <mask>: no text
  for (int64_t i = 0; i < vocab_size; ++i) {
    counts[size_t(i)] = integer_at(bytes, layout, i);
    if (counts[size_t(i)] < 0)
      throw ConfigError(where + ": id " + std::to_string(i) + " has " + std::to_string(counts[size_t(i)]) +
                        " bytes; a count is at least 0");
  }
  return counts;
}

// The layout of a split file: .npy by its header, .bin by data.ids_dtype.
IdsLayout ids_layout(const SplitSource& split, IdsType dtype) {
  if (fs::path(split.where).extension() == ".npy") return npy_layout(split.where, split.text);
  IdsLayout layout;
  layout.item = size_t(dtype);
  if (split.text.size() % layout.item != 0)
    throw ConfigError(split.where + ": " + std::to_string(split.text.size()) + " bytes is not a whole "
                      "number of " + enum_name(dtype) + " ids (" + std::to_string(layout.item) +
                      " bytes each): the file is truncated, or data.ids_dtype is not its type");
  layout.count = int64_t(split.text.size() / layout.item);
  return layout;
}

// A cache directory per (corpus location, tokenizer, split fractions, tokenizer model), named
// for people.
fs::path corpus_cache_dir(const CorpusOptions& options, const fs::path& source,
                          const std::string& name, uint64_t model_hash) {
  std::error_code error;
  fs::path location = fs::canonical(source, error);
  if (error) location = fs::absolute(source);
  std::string identity = location.string() + '\0' + enum_name(options.tokenizer);
  if (options.tokenizer == Tokenizer::sentencepiece || options.tokenizer == Tokenizer::hf)
    identity += '\0' + hex64(model_hash);
  if (fs::is_regular_file(location)) {
    for (const double f : options.split_fractions) {
      char text[32];
      std::snprintf(text, sizeof(text), "%.17g,", f);
      identity += text;
    }
  }
  return fs::path(options.cache_dir) /
         (name + "." + enum_name(options.tokenizer) + "." + hex64(content_hash(identity)).substr(0, 12));
}

CacheKey split_key(Tokenizer tokenizer, uint64_t vocab_hash, const SplitSource& source) {
  CacheKey key;
  key.kind = CacheKind::tokens;
  key.tokenizer = tokenizer;
  key.vocab_hash = vocab_hash;
  key.source_hash = content_hash(source.text);
  key.source_bytes = source.text.size();
  return key;
}

void write_tokens(const std::string& path, const CacheKey& key,
                  const std::vector<int32_t>& tokens) {
  write_cache(path, key, tokens.data(), tokens.size() * sizeof(int32_t), tokens.size());
}

// A tokens_with_bytes cache file: the ids, then the bytes of text behind each.
template <class Encoded>
void write_tokens_with_bytes(const std::string& path, const CacheKey& key, const Encoded& encoded) {
  std::vector<int32_t> payload(encoded.ids);
  payload.insert(payload.end(), encoded.bytes.begin(), encoded.bytes.end());
  write_cache(path, key, payload.data(), payload.size() * sizeof(int32_t), encoded.ids.size());
}

std::vector<std::string> parse_vocabulary(const CacheFile& file) {
  std::vector<std::string> words;
  words.reserve(file.count);
  const std::string_view payload(file.payload, file.payload_bytes);
  size_t begin = 0;
  while (begin < payload.size()) {
    const size_t end = payload.find('\n', begin);
    words.emplace_back(payload.substr(begin, end - begin));
    begin = end + 1;
  }
  TORCH_CHECK(words.size() == file.count, "vocabulary cache ", file.path, " holds ", words.size(),
              " words, its header says ", file.count);
  return words;
}

}  // namespace

const char* to_string(CacheStatus status) {
  switch (status) {
    case CacheStatus::not_cached: return "not cached";
    case CacheStatus::reused: return "reused";
    case CacheStatus::created: return "created";
    case CacheStatus::rebuilt_stale: return "rebuilt (stale)";
    case CacheStatus::rebuilt_corrupt: return "rebuilt (corrupt)";
  }
  return "unknown";
}

TokenStream TokenStream::from_tokens(std::vector<int32_t> tokens, int64_t num_bytes) {
  auto owned = std::make_shared<std::vector<int32_t>>(std::move(tokens));
  TokenStream stream;
  stream.data_ = owned->data();
  stream.size_ = static_cast<int64_t>(owned->size());
  stream.num_bytes_ = num_bytes < 0 ? stream.size_ : num_bytes;
  stream.mapping_ = std::move(owned);
  return stream;
}

torch::Tensor TokenStream::slice(int64_t begin, int64_t length) const {
  TORCH_CHECK(begin >= 0 && length >= 0 && begin + length <= size_, "TokenStream::slice [", begin,
              ", ", begin + length, ") is outside the stream of ", size_, " tokens");
  auto keep_alive = mapping_;
  return torch::from_blob(const_cast<int32_t*>(data_ + begin), {length},
                          [keep_alive](void*) {}, torch::TensorOptions().dtype(torch::kInt32));
}

const TokenStream& Corpus::split(Split which) const {
  switch (which) {
    case Split::train: return train;
    case Split::valid: return valid;
    case Split::test: return test;
  }
  throw ConfigError("unknown corpus split");
}

uint64_t Corpus::vocabulary_hash() const {
  std::string text = enum_name(tokenizer) + " " + std::to_string(vocab_size) + " mask " +
                     std::to_string(mask_token) + "\n";
  for (const auto& word : vocabulary) text += word + "\n";
  return content_hash(text);
}

YAML::Node Corpus::identity() const {
  YAML::Node id(YAML::NodeType::Map);
  id["tokenizer"] = enum_name(tokenizer);
  id["vocab_size"] = vocab_size;
  id["vocabulary"] = hex64(vocabulary_hash());
  id["train_tokens"] = train.size();
  id["train"] = hex64(content_hash(train.data(), size_t(train.size()) * sizeof(int32_t)));
  return id;
}

std::string Corpus::token_text(int32_t id) const {
  TORCH_CHECK(id >= 0 && id < vocab_size, "token id ", id, " is outside the vocabulary of ",
              vocab_size);
  if (byte_level()) return id == mask_token ? "<mask>" : std::string(1, static_cast<char>(id));
  if (tokenizer == Tokenizer::ids) return id == mask_token ? "<mask>" : std::to_string(id);
  if (id == mask_token) return "<mask>";  // word level has it in its vocabulary too
  return vocabulary[id];
}

int64_t Corpus::bytes_at(const TokenStream& stream, int64_t position) const {
  if (byte_level()) return 1;
  if (stream.text_bytes()) return stream.text_bytes()[position];
  if (!token_bytes.empty()) return token_bytes[size_t(stream.data()[position])];
  return 0;
}

namespace {

// The three splits as the options find them, the training split not empty.
std::array<SplitSource, 3> read_splits(const CorpusOptions& options) {
  const fs::path source(options.path);
  if (options.path.empty())
    throw ConfigError("data.path is not set: the config (or --set data.path=...) names the corpus directory or text "
                      "file");
  if (!fs::exists(source)) throw ConfigError("corpus path '" + options.path + "' does not exist");
  const bool directory = fs::is_directory(source);
  const bool ids = options.tokenizer == Tokenizer::ids;
  if (ids && !directory)
    throw ConfigError("corpus path '" + options.path + "' is a file; data.tokenizer ids reads a "
                      "directory of {train,valid,test}.bin or .npy");
  std::array<SplitSource, 3> splits =
      ids ? read_ids_directory(source)
          : directory ? read_directory(source) : read_single_file(source, options.split_fractions);
  if (splits[0].text.empty()) {
    throw ConfigError("the training split " + splits[0].where + " is empty");
  }
  return splits;
}

}  // namespace

TrainingText training_text(const CorpusOptions& options) {
  if (options.tokenizer == Tokenizer::ids)
    throw ConfigError("corpus '" + options.path + "' is pre-tokenised (data.tokenizer: ids): it has "
                      "no text to train a tokenizer on");
  SplitSource train = std::move(read_splits(options)[0]);
  return {std::move(train.where), std::move(train.text)};
}

namespace {

// Split i (kSplitNames' order) of `corpus`.
TokenStream* corpus_split(Corpus& corpus, size_t i) {
  return i == 0 ? &corpus.train : i == 1 ? &corpus.valid : &corpus.test;
}

// Where a corpus's cache files go, one for each split and a word-level vocabulary.
using CachePath = std::function<std::string(const std::string& file)>;

// Byte level: the UTF-8 bytes of each split, then <mask>.
void load_byte_splits(Corpus& corpus, const std::array<SplitSource, 3>& splits, const CachePath& cache_path) {
  corpus.vocab_size = kByteVocabSize;
  corpus.mask_token = kByteMask;
  const uint64_t vocab_hash = content_hash(std::string_view("bytes 0..255, <mask> = 256"));
  for (size_t i = 0; i < 3; ++i) {
    const std::string path = cache_path(std::string(kSplitNames[i]) + ".tokens");
    const CacheKey key = split_key(Tokenizer::byte, vocab_hash, splits[i]);
    const CacheFile file = open_or_build_cache(path, key, [&] { write_tokens(path, key, byte_tokens(splits[i].text)); });
    *corpus_split(corpus, i) = token_stream(file, static_cast<int64_t>(splits[i].text.size()));
  }
}

// Ids made elsewhere: the given ids, then <mask>; the cache holds them as int32, checked once
// when made.
void load_id_splits(Corpus& corpus, const std::array<SplitSource, 3>& splits, const CachePath& cache_path,
                    const CorpusOptions& options) {
  corpus.vocab_size = options.vocab_size + 1;
  corpus.mask_token = static_cast<int32_t>(options.vocab_size);
  const uint64_t vocab_hash = content_hash("ids " + std::to_string(options.vocab_size) + " " + enum_name(options.ids_dtype));
  for (size_t i = 0; i < 3; ++i) {
    const std::string path = cache_path(std::string(kSplitNames[i]) + ".tokens");
    const CacheKey key = split_key(Tokenizer::ids, vocab_hash, splits[i]);
    const CacheFile file = open_or_build_cache(path, key, [&] {
      const IdsLayout layout = ids_layout(splits[i], options.ids_dtype);
      write_tokens(path, key, decode_ids(splits[i].where, splits[i].text, layout, options.vocab_size));
    });
    if (file.count == 0) throw ConfigError(splits[i].where + ": holds no token ids (an empty split)");
    *corpus_split(corpus, i) = token_stream(file, 0);  // no text behind the ids: no bytes to count
  }
  if (!options.token_bytes.empty()) corpus.token_bytes = read_token_bytes(options.token_bytes, options.vocab_size);
}

// SentencePiece: the model's pieces, then <mask>; each split's ids cached with the bytes behind
// them.
void load_piece_splits(Corpus& corpus, const std::array<SplitSource, 3>& splits, const CachePath& cache_path,
                       const std::shared_ptr<const SentencePieceModel>& pieces, uint64_t model_hash) {
  corpus.sentencepiece = pieces;
  for (int32_t id = 0; id < pieces->size(); ++id) corpus.vocabulary.push_back(pieces->piece(id));
  corpus.vocab_size = int64_t(pieces->size()) + 1;
  corpus.mask_token = pieces->size();
  corpus.eos_token = pieces->eos();
  corpus.unk_token = pieces->unk();
  for (size_t i = 0; i < 3; ++i) {
    const std::string path = cache_path(std::string(kSplitNames[i]) + ".tokens");
    CacheKey key = split_key(Tokenizer::sentencepiece, model_hash, splits[i]);
    key.kind = CacheKind::tokens_with_bytes;
    const CacheFile file = open_or_build_cache(
        path, key, [&] { write_tokens_with_bytes(path, key, pieces->encode_lines(splits[i].text)); });
    *corpus_split(corpus, i) = token_stream(file, static_cast<int64_t>(splits[i].text.size()));
  }
}

// A Hugging Face tokenizer.json: its ids (the rows past its size, up to data.vocab_size, are the
// model's and never produced); each split encoded whole, cached with the bytes behind each id.
void load_hf_splits(Corpus& corpus, const std::array<SplitSource, 3>& splits, const CachePath& cache_path,
                    const std::shared_ptr<const HfTokenizer>& tokenizer, uint64_t model_hash,
                    const CorpusOptions& options) {
  corpus.hf = tokenizer;
  const int64_t size = tokenizer->size();
  if (options.vocab_size > 0 && options.vocab_size < size)
    throw ConfigError("data.vocab_size " + std::to_string(options.vocab_size) + " is below the " +
                      std::to_string(size) + " ids of " + options.tokenizer_model +
                      ": the tokenizer does not match the model");
  corpus.vocab_size = std::max<int64_t>(size, options.vocab_size);
  corpus.mask_token = -1;
  corpus.vocabulary.reserve(size_t(corpus.vocab_size));
  for (int32_t id = 0; id < int32_t(corpus.vocab_size); ++id)
    corpus.vocabulary.push_back(id < size ? tokenizer->token_bytes(id) : std::string());
  if (const auto eos = tokenizer->eos()) corpus.eos_token = *eos;
  const uint64_t vocab_hash = model_hash;  // the ids depend on the file alone, not on the padded size
  for (size_t i = 0; i < 3; ++i) {
    const std::string path = cache_path(std::string(kSplitNames[i]) + ".tokens");
    CacheKey key = split_key(Tokenizer::hf, vocab_hash, splits[i]);
    key.kind = CacheKind::tokens_with_bytes;
    const CacheFile file = open_or_build_cache(path, key, [&] {
      HfTokenizer::Encoded encoded;
      try {
        encoded = tokenizer->encode(splits[i].text, std::max(1, at::get_num_threads()));
      } catch (const ConfigError& e) {
        throw ConfigError(splits[i].where + ": " + e.what());
      }
      write_tokens_with_bytes(path, key, encoded);
    });
    *corpus_split(corpus, i) = token_stream(file, static_cast<int64_t>(splits[i].text.size()));
  }
}

// Word level: the vocabulary comes from the training split and is cached like a split.
void load_word_splits(Corpus& corpus, const std::array<SplitSource, 3>& splits, const CachePath& cache_path) {
  std::optional<WordVocabulary> built;  // set when built (or needed) in this call
  const std::string vocab_path = cache_path("vocabulary");
  CacheKey vocab_key;
  vocab_key.kind = CacheKind::vocabulary;
  vocab_key.tokenizer = Tokenizer::word;
  vocab_key.source_hash = content_hash(splits[0].text);
  vocab_key.source_bytes = splits[0].text.size();
  const CacheFile vocab_file = open_or_build_cache(vocab_path, vocab_key, [&] {
    built.emplace(WordVocabulary::from_text(splits[0].text));
    if (built->size() == kWordSpecials) throw ConfigError("the training split " + splits[0].where + " has no words");
    std::string payload;
    for (const std::string& word : built->words()) (payload += word) += '\n';
    write_cache(vocab_path, vocab_key, payload.data(), payload.size(), built->size());
  });
  corpus.vocabulary = parse_vocabulary(vocab_file);
  corpus.vocabulary_cache = vocab_file.status;
  corpus.vocab_size = static_cast<int64_t>(corpus.vocabulary.size());
  corpus.eos_token = kWordEos;
  corpus.unk_token = kWordUnk;
  corpus.mask_token = kWordMask;
  for (size_t i = 0; i < 3; ++i) {
    const std::string path = cache_path(std::string(kSplitNames[i]) + ".tokens");
    const CacheKey key = split_key(Tokenizer::word, vocab_file.payload_checksum, splits[i]);
    const CacheFile file = open_or_build_cache(path, key, [&] {
      if (!built) built.emplace(corpus.vocabulary);
      write_tokens(path, key, built->encode(splits[i].text));
    });
    *corpus_split(corpus, i) = token_stream(file, static_cast<int64_t>(splits[i].text.size()));
  }
}

}  // namespace

Corpus load_corpus(const CorpusOptions& options) {
  const fs::path source(options.path);
  // The tokenizer model before the corpus's text: a wrong model is refused without reading it.
  std::shared_ptr<const SentencePieceModel> pieces;
  if (options.tokenizer == Tokenizer::sentencepiece) {
    if (options.tokenizer_model.empty())
      throw ConfigError("data.tokenizer sentencepiece needs data.tokenizer_model: a SentencePiece "
                        ".model file (extrap tokenizer train makes one from the training split)");
    pieces = std::make_shared<const SentencePieceModel>(SentencePieceModel::load(options.tokenizer_model));
  }
  std::shared_ptr<const HfTokenizer> hf;
  std::shared_ptr<const std::string> hf_json;
  if (options.tokenizer == Tokenizer::hf) {
    if (options.tokenizer_model.empty())
      throw ConfigError("data.tokenizer hf needs data.tokenizer_model: a Hugging Face tokenizer.json");
    hf_json = std::make_shared<const std::string>(read_file(options.tokenizer_model));
    hf = std::make_shared<const HfTokenizer>(HfTokenizer::from_json(*hf_json, options.tokenizer_model));
  }
  const std::array<SplitSource, 3> splits = read_splits(options);
  const bool directory = fs::is_directory(source);

  Corpus corpus;
  fs::path absolute = fs::absolute(source).lexically_normal();
  if (!absolute.has_filename()) absolute = absolute.parent_path();  // "dir/" names "dir"
  corpus.name = (directory ? absolute.filename() : absolute.stem()).string();
  corpus.tokenizer = options.tokenizer;
  const uint64_t model_hash = pieces ? content_hash(pieces->bytes()) : hf ? content_hash(*hf_json) : 0;
  corpus.hf_json = hf_json;
  const fs::path cache_dir = corpus_cache_dir(options, source, corpus.name, model_hash);
  corpus.cache_dir = cache_dir.string();
  std::error_code error;
  fs::create_directories(cache_dir, error);
  if (error) throw ConfigError("cannot create cache directory '" + cache_dir.string() + "': " + error.message());
  const CachePath cache_path = [&](const std::string& file) { return (cache_dir / file).string(); };
  switch (options.tokenizer) {
    case Tokenizer::byte: load_byte_splits(corpus, splits, cache_path); break;
    case Tokenizer::ids: load_id_splits(corpus, splits, cache_path, options); break;
    case Tokenizer::sentencepiece: load_piece_splits(corpus, splits, cache_path, pieces, model_hash); break;
    case Tokenizer::word: load_word_splits(corpus, splits, cache_path); break;
    case Tokenizer::hf: load_hf_splits(corpus, splits, cache_path, hf, model_hash, options); break;
  }
  return corpus;
}

}  // namespace extrap
