// Every GPU route of core/attention/gpu_routes.h against the float64 reference, through the
// attention dispatcher as the models call it: the route the table picks is the one expected,
// and its outputs and q, k, v gradients are within twice LibTorch's own low-precision error
// (tests/support/low_precision_check.h), for bfloat16 and float16, head dimensions 64
// and 128, odd lengths, and q, k, v as separate tensors or as the model's views of one projection. Without a CUDA device the GPU tests skip; the check of cuDNN's
// slopes runs wherever libextrap_cuda.so was built with the cuDNN frontend.
#include "core/attention/attention.h"
#include "core/attention/cuda_attention.h"
#include "core/attention/gpu_routes.h"
#include "core/kernels/precision.h"
#include "core/kernels/qkv_heads.h"
#include "positions/alibi_slopes.h"
#include "tests/support/low_precision_check.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

using namespace extrap;
using extrap::testing::check_close;
using extrap::testing::have_cuda;

namespace {

bool have_cudnn_attention() {
  if (cuda_attention() && cuda_attention()->cudnn) return true;
  extrap::testing::skip_test("libextrap_cuda.so was built without the cuDNN frontend (scripts/cudnn_frontend.sh)");
  return false;
}

// The paper's slope for head h of n, from its definition: 2^(-8 (h + 1) / p) for the p = 2^floor(log2 n)
// first heads, then every other slope of the 2p-head set.
double paper_slope(int n, int h) {
  const int p = 1 << int(std::floor(std::log2(double(n))));
  if (h < p) return std::pow(2.0, -8.0 * (h + 1) / p);
  return std::pow(2.0, -8.0 * (2 * (h - p) + 1) / (2 * p));
}

struct Grads {
  torch::Tensor out, dq, dk, dv, dtable;
};

// A bias and, where it is learned, its leaf (whose gradient run() returns as dtable).
struct Learned {
  AttentionBias bias;
  torch::Tensor leaf;
};
using BiasMaker = std::function<Learned(torch::ScalarType)>;  // the leaf's dtype

// packed: q, k and v as the model makes them, split_heads() views of one (B, T, 3 H D) projection,
// and dout in the layout the model's merge of the heads hands back (heads-major); else each its own
// contiguous leaf.
Grads run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& dout,
          const BiasMaker& make_bias, AttentionOptions options, torch::ScalarType type, bool packed = false) {
  const Learned learned = make_bias(type == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
  if (packed) {
    const auto B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
    const auto heads_last = [](const torch::Tensor& t) { return t.detach().permute({0, 2, 1, 3}); };  // (B, T, H, D)
    auto x = torch::stack({heads_last(q), heads_last(k), heads_last(v)}, 2).reshape({B, T, 3 * H * D}).to(type);
    x.requires_grad_(true);
    const auto [q2, k2, v2] = split_heads(x, H);
    auto out = attention(q2, k2, v2, learned.bias, options);
    out.backward(heads_last(dout).contiguous().permute({0, 2, 1, 3}).to(out.scalar_type()));
    const auto grad = x.grad().view({B, T, 3, H, D});
    const auto part = [&](int64_t i) { return grad.select(2, i).permute({0, 2, 1, 3}); };
    return {out.detach(), part(0), part(1), part(2), learned.leaf.defined() ? learned.leaf.grad() : torch::Tensor()};
  }
  auto q2 = q.detach().to(type).requires_grad_(true), k2 = k.detach().to(type).requires_grad_(true),
       v2 = v.detach().to(type).requires_grad_(true);
  auto out = attention(q2, k2, v2, learned.bias, options);
  out.backward(dout.to(out.scalar_type()));
  return {out.detach(), q2.grad(), k2.grad(), v2.grad(), learned.leaf.defined() ? learned.leaf.grad() : torch::Tensor()};
}

// EXTRAP_GPU_NEW_ROUTES set for a scope, restored after.
struct NewRoutes {
  std::string kept;
  bool had = false;
  explicit NewRoutes(const char* value) {
    if (const char* old = std::getenv("EXTRAP_GPU_NEW_ROUTES")) had = true, kept = old;
    ::setenv("EXTRAP_GPU_NEW_ROUTES", value, 1);
  }
  ~NewRoutes() {
    if (had) ::setenv("EXTRAP_GPU_NEW_ROUTES", kept.c_str(), 1);
    else ::unsetenv("EXTRAP_GPU_NEW_ROUTES");
  }
};

AttentionBias paper_alibi(int64_t heads, torch::Device device) {
  auto b = AttentionBias::linear_causal(torch::tensor(alibi_slopes(int(heads)), torch::kFloat64)
                                            .to(torch::kFloat32)
                                            .to(device));
  b.paper_slopes = true;
  return b;
}

}  // namespace

