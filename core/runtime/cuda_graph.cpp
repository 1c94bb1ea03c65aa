#include "core/runtime/cuda_graph.h"

#include <atomic>

namespace extrap {

namespace {

std::atomic<CudaGraphCapture> registered_capture{nullptr};

}  // namespace

void register_cuda_graph_capture(CudaGraphCapture capture) { registered_capture.store(capture, std::memory_order_release); }

CudaGraphCapture cuda_graph_capture() { return registered_capture.load(std::memory_order_acquire); }

}  // namespace extrap
