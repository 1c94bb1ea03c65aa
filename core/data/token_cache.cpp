#include "core/data/token_cache.h"

#include "core/base/errors.h"
#include "core/base/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>

namespace extrap {
namespace {

constexpr char kMagic[8] = {'E', 'X', 'T', 'R', 'A', 'P', 'T', 'C'};
// Bump when the header, the payload layout or a tokeniser's output changes.
constexpr uint32_t kCacheFormat = 2;  // 2: XXH3 checksums

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t kind;       // CacheKind
  uint32_t tokenizer;  // Tokenizer
  uint32_t reserved;   // 0
  uint64_t vocab_hash;
  uint64_t source_hash;
  uint64_t source_bytes;
  uint64_t count;
  uint64_t payload_bytes;
  uint64_t payload_checksum;
  uint64_t header_checksum;  // content_hash of every byte above
};
static_assert(sizeof(CacheHeader) == 80, "the header layout is part of the format");
static_assert(sizeof(CacheHeader) % alignof(int32_t) == 0, "the payload must stay aligned");

uint64_t header_checksum(const CacheHeader& header) {
  return content_hash(&header, offsetof(CacheHeader, header_checksum));
}


// The whole file mapped read-only, or null with `why` set.
std::shared_ptr<const void> map_file(const std::string& path, uint64_t* size, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = std::string("cannot open: ") + std::strerror(errno);
    return nullptr;
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || info.st_size <= 0) {
    ::close(fd);
    *why = "empty file";
    return nullptr;
  }
  *size = static_cast<uint64_t>(info.st_size);
  void* base = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping stays valid
  if (base == MAP_FAILED) {
    *why = std::string("cannot map: ") + std::strerror(errno);
    return nullptr;
  }
  const uint64_t length = *size;
  return std::shared_ptr<const void>(base, [length](const void* p) {
    ::munmap(const_cast<void*>(p), length);
  });
}

}  // namespace

std::optional<CacheFile> open_cache(const std::string& path, const CacheKey& key,
                                    CacheStatus* status, std::string* why) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    *status = CacheStatus::created;
    *why = "no cache file";
    return std::nullopt;
  }
  const auto corrupt = [&](std::string reason) {
    *status = CacheStatus::rebuilt_corrupt;
    *why = "corrupt cache (" + reason + ")";
    return std::nullopt;
  };
  const auto stale = [&](std::string reason) {
    *status = CacheStatus::rebuilt_stale;
    *why = "stale cache (" + reason + ")";
    return std::nullopt;
  };

  uint64_t file_bytes = 0;
  std::string map_error;
  auto mapping = map_file(path, &file_bytes, &map_error);
  if (!mapping) return corrupt(map_error);
  if (file_bytes < sizeof(CacheHeader)) {
    return corrupt("truncated: " + std::to_string(file_bytes) + " bytes, shorter than its header");
  }
  CacheHeader header;
  std::memcpy(&header, mapping.get(), sizeof(header));
  if (std::memcmp(header.magic, kMagic, sizeof(kMagic)) != 0) return corrupt("bad magic");
  if (header.version != kCacheFormat) {
    return stale("format version " + std::to_string(header.version) + ", expected " +
                 std::to_string(kCacheFormat));
  }
  if (header.header_checksum != header_checksum(header)) return corrupt("header checksum mismatch");
  if (header.kind != static_cast<uint32_t>(key.kind) ||
      header.tokenizer != static_cast<uint32_t>(key.tokenizer)) {
    return stale("made for another tokenizer or kind of file");
  }
  const bool same_source =
      header.source_bytes == key.source_bytes && header.source_hash == key.source_hash;
  if (!same_source) {
    return stale("source changed: " + std::to_string(header.source_bytes) + " bytes, hash " +
                 hex64(header.source_hash) + " -> " + std::to_string(key.source_bytes) +
                 " bytes, hash " + hex64(key.source_hash));
  }
  if (header.vocab_hash != key.vocab_hash) return stale("vocabulary changed");
  if (file_bytes != sizeof(CacheHeader) + header.payload_bytes) {
    return corrupt("size " + std::to_string(file_bytes) + " bytes, header says " +
                   std::to_string(sizeof(CacheHeader) + header.payload_bytes));
  }
  const uint64_t arrays = key.kind == CacheKind::tokens ? 1 : key.kind == CacheKind::tokens_with_bytes ? 2 : 0;
  if (arrays > 0 && header.payload_bytes != arrays * header.count * sizeof(int32_t)) {
    return corrupt("payload size does not match its token count");
  }
  const char* payload = static_cast<const char*>(mapping.get()) + sizeof(CacheHeader);
  if (content_hash(payload, header.payload_bytes) != header.payload_checksum) {
    return corrupt("payload checksum mismatch");
  }

  CacheFile file;
  file.path = path;
  file.kind = key.kind;
  file.mapping = std::move(mapping);
  file.payload = payload;
  file.payload_bytes = header.payload_bytes;
  file.count = header.count;
  file.payload_checksum = header.payload_checksum;
  file.status = CacheStatus::reused;
  return file;
}

void write_cache(const std::string& path, const CacheKey& key, const void* payload,
                 uint64_t payload_bytes, uint64_t count) {
  CacheHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kCacheFormat;
  header.kind = static_cast<uint32_t>(key.kind);
  header.tokenizer = static_cast<uint32_t>(key.tokenizer);
  header.vocab_hash = key.vocab_hash;
  header.source_hash = key.source_hash;
  header.source_bytes = key.source_bytes;
  header.count = count;
  header.payload_bytes = payload_bytes;
  header.payload_checksum = content_hash(payload, payload_bytes);
  header.header_checksum = header_checksum(header);

  // A name no other writer uses, in the same directory so that rename() is atomic.
  std::random_device entropy;
  const std::string temporary =
      path + ".tmp." + std::to_string(::getpid()) + "." + hex64(entropy()).substr(8);
  // Durable before it is renamed into place; a failed write names the file and the reason (a
  // full disk is "no space left on device") and leaves no temporary file.
  write_file_atomic(path,
                    {std::string_view(reinterpret_cast<const char*>(&header), sizeof(header)),
                     std::string_view(static_cast<const char*>(payload), size_t(payload_bytes))},
                    temporary);
}

CacheFile open_or_build_cache(const std::string& path, const CacheKey& key,
                              const std::function<void()>& build) {
  CacheStatus status = CacheStatus::created;
  std::string why;
  if (auto file = open_cache(path, key, &status, &why)) return std::move(*file);
  if (status != CacheStatus::created) {
    std::cerr << "extrap: rebuilding " << path << ": " << why << "\n";
  }
  build();
  CacheStatus reopened = CacheStatus::created;
  auto file = open_cache(path, key, &reopened, &why);
  if (!file) throw ConfigError("cache file '" + path + "' is invalid right after writing: " + why);
  file->status = status;
  return std::move(*file);
}

TokenStream token_stream(const CacheFile& file, int64_t num_bytes) {
  TokenStream stream;
  stream.mapping_ = file.mapping;
  stream.data_ = reinterpret_cast<const int32_t*>(file.payload);
  stream.size_ = static_cast<int64_t>(file.count);
  if (file.kind == CacheKind::tokens_with_bytes) stream.text_bytes_ = stream.data_ + file.count;
  stream.num_bytes_ = num_bytes;
  stream.cache_status_ = file.status;
  stream.cache_path_ = file.path;
  return stream;
}

}  // namespace extrap
