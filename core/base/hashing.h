// Content hashes: XXH3 (64-bit) from libxxhash, for cache keys, checksums, spec hashes and
// run fingerprints. Not cryptographic: they detect change and corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace extrap {

uint64_t content_hash(const void* data, size_t bytes);
inline uint64_t content_hash(std::string_view text) { return content_hash(text.data(), text.size()); }

// 16 lower-case hex digits.
std::string hex64(uint64_t value);

// XXH3 of several pieces added in turn: the hash of their concatenation.
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;
  ContentHasher& add(const void* data, size_t bytes);
  ContentHasher& add(std::string_view text) { return add(text.data(), text.size()); }
  // A piece whose length is part of the hash: ("ab", "c") and ("a", "bc") differ.
  ContentHasher& add_field(std::string_view text);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t
};

// The hash and size of a file's bytes, read in chunks. Throws ConfigError naming the file when
// it cannot be read.
struct FileDigest {
  uint64_t hash = 0;
  uint64_t bytes = 0;
};
FileDigest file_digest(const std::string& path);

}  // namespace extrap