TEST_CASE("cuDNN's ALiBi slopes are the paper's for 1..64 heads", "[cuda][gpu-routes]") {
  if (!have_cudnn_attention()) return;
  for (int heads = 1; heads <= 64; ++heads) {
    const auto cudnn = cuda_attention()->cudnn_alibi_slopes(heads);
    REQUIRE(cudnn.size() == size_t(heads));
    for (int h = 0; h < heads; ++h) {
      INFO("heads " << heads << ", head " << h);
      const double expected = paper_slope(heads, h);
      CHECK(std::abs(double(cudnn[size_t(h)]) - expected) <= expected * 1.2e-7);  // one float rounding
    }
  }
}

TEST_CASE("every GPU route matches the float64 reference: outputs and gradients", "[cuda][gpu-routes]") {
  if (!have_cuda()) return;
  torch::manual_seed(20261128);
  const int64_t batch = 2, heads = 6;  // 6: not a power of two
  const auto device = torch::Device(torch::kCUDA);
  struct Row {
    std::string name;
    BiasMaker bias;
    bool causal;
    GpuRoute expected;
  };
  const auto fixed = [](AttentionBias bias) { return [bias](torch::ScalarType) { return Learned{bias, {}}; }; };
  const auto learned = torch::tensor(alibi_slopes(int(heads)), torch::kFloat64).to(torch::kFloat32).cuda() * 1.5;
  // A learned table of offsets j - i (T5's shape of bias, KERPLE's and Sandwich's kind): a leaf
  // over every offset of the longest length, read through by_offset as those methods do.
  const int64_t longest = 1000;
  const auto table_values = torch::randn({heads, 2 * longest - 1}, torch::kFloat64);
  const BiasMaker offsets = [table_values, longest](torch::ScalarType type) {
    auto leaf = table_values.to(type).cuda().requires_grad_(true);
    return Learned{AttentionBias::dense_by_offset([leaf, longest](int64_t lo, int64_t hi) {
                     return leaf.narrow(1, lo + longest - 1, hi - lo);
                   }),
                   leaf};
  };
  // With the new routes (EXTRAP_GPU_NEW_ROUTES=1) and without (where calls went before them).
  for (const bool new_routes : {true, false}) {
    const NewRoutes setting(new_routes ? "1" : "0");
    const bool cudnn = new_routes && cuda_attention() && cuda_attention()->cudnn;
    const auto windowed = [](AttentionBias bias) {
      bias.window = 64;
      return bias;
    };
    std::vector<Row> rows{
        {"none, causal", fixed(AttentionBias::none()), true, new_routes ? GpuRoute::Sdpa : GpuRoute::ExtrapFused},
        {"none, bidirectional", fixed(AttentionBias::none()), false,
         new_routes ? GpuRoute::Sdpa : GpuRoute::ExtrapFused},
        {"the paper's ALiBi", fixed(paper_alibi(heads, device)), true,
         cudnn ? GpuRoute::Cudnn : GpuRoute::ExtrapFused},
        {"window 64, no bias", fixed(windowed(AttentionBias::none())), true,
         cudnn ? GpuRoute::Cudnn : GpuRoute::Reference},
        {"window 64, the paper's ALiBi", fixed(windowed(paper_alibi(heads, device))), true,
         cudnn ? GpuRoute::Cudnn : GpuRoute::Reference},
        {"ALiBi, other slopes", fixed(AttentionBias::linear_causal(learned)), true, GpuRoute::ExtrapFused},
        {"symmetric ALiBi", fixed(AttentionBias::linear_symmetric(learned)), false, GpuRoute::ExtrapFused},
        {"learned offsets, causal", offsets, true, new_routes ? GpuRoute::ExtrapFused : GpuRoute::Reference},
        {"learned offsets, bidirectional", offsets, false,
         new_routes ? GpuRoute::ExtrapFused : GpuRoute::Reference}};
    for (const auto type : {torch::kBFloat16, torch::kHalf}) {
      for (const int64_t head_dim : {64, 128}) {
        // Lengths, and at two of them the model's layout too (packed: split_heads views, out and
        // the gradients in the layouts that go back to the projections uncopied).
        const std::vector<std::pair<int64_t, bool>> shapes{{1, false},   {17, false},  {17, true}, {100, false},
                                                           {257, false}, {257, true}, {1000, false}};
        for (const auto& [length, packed] : shapes) {
          for (const Row& row : rows) {
            std::ostringstream where;
            where << (new_routes ? "new routes, " : "proven routes, ") << row.name << ", "
                  << (type == torch::kBFloat16 ? "bf16" : "fp16") << ", D " << head_dim << ", T " << length
                  << (packed ? ", q, k, v split from one projection" : "");
            INFO(where.str());
            const auto options = torch::TensorOptions().device(device).dtype(type);
            const auto q = torch::randn({batch, heads, length, head_dim}, options),
                       k = torch::randn({batch, heads, length, head_dim}, options),
                       v = torch::randn({batch, heads, length, head_dim}, options),
                       dout = torch::randn({batch, heads, length, head_dim}, options);
            AttentionOptions attention_options;
            attention_options.causal = row.causal;
            attention_options.training = true;
            const auto choice = choose_gpu_route(q, k, v, row.bias(torch::kFloat32).bias, attention_options,
                                                 gpu_kernels_present());
            INFO("route " << to_string(choice.route) << " (passed over: " << choice.passed_over << ")");
            CHECK(choice.route == row.expected);
            const Grads routed = run(q, k, v, dout, row.bias, attention_options, type, packed);
            // With the new paths, extrap's kernels and cuDNN's write the output heads-major: the
            // merge of the heads is a view.
            if (new_routes && (choice.route == GpuRoute::Cudnn || choice.route == GpuRoute::ExtrapFused))
              CHECK(routed.out.transpose(1, 2).is_contiguous());
            AttentionOptions reference_options = attention_options;
            reference_options.backend = AttentionBackend::Reference;
            const Grads ref = run(q, k, v, dout, row.bias, reference_options, torch::kFloat64);
            const Grads low = run(q, k, v, dout, row.bias, reference_options, type);
            check_close("out", routed.out, low.out, ref.out);
            check_close("dq", routed.dq, low.dq, ref.dq);
            check_close("dk", routed.dk, low.dk, ref.dk);
            check_close("dv", routed.dv, low.dv, ref.dv);
            if (ref.dtable.defined()) check_close("dtable", routed.dtable, low.dtable, ref.dtable);
          }
        }
      }
    }
  }
}

