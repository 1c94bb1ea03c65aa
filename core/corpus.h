// Corpora: tokenisation, splits and the on-disk token cache.
//
// Two tokenisers:
//  - word: WikiText format. Whitespace-separated tokens, an end-of-sentence token "<eos>"
//    appended at every line end, vocabulary from the training split only (sorted by
//    frequency, ties by first appearance), unknown words mapped to "<unk>". Each split is one
//    continuous stream (fairseq --sample-break-mode none).
//  - byte: UTF-8 bytes of any text file; ids 0..255 are the bytes.
// Special tokens: word level has <eos>, <unk>, <mask> (ids 0, 1, 2 in that order, then the
// words); byte level has <mask> = 256. vocab_size counts them.
//
// A corpus directory holds wiki.{train,valid,test}.tokens or {train,valid,test}.txt. A single
// file is split by contiguous byte ranges (default 90/5/5) at line boundaries.
//
// Tokenised splits are cached once (binary, memory-mapped) with a header recording the
// tokenizer, the vocabulary hash and the hash of the source; a stale or corrupt cache is
// detected and rebuilt, never silently used.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace extrap {

struct CorpusOptions {
  std::string path;                    // directory or single text file
  std::string tokenizer = "byte";      // byte | word
  std::string cache_dir = ".cache/extrap";
  std::vector<double> split_fractions = {0.9, 0.05, 0.05};  // single-file corpora only
};

// A read-only, memory-mapped stream of token ids.
class TokenStream {
 public:
  TokenStream() = default;
  int64_t size() const { return size_; }
  const int32_t* data() const { return data_; }
  // A tensor view over [begin, begin + length) (no copy; int32). Valid while the stream lives.
  torch::Tensor slice(int64_t begin, int64_t length) const;
  // Number of UTF-8 bytes the stream's text had (for bits per byte).
  int64_t num_bytes() const { return num_bytes_; }

 private:
  friend class TokenCache;
  std::shared_ptr<void> mapping_;  // keeps the mmap alive
  const int32_t* data_ = nullptr;
  int64_t size_ = 0;
  int64_t num_bytes_ = 0;
};

struct Corpus {
  std::string name;                     // e.g. the directory's name
  std::string tokenizer;                // byte | word
  int64_t vocab_size = 0;
  int32_t mask_token = -1;
  int32_t eos_token = -1;               // word level only
  int32_t unk_token = -1;               // word level only
  std::vector<std::string> vocabulary;  // word level: id -> word; byte level: empty
  TokenStream train, valid, test;

  bool byte_level() const { return tokenizer == "byte"; }
  const TokenStream& split(const std::string& name) const;  // train | valid | test
  // Human-readable form of a token (for samples and debugging).
  std::string token_text(int32_t id) const;
};

// Loads (and caches) a corpus. Errors name the path at fault.
Corpus load_corpus(const CorpusOptions& options);

}  // namespace extrap
