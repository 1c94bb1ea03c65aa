// CUDA graphs as the rest of extrap sees them. Capturing needs LibTorch's CUDA half, so the
// code is in libextrap_cuda.so (core/runtime/cuda_graph_capture.cpp), which registers it here
// when it loads (core/runtime/cuda_support.h); without it cuda_graph_capture() is null.
//
// A graph records the kernels of a piece of GPU work once and replays them with one launch:
// the same kernels, arguments and memory every time. So the work may read new values only
// from tensors it was captured with (copy the next batch into them before a replay), host
// values it used (a Python-style scalar, a host count) are frozen into it, and nothing of it
// may synchronise with the host (`.item()`, a copy from pageable memory): capturing such work
// fails, with CUDA's reason.
#pragma once

#include <functional>
#include <memory>

namespace extrap {

class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  // Runs the captured kernels on the current CUDA stream, after the work queued there.
  virtual void replay() = 0;
};

// Runs `warmup` eagerly on a side stream (lazily created handles, workspaces and autograd's
// streams then exist before the capture), then captures `work` on that stream: its kernels
// are recorded, not run. The current stream's queued work comes first and later work waits
// for both. Throws std::runtime_error with CUDA's or LibTorch's reason when `work` cannot be
// captured, after `warmup` has run. A capture that failed on LibTorch's own check is ended
// cleanly and later captures go ahead; after one that CUDA invalidated (a synchronisation with
// the host) a process captures nothing more: later calls run `warmup` and throw, naming it
// (LibTorch's CUDAGraph does not recover cleanly from an invalidated capture).
using CudaGraphCapture = std::unique_ptr<CapturedGraph> (*)(const std::function<void()>& warmup,
                                                            const std::function<void()>& work);

void register_cuda_graph_capture(CudaGraphCapture capture);
// Null until libextrap_cuda.so has loaded.
CudaGraphCapture cuda_graph_capture();

}  // namespace extrap
