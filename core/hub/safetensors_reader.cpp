#include "core/hub/safetensors_reader.h"

#include "core/base/errors.h"
#include "core/base/files.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace extrap {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct MappedSafetensors {
  fs::path path;
  const uint8_t* base = nullptr;
  size_t size = 0;
  size_t data_begin = 0;  // 8 + header bytes
  ~MappedSafetensors() {
    if (base && size) munmap(const_cast<uint8_t*>(base), size);
  }
};

namespace {

std::shared_ptr<MappedSafetensors> map_safetensors(const fs::path& path) {
  auto mapped = std::make_shared<MappedSafetensors>();
  mapped->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(path.string() + ": cannot be opened (" + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(path.string() + ": not a regular file");
  }
  mapped->size = size_t(st.st_size);
  if (mapped->size < 8) {
    ::close(fd);
    throw ConfigError(path.string() + ": " + std::to_string(mapped->size) +
                      " bytes, too short for a safetensors file (truncated?)");
  }
  void* p = mmap(nullptr, mapped->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw ConfigError(path.string() + ": cannot be mapped (" + std::strerror(errno) + ")");
  mapped->base = static_cast<const uint8_t*>(p);
  return mapped;
}

torch::ScalarType dtype_of(const std::string& name, const std::string& where) {
  static const std::map<std::string, torch::ScalarType> types = {
      {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
      {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
      {"U8", torch::kUInt8},    {"BOOL", torch::kBool}};
  const auto it = types.find(name);
  if (it == types.end())
    throw ConfigError(where + ": dtype \"" + name +
                      "\" is not read (F64, F32, F16, BF16 and integer types are; convert the checkpoint first)");
  return it->second;
}

}  // namespace

SafetensorsReader SafetensorsReader::open(const fs::path& given) {
  fs::path path = given;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors"))
      path = path / "model.safetensors";
    else if (fs::exists(path / "model.safetensors.index.json"))
      path = path / "model.safetensors.index.json";
    else
      throw ConfigError(given.string() + ": holds neither model.safetensors nor model.safetensors.index.json "
                        "(PyTorch .bin checkpoints are not read: save the model with safetensors)");
  }
  SafetensorsReader reader;
  reader.where_name_ = path.string();
  std::vector<fs::path> shards;
  std::map<std::string, std::string> expected_shard;  // tensor -> shard file name (index)
  if (path.extension() == ".json") {
    json index;
    try {
      index = json::parse(read_file(path));
      for (const auto& [name, file] : index.at("weight_map").items()) expected_shard[name] = file.get<std::string>();
    } catch (const json::exception& e) {
      throw ConfigError(path.string() + ": not a safetensors index (" + std::string(e.what()) + ")");
    }
    std::set<std::string> files;
    for (const auto& [name, file] : expected_shard) {
      if (fs::path(file).has_parent_path() || file.empty())
        throw ConfigError(path.string() + ": weight_map names \"" + file + "\" for " + name +
                          ", not a file beside the index");
      files.insert(file);
    }
    for (const auto& file : files) {
      if (!fs::exists(path.parent_path() / file))
        throw ConfigError((path.parent_path() / file).string() + ": missing (a shard named by " + path.string() + ")");
      shards.push_back(path.parent_path() / file);
    }
    if (shards.empty()) throw ConfigError(path.string() + ": weight_map is empty");
  } else {
    shards.push_back(path);
  }
  for (const auto& shard : shards) {
    auto mapped = map_safetensors(shard);
    const std::string where = shard.string();
    uint64_t header_size = 0;
    std::memcpy(&header_size, mapped->base, 8);
    if (header_size > mapped->size - 8)
      throw ConfigError(where + ": the header says " + std::to_string(header_size) + " bytes, the file has " +
                        std::to_string(mapped->size - 8) + " after its length: truncated or not safetensors");
    mapped->data_begin = 8 + header_size;
    const uint64_t data_size = mapped->size - mapped->data_begin;
    json header;
    try {
      header = json::parse(reinterpret_cast<const char*>(mapped->base) + 8,
                           reinterpret_cast<const char*>(mapped->base) + 8 + header_size);
    } catch (const json::exception& e) {
      throw ConfigError(where + ": the header is not JSON (" + std::string(e.what()) + "): not safetensors, or damaged");
    }
    if (!header.is_object()) throw ConfigError(where + ": the header is not a JSON object");
    const size_t file_index = reader.files_.size();
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (file_index == 0 && entry.is_object())
          for (const auto& [key, value] : entry.items())
            if (value.is_string()) reader.metadata_[key] = value.get<std::string>();
        continue;
      }
      const std::string what = where + ": tensor " + name;
      Entry e;
      e.file = file_index;
      try {
        e.dtype = dtype_of(entry.at("dtype").get<std::string>(), what);
        e.shape = entry.at("shape").get<std::vector<int64_t>>();
        const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
        if (offsets.size() != 2) throw ConfigError(what + ": data_offsets must be [begin, end]");
        e.begin = offsets[0];
        e.end = offsets[1];
      } catch (const json::exception& ex) {
        throw ConfigError(what + ": a malformed entry (" + std::string(ex.what()) + ")");
      }
      uint64_t count = 1;
      for (int64_t d : e.shape) {
        if (d < 0) throw ConfigError(what + ": a negative dimension");
        count *= uint64_t(d);
      }
      if (e.end < e.begin || e.end > data_size)
        throw ConfigError(what + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                          "] lie outside the file's " + std::to_string(data_size) +
                          " bytes of data: the file is truncated or damaged");
      if (e.end - e.begin != count * c10::elementSize(e.dtype))
        throw ConfigError(what + ": " + std::to_string(e.end - e.begin) + " bytes for " + std::to_string(count) +
                          " elements of " + c10::toString(e.dtype) + ": the header is inconsistent");
      if (reader.where_.count(name))
        throw ConfigError(what + ": also in " + reader.files_[reader.where_.at(name).file]->path.string());
      if (!expected_shard.empty()) {
        const auto it = expected_shard.find(name);
        if (it == expected_shard.end() || it->second != shard.filename().string())
          throw ConfigError(what + ": the index " + path.string() + " places it " +
                            (it == expected_shard.end() ? std::string("nowhere") : "in " + it->second));
      }
      if (e.end > e.begin) spans.emplace_back(e.begin, e.end);
      reader.where_[name] = e;
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second)
        throw ConfigError(where + ": two tensors' data_offsets overlap at byte " + std::to_string(spans[i].first) +
                          ": the header is damaged");
    reader.files_.push_back(std::move(mapped));
  }
  for (const auto& [name, file] : expected_shard)
    if (!reader.where_.count(name))
      throw ConfigError(path.string() + ": names " + name + " in " + file + ", which does not hold it");
  return reader;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : where_) out.push_back(name);
  return out;
}

