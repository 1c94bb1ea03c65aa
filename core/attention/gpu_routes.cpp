#include "core/attention/gpu_routes.h"

#include "core/attention/cuda_attention.h"
#include "core/base/environment.h"

namespace extrap {

GpuKernels gpu_kernels_present() {
  GpuKernels kernels;
  kernels.new_routes = gpu_new_routes_on();
  const CudaAttention* cuda = cuda_attention();
  if (!cuda) return kernels;
  kernels.extrap_fused = cuda->unsupported_reason;
  if (cuda->cudnn_unsupported_reason) kernels.cudnn = cuda->cudnn_unsupported_reason;
  return kernels;
}

namespace {

// Why cuDNN's ALiBi mask does not compute this linear bias ("" where it does): cuDNN adds
// m_h * (j - i) with the paper's slopes for H heads (computed by cuDNN) to the scaled scores of a
// causal call (the row checks the call is causal), and returns no gradient for the slopes.
std::string not_cudnn_alibi(const AttentionBias& bias, int64_t heads) {
  if (!bias.paper_slopes) return "the slopes are not the paper's (learned, or set by hand)";
  if (bias.slopes_left.requires_grad() || bias.slopes_right.requires_grad()) return "the slopes require grad";
  if (bias.positions.defined()) return "sampled positions";
  if (bias.look_left.size(0) != heads) return "the bias has " + std::to_string(bias.look_left.size(0)) + " heads";
  if (!bias.look_left.all().item<bool>()) return "a head does not look left";
  return "";
}

}  // namespace

GpuRouteChoice choose_gpu_route(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const AttentionBias& bias, const AttentionOptions& options,
                                const GpuKernels& kernels) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == k.size(2), "choose_gpu_route: needs (B, H, T, D) q and k with as many "
              "queries as keys, got ", q.sizes(), " and ", k.sizes());
  GpuRouteChoice choice;
  const auto passed = [&choice](const char* route, const std::string& why) {
    if (!choice.passed_over.empty()) choice.passed_over += "; ";
    choice.passed_over += std::string(route) + ": " + why;
  };
  const std::string not_yet = "not yet run on a GPU (EXTRAP_GPU_NEW_ROUTES=1 takes it)";
  // Row 1: no bias, no option. SDPA takes attention dropout too.
  if (bias.is_none() && kernels.new_routes) {
    choice.route = GpuRoute::Sdpa;
    return choice;
  }
  passed("sdpa", bias.is_none() ? not_yet : "it adds no bias (" + bias.describe() + ")");

  // Takes `route` where nothing in `why` stands in its way and its kernel takes the call; else
  // records why it passed.
  const auto offer = [&](GpuRoute route, std::string why, const GpuKernels::Reason& kernel, const char* absent) {
    if (why.empty()) why = kernel ? kernel(q, k, v, bias, options.causal) : absent;
    if (why.empty()) choice.route = route;
    else passed(to_string(route), why);
    return why.empty();
  };
  const std::string dropout = options.training && options.dropout > 0
                                  ? "attention dropout " + std::to_string(options.dropout) + " while training"
                                  : "";

  // Row 2: cuDNN, causal: the paper's ALiBi (its ALiBi mask), a window (its diagonal band), or
  // both. A window is the one option it takes.
  std::string why;
  if (!options.causal) why = "its ALiBi mask and band are used causally only";
  else if (!dropout.empty()) why = dropout;
  else if (bias.has_options_besides_window()) why = "of the options it takes a window only (" + bias.describe() + ")";
  else if (bias.kind == AttentionBias::Kind::Linear) why = not_cudnn_alibi(bias, q.size(1));
  else if (bias.kind != AttentionBias::Kind::None) why = "the bias is neither none nor the paper's ALiBi";
  if (why.empty() && !kernels.new_routes) why = not_yet;
  if (offer(GpuRoute::Cudnn, why, kernels.cudnn, "not built (no cuDNN frontend headers, or a CPU-only LibTorch)"))
    return choice;

  // Rows 3 and 4: extrap's kernels, the biases described by slopes or by offset; no option.
  why = bias.has_options() ? "the options (" + bias.describe() + ") are the reference's" : dropout;
  if (why.empty() && bias.kind == AttentionBias::Kind::Dense && !kernels.new_routes)
    why = "its offsets mode is " + not_yet;
  if (offer(GpuRoute::ExtrapFused, why, kernels.extrap_fused, "not loaded (libextrap_cuda.so)")) return choice;
  choice.route = GpuRoute::Reference;
  return choice;
}

}  // namespace extrap
