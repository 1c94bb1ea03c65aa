#include "core/base/hashing.h"

#include "core/base/errors.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace extrap {

uint64_t content_hash(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

ContentHasher::ContentHasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

ContentHasher::~ContentHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

ContentHasher& ContentHasher::add(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
  return *this;
}

ContentHasher& ContentHasher::add_field(std::string_view text) {
  const uint64_t size = text.size();
  return add(&size, sizeof size).add(text);
}

uint64_t ContentHasher::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

std::string hex64(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016" PRIx64, value);
  return buffer;
}

FileDigest file_digest(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw ConfigError(path + ": cannot read (" + std::strerror(errno) + ")");
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  FileDigest digest;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), file.get());
    if (n > 0) {
      XXH3_64bits_update(state.get(), buffer.data(), n);
      digest.bytes += n;
    }
    if (n < buffer.size()) {
      if (std::ferror(file.get())) throw ConfigError(path + ": read error (" + std::strerror(errno) + ")");
      break;
    }
  }
  digest.hash = XXH3_64bits_digest(state.get());
  return digest;
}

}  // namespace extrap
