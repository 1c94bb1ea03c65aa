#include "core/export/safetensors.h"

#include "core/base/errors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "extrap writes safetensors data as the host stores it, which must be little-endian"
#endif

namespace extrap {

std::string safetensors_dtype(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat64: return "F64";
    case torch::kFloat32: return "F32";
    case torch::kFloat16: return "F16";
    case torch::kBFloat16: return "BF16";
    case torch::kInt64: return "I64";
    case torch::kInt32: return "I32";
    case torch::kInt16: return "I16";
    case torch::kInt8: return "I8";
    case torch::kUInt8: return "U8";
    case torch::kBool: return "BOOL";
    default:
      throw ConfigError(std::string("safetensors has no dtype for ") + c10::toString(type));
  }
}

std::string encode_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> sorted;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") throw ConfigError("a tensor cannot be called __metadata__");
    sorted.emplace_back(name, tensor.detach().to(torch::kCPU).contiguous());
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].first == sorted[i - 1].first)
      throw ConfigError("two tensors are called '" + sorted[i].first + "'");

  nlohmann::json header = nlohmann::json::object();  // keys sorted (std::map)
  uint64_t offset = 0;
  for (const auto& [name, tensor] : sorted) {
    const uint64_t bytes = uint64_t(tensor.numel()) * tensor.element_size();
    header[name] = {{"dtype", safetensors_dtype(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  // Invalid UTF-8 in a string would make the header unreadable: dump() throws, and the caller
  // names what it was writing.
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

  std::string file;
  file.reserve(8 + text.size() + offset);
  const uint64_t header_size = text.size();
  file.append(reinterpret_cast<const char*>(&header_size), 8);  // little-endian (checked above)
  file += text;
  for (const auto& [name, tensor] : sorted)
    if (tensor.numel() > 0)
      file.append(static_cast<const char*>(tensor.data_ptr()), size_t(tensor.numel()) * tensor.element_size());
  return file;
}

}  // namespace extrap
