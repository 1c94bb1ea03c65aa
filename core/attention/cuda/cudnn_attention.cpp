// cuDNN's fused attention with its ALiBi mask and diagonal band (core/attention/cuda/cudnn_attention.h):
// the frontend's SDPA graphs, forward and backward, cached per shape and layout, as a LibTorch
// autograd function. Compiled with hidden visibility (core/attention/cuda/CMakeLists.txt) so the
// frontend's inline functions bind to this copy, never to another in a LibTorch library.
#include "core/attention/cuda/cudnn_attention.h"

#include "core/attention/cuda/vector_layout.h"
#include "core/kernels/qkv_heads.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace extrap {
namespace {

namespace fe = cudnn_frontend;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// A built graph, or why it did not build (kept, so a shape cuDNN refuses is asked once).
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string error;
};

// The masks, shape, dtype, device, q, k, v strides, and for the backward whether q, k and v are
// slices of one projection (packed_heads: dQ, dK and dV are then written as such slices): what a
// graph is built for. O and dO are always heads-major (empty_heads_major), the row statistics
// contiguous, and dQ, dK, dV heads-major where they are not packed.
using Key = std::vector<int64_t>;

// What a call adds to causal attention.
struct Masks {
  bool alibi = false;
  int64_t window = 0;  // 0: none
};

std::mutex cache_mutex;
std::map<Key, Built>& cache() {
  static auto* built = new std::map<Key, Built>();  // never destroyed: graphs outlive static teardown
  return *built;
}

Key key_of(bool backward, Masks masks, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  Key key{backward, masks.alibi, masks.window, q.device().index(), int64_t(q.scalar_type()),
          backward && packed_heads(q, k, v)};
  for (const auto size : q.sizes()) key.push_back(size);
  for (const auto* t : {&q, &k, &v})
    for (const auto stride : t->strides()) key.push_back(stride);
  return key;
}

