// The on-disk cache of tokenised splits and word vocabularies.
//
// One file per tokenised split (payload: int32 token ids) and one per word vocabulary (payload:
// the words in id order, each followed by '\n'). A file is an 80-byte CacheHeader followed by
// the payload, in this machine's byte order (a cache is local to the machine that wrote it).
// The header records what the file was made from (tokenizer, vocabulary hash, source hash and
// size), the payload's size, element count and checksum, and a checksum of the header itself.
//
// A file is reused only if every check passes. Otherwise the caller rebuilds it, and the reason
// is reported: missing, stale (made from another source, vocabulary, tokenizer or format
// version) or corrupt (truncated, bad magic, a checksum mismatch). Files are written to a unique
// temporary name in the same directory and renamed into place, so a reader never sees a
// half-written file and two processes building the same cache both leave a valid one.
#pragma once

#include "core/base/hashing.h"
#include "core/data/corpus.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace extrap {


// tokens: int32 ids. vocabulary: words, each followed by '\n'. tokens_with_bytes: int32 ids, then
// as many int32 counts of the bytes of text behind each (SentencePiece; TokenStream::text_bytes).
enum class CacheKind : uint32_t { tokens = 1, vocabulary = 2, tokens_with_bytes = 3 };

// What a cache file must have been made from to be reused.
struct CacheKey {
  CacheKind kind = CacheKind::tokens;
  Tokenizer tokenizer = Tokenizer::byte;
  uint64_t vocab_hash = 0;    // tokens: the vocabulary's payload checksum; vocabulary: 0
  uint64_t source_hash = 0;   // content_hash of the source text
  uint64_t source_bytes = 0;  // size of the source text
};

// A validated cache file, memory-mapped read-only.
struct CacheFile {
  std::string path;
  CacheKind kind = CacheKind::tokens;
  std::shared_ptr<const void> mapping;  // unmaps when the last owner goes
  const char* payload = nullptr;
  uint64_t payload_bytes = 0;
  uint64_t count = 0;             // tokens or words
  uint64_t payload_checksum = 0;  // content_hash of the payload
  CacheStatus status = CacheStatus::reused;
};

// The cache at `path` if it is valid for `key`. Otherwise nullopt, with `why` saying what is wrong
// and `status` what rebuilding it will be: created (no file), rebuilt_stale or rebuilt_corrupt.
std::optional<CacheFile> open_cache(const std::string& path, const CacheKey& key,
                                    CacheStatus* status, std::string* why);

// Writes a cache file atomically (temporary file, then rename). Throws ConfigError naming the
// path if it cannot be written.
void write_cache(const std::string& path, const CacheKey& key, const void* payload,
                 uint64_t payload_bytes, uint64_t count);

// open_cache(), and when that fails: logs why to stderr (unless the file was simply missing),
// runs `build`, which must write_cache(path, key, ...), and opens the result. The returned
// file's status says which happened.
CacheFile open_or_build_cache(const std::string& path, const CacheKey& key,
                              const std::function<void()>& build);

// A stream over a mapped token cache whose source text had `num_bytes` bytes (with the bytes
// behind each token where the file is tokens_with_bytes).
TokenStream token_stream(const CacheFile& file, int64_t num_bytes);

}  // namespace extrap
