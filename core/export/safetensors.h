// The safetensors format (Hugging Face), in which `extrap export` hands a model to Python:
//
//   [N: u64, little-endian][N bytes: UTF-8 JSON header, space-padded to a multiple of 8][data]
//
// The header maps each tensor's name to {"dtype": "F32", "shape": [...], "data_offsets":
// [begin, end]} (byte offsets into the data, which follows the header) and "__metadata__" to a
// map of strings. Data is row-major and little-endian; extrap writes the tensors in name order,
// back to back, so the offsets cover the data exactly with no gaps.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace extrap {

// "F32", "BF16", "I64", "BOOL", ... ConfigError for a type safetensors has no name for.
std::string safetensors_dtype(torch::ScalarType type);

// The whole file as bytes. Tensors may live on any device and be non-contiguous; names must be
// unique (ConfigError naming the duplicate) and not "__metadata__".
std::string encode_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata);

}  // namespace extrap
