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

// The first failed capture's reason. After a failed capture, a training step captured later in
// the same process crashed the test process on an H200 (a call through a null pointer;
// core/attention/cuda/NOTES.md, 2026-11-27): LibTorch 2.11's CUDAGraph::capture_end throws
// before it closes the random generator's capture. So after one failure none is tried.
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
        throw std::runtime_error("an earlier CUDA graph capture in this process failed (" + earlier_failure +
                                 "); none is captured after that");
    }
    captured->graph.capture_begin();
    try {
      work();
    } catch (const std::exception& error) {
      // Ends the capture (its own error, an invalidated capture, is the same failure) and
      // hands the pool back, so that the stream and the allocator work as before.
      try {
        captured->graph.capture_end();
      } catch (const std::exception&) {
      }
      cudaGetLastError();
      const std::string reason = failure_message(error);
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (earlier_failure.empty()) earlier_failure = reason;
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
