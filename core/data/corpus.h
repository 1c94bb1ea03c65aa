// Corpora: tokenisation, splits and the on-disk token cache.
//
// Five tokenisers (core/data/tokenizer.h has the rules of the first two,
// core/data/sentencepiece.h and core/data/hf_tokenizer.h those of the last two):
//  - word: WikiText format, as fairseq preprocesses it. Whitespace-separated tokens, an
//    end-of-sentence token "<eos>" after every line (blank lines included), vocabulary from
//    the training split only (sorted by descending count, ties by first appearance), unknown
//    words mapped to "<unk>". Each split is one continuous stream (fairseq
//    --sample-break-mode none).
//  - byte: the UTF-8 bytes of any text file; ids 0..255 are the bytes.
//  - ids: token ids made elsewhere (a BPE or unigram tokenizer, say): {train,valid,test}.bin,
//    raw little-endian uint16 or uint32 (data.ids_dtype; nanoGPT's format), or .npy arrays of
//    one dimension and an integer dtype, each id below data.vocab_size.
//  - sentencepiece: subword pieces of a trained SentencePiece model (data.tokenizer_model, a
//    .model file; `extrap tokenizer train` makes one from the training split), each line's
//    pieces then the model's end-of-sentence piece, with the bytes of text behind every token.
//  - hf: a Hugging Face tokenizer.json (byte-level BPE: GPT-2, BLOOM, Llama 3, Qwen2, GPT-NeoX;
//    data.tokenizer_model names the file), each split encoded whole as `tokenizer(text)` gives
//    it, special tokens of the post-processor (a BOS) included, with the bytes of text behind
//    every token. `extrap import` sets it for a released model's folder.
// Special tokens: word level has <eos>, <unk>, <mask> (ids 0, 1, 2 in that order, then the
// words); byte level has <mask> = 256; ids has <mask> = data.vocab_size, after the given ids;
// sentencepiece has the model's own (<unk>, <s>, </s>, ...) and <mask> after its pieces; hf has
// the file's own and no <mask>, and vocab_size is data.vocab_size where given (a model's
// embedding rows, often more than the tokenizer's ids), else the tokenizer's size.
// vocab_size counts them.
//
// A corpus directory holds wiki.{train,valid,test}.tokens or {train,valid,test}.txt. A single
// file is split into contiguous train/valid/test byte ranges by split_fractions, each cut moved
// forward to the next line boundary.
//
// Tokenised splits (and a word-level vocabulary) are cached once under cache_dir, memory-mapped
// and reused while their source is unchanged; a stale or corrupt cache is detected and rebuilt,
// never silently used (core/data/token_cache.h).
#pragma once

#include <torch/torch.h>

#include "core/base/yaml_options.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace extrap {

// The values are part of the token cache's format (core/data/token_cache.h).
enum class Tokenizer : uint32_t { byte = 1, word = 2, ids = 3, sentencepiece = 4, hf = 5 };
template <>
struct EnumNames<Tokenizer> {
  static constexpr std::array<std::pair<const char*, Tokenizer>, 5> table{
      {{"byte", Tokenizer::byte},
       {"word", Tokenizer::word},
       {"ids", Tokenizer::ids},
       {"sentencepiece", Tokenizer::sentencepiece},
       {"hf", Tokenizer::hf}}};
};

// The element type of a pre-tokenised .bin split (data.ids_dtype).
enum class IdsType : uint32_t { uint16 = 2, uint32 = 4 };
template <>
struct EnumNames<IdsType> {
  static constexpr std::array<std::pair<const char*, IdsType>, 2> table{
      {{"uint16", IdsType::uint16}, {"uint32", IdsType::uint32}}};
};

enum class Split { train, valid, test };
template <>
struct EnumNames<Split> {
  static constexpr std::array<std::pair<const char*, Split>, 3> table{
      {{"train", Split::train}, {"valid", Split::valid}, {"test", Split::test}}};
};

struct CorpusOptions {
  std::string path;                    // directory or single text file
  Tokenizer tokenizer = Tokenizer::byte;
  std::string cache_dir = ".cache/extrap";
  std::vector<double> split_fractions = {0.9, 0.05, 0.05};  // single-file corpora only
  int64_t vocab_size = 0;                 // ids: every id is below it (required); hf: the model's rows (0: the tokenizer's)
  IdsType ids_dtype = IdsType::uint16;    // ids: the element type of .bin splits
  std::string token_bytes;                // ids: .npy of each id's length in bytes of text
  std::string tokenizer_model;            // sentencepiece: the .model file; hf: the tokenizer.json (required)
};

// What loading did with a cache file.
enum class CacheStatus {
  not_cached,       // nothing on disk: an in-memory stream, or a byte-level vocabulary
  reused,           // a valid cache was mapped
  created,          // there was no cache: tokenised and written
  rebuilt_stale,    // the cache came from another source, vocabulary or format: rebuilt
  rebuilt_corrupt,  // the cache failed a check (truncated, bad magic, checksum): rebuilt
};
const char* to_string(CacheStatus status);