std::vector<int64_t> stats_dims(const torch::Tensor& q) { return {q.size(0), q.size(1), q.size(2), 1}; }
std::vector<int64_t> stats_strides(const torch::Tensor& q) { return {q.size(1) * q.size(2), q.size(2), 1, 1}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

cudnnHandle_t handle_on_current_stream() {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  const cudnnStatus_t status = cudnnSetStream(handle, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN attention: cudnnSetStream failed: ", cudnnGetErrorString(status));
  return handle;
}

// Builds the forward (O and the row log-sum-exp) or backward (dQ, dK, dV) graph for this layout.
Built build(bool backward, Masks masks, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  Built built;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(q.scalar_type() == torch::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> dims(q.sizes().begin(), q.sizes().end());
  const auto Q = input(*g, "Q", kQ, dims, q.strides().vec());
  const auto K = input(*g, "K", kK, dims, k.strides().vec());
  const auto V = input(*g, "V", kV, dims, v.strides().vec());
  const float scale = float(1.0 / std::sqrt(double(q.size(3))));
  if (!backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("extrap_attention")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_causal_mask(true)
                       .set_alibi_mask(masks.alibi);
    if (masks.window > 0) options.set_diagonal_band_left_bound(int(masks.window));
    auto [O, stats] = g->sdpa(Q, K, V, options);
    O->set_output(true).set_uid(kO).set_dim(dims).set_stride(heads_major_strides(q.sizes()));
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims(q))
        .set_stride(stats_strides(q));
  } else {
    const auto O = input(*g, "O", kO, dims, heads_major_strides(q.sizes()));
    const auto dO = input(*g, "dO", kDO, dims, heads_major_strides(q.sizes()));
    const auto stats = g->tensor(fe::graph::Tensor_attributes()
                                     .set_name("stats")
                                     .set_uid(kStats)
                                     .set_dim(stats_dims(q))
                                     .set_stride(stats_strides(q))
                                     .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("extrap_attention_backward")
                       .set_attn_scale(scale)
                       .set_causal_mask(true)
                       .set_alibi_mask(masks.alibi);
    if (masks.window > 0) options.set_diagonal_band_left_bound(int(masks.window));
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, options);
    // The layouts empty_head_gradients gives them.
    const auto strides = packed_heads(q, k, v) ? packed_head_strides(q.sizes()) : heads_major_strides(q.sizes());
    dQ->set_output(true).set_uid(kDQ).set_dim(dims).set_stride(strides);
    dK->set_output(true).set_uid(kDK).set_dim(dims).set_stride(strides);
    dV->set_output(true).set_uid(kDV).set_dim(dims).set_stride(strides);
  }
  const cudnnHandle_t handle = handle_on_current_stream();
  for (const auto& [step, status] :
       std::initializer_list<std::pair<const char*, std::function<fe::error_t()>>>{
           {"validate", [&] { return g->validate(); }},
           {"build_operation_graph", [&] { return g->build_operation_graph(handle); }},
           {"create_execution_plans", [&] { return g->create_execution_plans({fe::HeurMode_t::A}); }},
           {"check_support", [&] { return g->check_support(handle); }},
           {"build_plans", [&] { return g->build_plans(handle); }}}) {
    auto result = status();
    if (!result.is_good()) {
      built.error = std::string("cuDNN ") + (backward ? "backward" : "forward") + " graph, " + step + ": " +
                    first_line(result.get_message());
      return built;
    }
  }
  auto sized = g->get_workspace_size(built.workspace);
  if (!sized.is_good()) {
    built.error = "cuDNN workspace size: " + first_line(sized.get_message());
    return built;
  }
  built.graph = std::move(g);
  return built;
}

bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream().stream(), &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

// The cached graph for this layout, built now if it is new (outside a CUDA graph capture).
// Call with cache_mutex held.
const Built& graph_for(bool backward, Masks masks, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v) {
  const Key key = key_of(backward, masks, q, k, v);
  auto found = cache().find(key);
  if (found != cache().end()) return found->second;
  if (capturing()) {
    static const Built refused{nullptr, 0,
                               "no cuDNN graph was built for this shape before the CUDA graph capture"};
    return refused;
  }
  return cache().emplace(key, build(backward, masks, q, k, v)).first->second;
}

std::string cudnn_input_problem(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  if (!q.defined() || !k.defined() || !v.defined()) return "q, k and v must be defined";
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.sizes() != q.sizes())
    return "q, k and v must all be (B, H, T, D) of one shape, got q " + c10::str(q.sizes()) + ", k " +
           c10::str(k.sizes()) + ", v " + c10::str(v.sizes());
  if (!q.is_cuda() || k.device() != q.device() || v.device() != q.device())
    return "q, k and v must be on one CUDA device";
  const auto type = q.scalar_type();
  if ((type != torch::kBFloat16 && type != torch::kHalf) || k.scalar_type() != type || v.scalar_type() != type)
    return "q, k and v must all be bfloat16 or float16, got " + c10::str(q.scalar_type());
  if (q.size(3) % 8 != 0 || q.size(3) > 128) return "head dimension must be a multiple of 8 up to 128, got " +
                                                     std::to_string(q.size(3));
  if (q.size(2) < 1) return "no tokens";
  return "";
}

// x (shaped like `like`) in like's heads-major layout, as the graphs read dO: x itself where its
// elements already sit so (a dimension of size 1 may have any stride), else a copy.
torch::Tensor in_layout_of(const torch::Tensor& like, const torch::Tensor& x) {
  bool same = reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 16 == 0;
  for (int64_t d = 0; d < 4 && same; ++d) same = x.size(d) == 1 || x.stride(d) == like.stride(d);
  if (same) return x.as_strided(like.sizes(), like.strides());
  auto copy = empty_heads_major(like);
  copy.copy_(x);
  return copy;
}

void execute(const Built& built, std::unordered_map<int64_t, void*>& pack, const torch::Tensor& like) {
  const auto workspace = torch::empty({std::max<int64_t>(built.workspace, 1)}, like.options().dtype(torch::kUInt8));
  auto status = built.graph->execute(handle_on_current_stream(), pack, workspace.data_ptr());
  TORCH_CHECK(status.is_good(), "cuDNN attention: execute failed: ", first_line(status.get_message()));
}

struct CudnnAttentionFunction : public torch::autograd::Function<CudnnAttentionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, bool alibi, int64_t window) {
    const Masks masks{alibi, window};
    const c10::cuda::CUDAGuard guard(q_in.device());
    const auto q = in_vector_layout(q_in), k = in_vector_layout(k_in), v = in_vector_layout(v_in);
    auto o = empty_heads_major(q);  // the model merges the heads from it without a copy
    auto stats = torch::empty({q.size(0), q.size(1), q.size(2), 1}, q.options().dtype(torch::kFloat32));
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      const Built& built = graph_for(false, masks, q, k, v);
      TORCH_CHECK(built.graph, "cuDNN attention: ", built.error);
      std::unordered_map<int64_t, void*> pack{{kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()},
                                              {kO, o.data_ptr()}, {kStats, stats.data_ptr()}};
      execute(built, pack, q);
    }
    ctx->save_for_backward({q, k, v, o, stats});
    ctx->saved_data["alibi"] = alibi;
    ctx->saved_data["window"] = window;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &stats = saved[4];
    const c10::cuda::CUDAGuard guard(q.device());
    const auto dout = in_layout_of(o, grads[0].to(q.scalar_type()));
    auto [dq, dk, dv] = empty_head_gradients(q, k, v);
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      const Masks masks{ctx->saved_data["alibi"].toBool(), ctx->saved_data["window"].toInt()};
      const Built& built = graph_for(true, masks, q, k, v);
      TORCH_CHECK(built.graph, "cuDNN attention: ", built.error);
      std::unordered_map<int64_t, void*> pack{{kQ, q.data_ptr()},       {kK, k.data_ptr()},   {kV, v.data_ptr()},
                                              {kO, o.data_ptr()},       {kDO, dout.data_ptr()},
                                              {kStats, stats.data_ptr()}, {kDQ, dq.data_ptr()}, {kDK, dk.data_ptr()},
                                              {kDV, dv.data_ptr()}};
      execute(built, pack, q);
    }
    return {dq, dk, dv, {}, {}};  // q, k, v, alibi, window
  }
};

}  // namespace