torch::Tensor SafetensorsReader::tensor(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw ConfigError(where_name_ + ": has no tensor " + name);
  const Entry& e = it->second;
  const auto& file = files_[e.file];
  const uint8_t* data = file->base + file->data_begin + e.begin;
  auto keep = file;  // the view keeps the mapping alive
  auto view = torch::from_blob(const_cast<uint8_t*>(data), e.shape, [keep](void*) {},
                               torch::TensorOptions().dtype(e.dtype));
  // Tensors lie back to back: one may start at an address its element size does not divide,
  // which vectorised kernels must not be handed.
  if (reinterpret_cast<uintptr_t>(data) % c10::elementSize(e.dtype) != 0) return view.clone();
  return view;
}

void SafetensorsReader::release(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) return;
  const Entry& e = it->second;
  const auto& file = files_[e.file];
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(file->base + file->data_begin + e.begin);
  const uintptr_t end = uintptr_t(file->base + file->data_begin + e.end);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

std::vector<int64_t> SafetensorsReader::shape(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw ConfigError(where_name_ + ": has no tensor " + name);
  return it->second.shape;
}

torch::ScalarType SafetensorsReader::dtype(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw ConfigError(where_name_ + ": has no tensor " + name);
  return it->second.dtype;
}

std::vector<fs::path> SafetensorsReader::files() const {
  std::vector<fs::path> out;
  for (const auto& f : files_) out.push_back(f->path);
  return out;
}

}  // namespace extrap