struct CacheFile;  // core/data/token_cache.h
class SentencePieceModel;  // core/data/sentencepiece.h
class HfTokenizer;         // core/data/hf_tokenizer.h

// A read-only stream of token ids, memory-mapped from the cache (or held in memory).
class TokenStream {
 public:
  TokenStream() = default;
  // An in-memory stream, for tests and tools. num_bytes < 0 means one byte per token.
  static TokenStream from_tokens(std::vector<int32_t> tokens, int64_t num_bytes = -1);

  int64_t size() const { return size_; }
  const int32_t* data() const { return data_; }
  // A tensor view over [begin, begin + length) (no copy; int32, shape (length)). The view keeps
  // the mapping alive; it is read-only (writing to it faults): clone() before modifying.
  torch::Tensor slice(int64_t begin, int64_t length) const;
  // Number of UTF-8 bytes the stream's text had (for bits per byte).
  int64_t num_bytes() const { return num_bytes_; }
  // The bytes of text behind each token (size() of them, summing to num_bytes()), where the
  // tokenizer says (sentencepiece); null otherwise.
  const int32_t* text_bytes() const { return text_bytes_; }
  CacheStatus cache_status() const { return cache_status_; }
  const std::string& cache_path() const { return cache_path_; }  // empty when in memory

 private:
  friend TokenStream token_stream(const CacheFile& file, int64_t num_bytes);  // token_cache.h
  std::shared_ptr<const void> mapping_;  // keeps the mmap (or the vector) alive
  const int32_t* data_ = nullptr;
  const int32_t* text_bytes_ = nullptr;
  int64_t size_ = 0;
  int64_t num_bytes_ = 0;
  CacheStatus cache_status_ = CacheStatus::not_cached;
  std::string cache_path_;
};

struct Corpus {
  std::string name;                     // the directory's name, or the file's name sans extension
  Tokenizer tokenizer = Tokenizer::byte;
  int64_t vocab_size = 0;
  int32_t mask_token = -1;
  int32_t eos_token = -1;               // word level only
  int32_t unk_token = -1;               // word level only
  // word level: id -> word; sentencepiece: id -> piece (<mask> is not one); hf: id -> the
  // token's bytes (ids the tokenizer does not have: empty); byte level and ids: empty.
  std::vector<std::string> vocabulary;
  std::shared_ptr<const SentencePieceModel> sentencepiece;  // sentencepiece: the model
  std::shared_ptr<const HfTokenizer> hf;                    // hf: the tokenizer
  std::shared_ptr<const std::string> hf_json;               // hf: its tokenizer.json's bytes
  // ids with data.token_bytes: the bytes of text behind each id (<mask>: 0), for exact bits
  // per byte; empty otherwise.
  std::vector<int64_t> token_bytes;
  TokenStream train, valid, test;
  std::string cache_dir;                // where this corpus's cache files live
  CacheStatus vocabulary_cache = CacheStatus::not_cached;  // word level: the vocabulary file

  bool byte_level() const { return tokenizer == Tokenizer::byte; }
  bool word_level() const { return tokenizer == Tokenizer::word; }
  // Whether the corpus has text behind its ids (byte and word level): retrieval tasks, prompts
  // as text and bits per byte need it.
  bool has_text() const { return tokenizer != Tokenizer::ids; }
  // Whether the bytes of text behind the scored tokens are known (bits per byte): byte level,
  // sentencepiece, or ids with data.token_bytes.
  bool counts_bytes() const {
    return byte_level() || tokenizer == Tokenizer::sentencepiece || tokenizer == Tokenizer::hf ||
           !token_bytes.empty();
  }
  // The bytes of text behind the token at `position` of `stream` (one of this corpus's
  // splits); 0 where the corpus does not count bytes.
  int64_t bytes_at(const TokenStream& stream, int64_t position) const;
  const TokenStream& split(Split which) const;
  // A hash of the tokenizer and the vocabulary (id -> token): a model is only meaningful with
  // the vocabulary it was trained on.
  uint64_t vocabulary_hash() const;
  // What a trained model depends on: tokenizer, vocabulary hash, the training tokens' count
  // and hash (part of a run's fingerprint).
  YAML::Node identity() const;
  // Human-readable form of a token (for samples and debugging): the word, "<mask>", for byte
  // level the raw byte, so that concatenating a byte sequence's texts gives back its UTF-8, and
  // for ids the id in decimal, for sentencepiece the piece.
  std::string token_text(int32_t id) const;
};

// Loads (and caches) a corpus. Errors name the path at fault and are ConfigError.
Corpus load_corpus(const CorpusOptions& options);

// The text of a corpus's training split as load_corpus finds it (a directory's train file, or
// a single file's first part by split_fractions), and where it came from.
struct TrainingText {
  std::string where;
  std::string text;
};
TrainingText training_text(const CorpusOptions& options);

}  // namespace extrap