std::string cudnn_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const AttentionBias& bias, bool causal) {
  if (!causal) return "cuDNN's ALiBi mask and band are used causally only";
  if (bias.kind != AttentionBias::Kind::None && bias.kind != AttentionBias::Kind::Linear)
    return "the bias is neither none nor ALiBi";
  if (bias.has_options_besides_window()) return "of the options it takes a window only, got " + bias.describe();
  if (auto problem = cudnn_input_problem(q, k, v); !problem.empty()) return problem;
  const Masks masks{bias.kind == AttentionBias::Kind::Linear, bias.window};
  const c10::cuda::CUDAGuard guard(q.device());
  const auto ql = in_vector_layout(q), kl = in_vector_layout(k), vl = in_vector_layout(v);
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (const Built& forward = graph_for(false, masks, ql, kl, vl); !forward.graph) return forward.error;
  // The backward graph too where this call will be differentiated: built here, before any capture.
  if (torch::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    if (const Built& backward = graph_for(true, masks, ql, kl, vl); !backward.graph) return backward.error;
  return "";
}

torch::Tensor cudnn_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool alibi,
                              int64_t window) {
  const auto problem = cudnn_input_problem(q, k, v);
  TORCH_CHECK(problem.empty(), "cuDNN attention: ", problem);
  TORCH_CHECK(window >= 0, "cuDNN attention: window ", window, " (0: none)");
  return CudnnAttentionFunction::apply(q, k, v, alibi, window);
}

std::vector<float> cudnn_alibi_slopes(int64_t heads) { return fe::detail::get_alibi_slope(heads); }

std::string cudnn_description() {
  const size_t version = cudnnGetVersion();
  return "cuDNN " + std::to_string(version / 10000) + "." + std::to_string(version % 10000 / 100) + "." +
         std::to_string(version % 100) + ", frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

}  // namespace extrap
