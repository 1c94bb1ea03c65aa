// CUDA graph capture through LibTorch's at::cuda::CUDAGraph (core/runtime/cuda_graph.h). Built
// into libextrap_cuda.so, not libextrap.so, since it needs LibTorch's CUDA half; it registers
// itself with core/runtime/cuda_graph.h when that library loads.
#include "core/runtime/cuda_graph.h"
#include "core/runtime/distributed.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace extrap {

namespace {

class TorchCapturedGraph final : public CapturedGraph {
 public:
  void replay() override { graph.replay(); }
  at::cuda::CUDAGraph graph;
};

// `later` waits for the work queued on `earlier` so far.
void order_after(const c10::cuda::CUDAStream& earlier, const c10::cuda::CUDAStream& later) {
  at::cuda::CUDAEvent event;
  event.record(earlier);
  event.block(later);
}

// The reason of the first capture that CUDA invalidated (one that synchronised with the host:
// `.item()`, a pageable copy). LibTorch 2.11's CUDAGraph::capture_end throws at
// cudaStreamEndCapture for such a capture before it hands the allocators' pool back, so their
// filter keeps pointing at the destroyed graph: after one, none is captured. A capture that
// failed on a check of LibTorch's own (a copy from the host refused before it reached CUDA) is
// ended normally, releases everything, and later captures go ahead (the crash once blamed on
// failed captures was std::filesystem's, NOTES.md, issue 65).
std::mutex failure_mutex;
std::string earlier_failure;

std::unique_ptr<CapturedGraph> capture(const std::function<void()>& warmup, const std::function<void()>& work) {
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, caller.device_index());
  auto captured = std::make_unique<TorchCapturedGraph>();
  order_after(caller, side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    warmup();
    side.synchronize();
    {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!earlier_failure.empty())
        throw std::runtime_error("an earlier CUDA graph capture in this process was invalidated by CUDA (" +
                                 earlier_failure + "); none is captured after that");
    }
    captured->graph.capture_begin();
    try {
      work();
    } catch (const std::exception& error) {
      // Ends the capture, so that the stream and the allocators work as before; where CUDA
      // invalidated it, ending it throws (the same failure) and leaves LibTorch's state behind.
      bool ended = false;
      try {
        captured->graph.capture_end();
        ended = true;
      } catch (const std::exception&) {
      }
      cudaGetLastError();
      const std::string reason = failure_message(error);
      if (!ended) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (earlier_failure.empty()) earlier_failure = reason;
      }
      throw std::runtime_error(reason);
    }
    captured->graph.capture_end();
  }
  order_after(side, caller);
  return captured;
}

const bool registered_graph_capture = [] {
  register_cuda_graph_capture(&capture);
  return true;
}();

}  // namespace

}  // namespace extrap
