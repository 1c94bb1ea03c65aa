// extrap's CUDA half is a library of its own, libextrap_cuda.so beside libextrap.so: the fused
// CUDA attention (core/attention/cuda) and the NCCL backend (core/runtime/nccl_backend.cpp). It
// links LibTorch's CUDA half (libtorch_cuda with cuBLAS, cuDNN and NCCL: ~500 MB mapped, over a
// second to load), which libextrap.so does not: a process that never loads it starts in a
// fraction of that time and memory.
//
// LibTorch decides once per process whether it has CUDA, the first time anything asks (seeding
// the generators asks), and keeps the answer. So the CUDA half is loaded, or not, before any
// other work: every executable calls load_cuda_support() first thing in main(). Whether it
// loads (EXTRAP_LOAD_CUDA):
//   unset, empty or "auto": where this machine has an NVIDIA driver (/dev/nvidiactl, /dev/dxg under
//       WSL or /proc/driver/nvidia) and CUDA_VISIBLE_DEVICES does not hide every device;
//   "1": always (an error, with the loader's reason, if it cannot);
//   "0": never (CPU only, on a machine with GPUs too).
#pragma once

#include <string>

namespace extrap {

struct CudaSupport {
  enum class State { loaded, no_driver, hidden, switched_off, not_built, failed };
  State state = State::not_built;
  std::string detail;  // why it is not loaded, in words; the library's path when it is
};

// Idempotent and thread-safe; the first call decides. Throws ConfigError for a bad
// EXTRAP_LOAD_CUDA, and for "1" when the library cannot be loaded.
const CudaSupport& load_cuda_support();

// "" when CUDA devices can be used, else why not, to follow "train.device is cuda but ...".
std::string cuda_unavailable_reason();
// Throws ConfigError "`what` but <why not>" unless CUDA devices can be used, e.g. for
// what = "run.yaml: train.device is cuda".
void require_cuda(const std::string& what);

// The whole state in one line, for `extrap --version` (e.g. "not loaded: no NVIDIA driver on
// this machine (EXTRAP_LOAD_CUDA=1 loads it anyway)").
std::string describe_cuda_support();

}  // namespace extrap
