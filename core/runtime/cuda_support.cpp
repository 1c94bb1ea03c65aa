#include "core/runtime/cuda_support.h"

#include "core/base/errors.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace extrap {

namespace {

namespace fs = std::filesystem;

using State = CudaSupport::State;

bool has_nvidia_driver() {
  for (const char* path : {"/dev/nvidiactl", "/dev/dxg", "/proc/driver/nvidia/version"}) {
    std::error_code error;
    if (fs::exists(path, error)) return true;
  }
  return false;
}

// CUDA_VISIBLE_DEVICES set to nothing, or to a list that starts with a negative index, shows
// the process no device at all.
bool devices_hidden() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) return false;
  const std::string list(visible);
  return list.find_first_not_of(" \t") == std::string::npos || list.rfind("-", 0) == 0;
}

// libextrap_cuda.so is built beside libextrap.so.
fs::path cuda_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_cuda_support), &info) == 0 || !info.dli_fname)
    return "libextrap_cuda.so";
  return fs::path(info.dli_fname).parent_path() / "libextrap_cuda.so";
}

CudaSupport open_library() {
  const fs::path path = cuda_library_path();
  std::error_code error;
  if (!fs::exists(path, error))
    return {State::not_built, "this build has no CUDA half (" + path.string() +
                                  " is not there: nvcc or a CUDA LibTorch was missing when it was built)"};
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* why = dlerror();
    return {State::failed, "cannot load " + path.string() + ": " + (why ? why : "unknown error")};
  }
  if (!at::detail::getCUDAHooks().isBuilt())
    return {State::failed, "LibTorch had decided that this process has no CUDA before " +
                               path.filename().string() +
                               " loaded: extrap::load_cuda_support() must come first in main()"};
  return {State::loaded, path.string()};
}

CudaSupport decide() {
  const char* variable = std::getenv("EXTRAP_LOAD_CUDA");
  const std::string mode = variable && *variable ? variable : "auto";  // set but empty: unset
  if (mode != "auto" && mode != "0" && mode != "1")
    throw ConfigError("environment variable EXTRAP_LOAD_CUDA=" + mode +
                      ": expected auto (load where there is an NVIDIA driver), 0 or 1");
  if (mode == "0") return {State::switched_off, "EXTRAP_LOAD_CUDA=0"};
  if (mode == "auto") {
    if (!has_nvidia_driver())
      return {State::no_driver,
              "no NVIDIA driver on this machine (EXTRAP_LOAD_CUDA=1 loads it anyway)"};
    if (devices_hidden())
      return {State::hidden, std::string("CUDA_VISIBLE_DEVICES='") +
                                 std::getenv("CUDA_VISIBLE_DEVICES") + "' hides every device"};
  }
  CudaSupport support = open_library();
  if (mode == "1" && support.state != State::loaded)
    throw ConfigError("EXTRAP_LOAD_CUDA=1, but " + support.detail);
  return support;
}

}  // namespace

const CudaSupport& load_cuda_support() {
  static const CudaSupport support = decide();
  return support;
}

std::string cuda_unavailable_reason() {
  const CudaSupport& support = load_cuda_support();
  if (support.state != State::loaded) return "extrap's CUDA half is not loaded: " + support.detail;
  if (torch::cuda::device_count() == 0) return "no CUDA device is visible";
  return "";
}

void require_cuda(const std::string& what) {
  const std::string why_not = cuda_unavailable_reason();
  if (!why_not.empty()) throw ConfigError(what + " but " + why_not);
}

std::string describe_cuda_support() {
  const CudaSupport& support = load_cuda_support();
  if (support.state != State::loaded) return "not loaded: " + support.detail;
  return "loaded (" + support.detail + ")";
}

}  // namespace extrap
