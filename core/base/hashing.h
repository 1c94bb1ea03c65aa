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

// The hash and size of a file's bytes, read in chunks. Throws ConfigError naming the file when
// it cannot be read.
struct FileDigest {
  uint64_t hash = 0;
  uint64_t bytes = 0;
};
FileDigest file_digest(const std::string& path);

}  // namespace extrap
