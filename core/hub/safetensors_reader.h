// Reading safetensors files (the format is described in core/export/safetensors.h), single or
// sharded as Hugging Face saves them: model.safetensors, or model-0000k-of-0000n.safetensors
// shards named by model.safetensors.index.json's weight_map.
//
// Each file is memory-mapped read-only: a tensor is a view of the mapping (no copy), which the
// caller converts or copies into its own storage. The header is checked whole before any
// tensor is handed out: a file shorter than its header says, offsets outside the data or
// overlapping, a shape that disagrees with its byte count, an unknown dtype, a duplicate name
// or a name in two shards are each a ConfigError naming the file and the tensor. Dtypes: F64,
// F32, F16, BF16 and the integer and boolean types; F8 types are refused by name.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace extrap {

struct MappedSafetensors;  // one mapped file

class SafetensorsReader {
 public:
  // `path`: a .safetensors file, a model.safetensors.index.json, or a folder holding either
  // (model.safetensors first, then model.safetensors.index.json).
  static SafetensorsReader open(const std::filesystem::path& path);

  // The names of every tensor, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  // A read-only view of tensor `name` in its stored dtype, on the CPU; ConfigError naming the
  // files when there is no such tensor. The view keeps its file mapped.
  torch::Tensor tensor(const std::string& name) const;
  // Drops tensor `name`'s pages from this process's memory (madvise MADV_DONTNEED on the whole
  // pages inside its bytes; a later read maps them again from the file): a loader that copied
  // it keeps the peak near one copy of the weights, not two. Views taken before stay valid.
  void release(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  torch::ScalarType dtype(const std::string& name) const;
  // The files read, in order, and the metadata of the first ("__metadata__").
  std::vector<std::filesystem::path> files() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // What the tensors are called in errors: the file, or the index file of a sharded set.
  const std::string& where() const { return where_name_; }

 private:
  struct Entry {
    size_t file = 0;
    torch::ScalarType dtype = torch::kFloat32;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the file's data
  };
  std::vector<std::shared_ptr<const MappedSafetensors>> files_;
  std::map<std::string, Entry> where_;
  std::map<std::string, std::string> metadata_;
  std::string where_name_;
};

}  // namespace extrap