TEST_CASE("GPU routes under train.precision bf16: float32 inputs, bfloat16 kernels", "[cuda][gpu-routes]") {
  if (!have_cuda()) return;
  torch::manual_seed(5);
  const NewRoutes setting("1");
  const int64_t heads = 4, length = 300, head_dim = 64;
  const auto q = torch::randn({2, heads, length, head_dim}, torch::TensorOptions().device(torch::kCUDA)),
             k = torch::randn_like(q), v = torch::randn_like(q), dout = torch::randn_like(q);
  for (const auto& bias : {AttentionBias::none(), paper_alibi(heads, torch::kCUDA)}) {
    INFO(bias.describe());
    const BiasMaker fixed = [bias](torch::ScalarType) { return Learned{bias, {}}; };
    AttentionOptions options;
    options.training = true;
    Grads routed;
    {
      ComputePrecision bf16(Precision::bf16, c10::DeviceType::CUDA);
      routed = run(q, k, v, dout, fixed, options, torch::kFloat32);
    }
    AttentionOptions reference_options = options;
    reference_options.backend = AttentionBackend::Reference;
    const Grads ref = run(q, k, v, dout, fixed, reference_options, torch::kFloat64);
    const Grads low = run(q, k, v, dout, fixed, reference_options, torch::kBFloat16);
    CHECK(routed.out.scalar_type() == torch::kBFloat16);  // the kernels' output, as autocast's SDPA
    check_close("out", routed.out, low.out, ref.out);
    check_close("dq", routed.dq, low.dq, ref.dq);
    check_close("dv", routed.dv, low.dv, ref.dv);
  }
}

TEST_CASE("cuDNN's attention refuses what it does not compute, in one line", "[cuda][gpu-routes]") {
  if (!have_cuda() || !have_cudnn_attention()) return;
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto q = torch::randn({1, 2, 16, 64}, bf16);
  const auto& reason = cuda_attention()->cudnn_unsupported_reason;
  const auto bias = paper_alibi(2, torch::kCUDA);
  CHECK(reason(q, q, q, bias, true).empty());
  CHECK(reason(q, q, q, bias, false).find("causally only") != std::string::npos);
  auto chunked = bias;
  chunked.chunk = 8;
  CHECK(reason(q, q, q, chunked, true).find("a window only") != std::string::npos);
  const auto q32 = q.to(torch::kFloat32);
  CHECK(reason(q32, q32, q32, bias, true).find("bfloat16 or float16") != std::string::npos);
  const auto q20 = torch::randn({1, 2, 16, 20}, bf16);
  CHECK(reason(q20, q20, q20, bias, true).find("head dimension") != std::string::npos);
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(cuda_attention()->cudnn(q32, q32, q32, true, 0), Contains("bfloat16 or float16"));
}
