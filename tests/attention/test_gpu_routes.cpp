// The GPU route table (core/attention/gpu_routes.h) as logic: which route each bias and option
// takes, and why the faster ones passed, with stand-in kernels. The routes' numbers are tested on
// a GPU (tests/attention/test_fused_cuda_attention.cpp).
#include "core/attention/gpu_routes.h"
#include "core/base/environment.h"
#include "positions/position.h"

#include <catch2/catch.hpp>

#include <cstdlib>

using namespace extrap;

namespace {

// Stand-ins for the kernels' own checks: cuDNN refuses head dimension 96, extrap's kernels take
// biases described by slopes or by offset (none, linear, dense by_offset), as theirs do.
GpuKernels stand_ins() {
  GpuKernels kernels;
  kernels.cudnn = [](const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&, const AttentionBias&,
                           bool) { return q.size(3) == 96 ? std::string("head dimension 96") : std::string(); };
  kernels.extrap_fused = [](const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const AttentionBias& b,
                            bool) {
    const bool takes = b.kind == AttentionBias::Kind::None || b.kind == AttentionBias::Kind::Linear ||
                       (b.kind == AttentionBias::Kind::Dense && b.by_offset);
    return takes ? std::string() : std::string("not by offset");
  };
  kernels.new_routes = true;
  return kernels;
}

struct Call {
  torch::Tensor q = torch::zeros({2, 4, 16, 64});
  AttentionOptions options;
  GpuRouteChoice route(const AttentionBias& bias, const GpuKernels& kernels = stand_ins()) const {
    return choose_gpu_route(q, q, q, bias, options, kernels);
  }
};

AttentionBias marked_alibi(int64_t heads = 4) {
  auto b = AttentionBias::linear_causal(torch::rand({heads}));
  b.paper_slopes = true;
  return b;
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::shared_ptr<PositionMethod> make_method(const std::string& name, int64_t heads, bool causal = true) {
  PositionContext context;
  context.causal = causal;
  context.num_heads = heads;
  context.d_head = 8;
  context.d_model = heads * 8;
  return PositionRegistry::instance().create(name, context, OptionReader(YAML::Node(), "test", "position"));
}

}  // namespace

TEST_CASE("GPU routes: no bias goes to SDPA, dropout included", "[attention][gpu-routes]") {
  Call call;
  CHECK(call.route(AttentionBias::none()).route == GpuRoute::Sdpa);
  GpuKernels libtorch_only;  // SDPA is LibTorch's own: no CUDA half needed
  libtorch_only.new_routes = true;
  CHECK(call.route(AttentionBias::none(), libtorch_only).route == GpuRoute::Sdpa);
  call.options.training = true;
  call.options.dropout = 0.1;
  CHECK(call.route(AttentionBias::none()).route == GpuRoute::Sdpa);
  call.options.causal = false;
  CHECK(call.route(AttentionBias::none()).route == GpuRoute::Sdpa);
}

TEST_CASE("GPU routes: the paper's causal ALiBi goes to cuDNN, every other linear bias to extrap's kernels",
          "[attention][gpu-routes]") {
  Call call;
  const auto cudnn = call.route(marked_alibi());
  CHECK(cudnn.route == GpuRoute::Cudnn);
  CHECK(mentions(cudnn.passed_over, "sdpa: it adds no bias"));

  // Each condition of cuDNN's row, broken alone, hands the call to extrap's kernels with its reason.
  const auto fused_because = [&](const AttentionBias& bias, const std::string& reason, const Call& c) {
    const auto choice = c.route(bias);
    INFO(choice.passed_over);
    CHECK(choice.route == GpuRoute::ExtrapFused);
    CHECK(mentions(choice.passed_over, "cudnn: " + reason));
  };
  auto unmarked = marked_alibi();
  unmarked.paper_slopes = false;
  fused_because(unmarked, "the slopes are not the paper's", call);
  auto learned = AttentionBias::linear_causal(torch::rand({4}).requires_grad_(true));
  learned.paper_slopes = true;  // even if a method said so
  fused_because(learned, "the slopes require grad", call);
  auto symmetric = AttentionBias::linear_symmetric(torch::rand({4}));
  symmetric.paper_slopes = true;
  Call bidirectional;
  bidirectional.options.causal = false;
  fused_because(symmetric, "its ALiBi mask and band are used causally only", bidirectional);
  fused_because(marked_alibi().at_positions(torch::arange(16)), "sampled positions", call);
  auto one_head_right = AttentionBias::linear(torch::rand({4}), torch::rand({4}),
                                              torch::tensor({true, true, false, true}), torch::zeros({4}, torch::kBool));
  one_head_right.paper_slopes = true;
  fused_because(one_head_right, "a head does not look left", call);
  Call d96;
  d96.q = torch::zeros({1, 4, 16, 96});
  fused_because(marked_alibi(), "head dimension 96", d96);
  auto without_cudnn = stand_ins();
  without_cudnn.cudnn = nullptr;
  const auto unbuilt = call.route(marked_alibi(), without_cudnn);
  CHECK(unbuilt.route == GpuRoute::ExtrapFused);
  CHECK(mentions(unbuilt.passed_over, "cudnn: not built"));
}

TEST_CASE("GPU routes: options, dropout with a bias, dense biases not by offset and no CUDA half go to the reference",
          "[attention][gpu-routes]") {
  Call call;
  for (const char* option : {"chunk", "sink"}) {
    auto bias = marked_alibi();
    if (option == std::string("chunk")) bias.chunk = 8;
    if (option == std::string("sink")) bias.sink = torch::zeros({4});
    const auto choice = call.route(bias);
    INFO(option << ": " << choice.passed_over);
    CHECK(choice.route == GpuRoute::Reference);
    CHECK(mentions(choice.passed_over, "cudnn: of the options it takes a window only"));
    CHECK(mentions(choice.passed_over, "extrap-fused: the options"));
  }
  // A causal window, of no bias or on the paper's ALiBi, is cuDNN's diagonal band; bidirectional,
  // with other slopes or without the new routes, the reference's.
  auto windowed_none = AttentionBias::none();
  windowed_none.window = 8;
  auto windowed_alibi = marked_alibi();
  windowed_alibi.window = 8;
  CHECK(call.route(windowed_none).route == GpuRoute::Cudnn);
  CHECK(call.route(windowed_alibi).route == GpuRoute::Cudnn);
  auto windowed_other = AttentionBias::linear_causal(torch::rand({4}));
  windowed_other.window = 8;
  CHECK(call.route(windowed_other).route == GpuRoute::Reference);
  Call both_ways;
  both_ways.options.causal = false;
  const auto bidirectional_window = both_ways.route(windowed_none);
  CHECK(bidirectional_window.route == GpuRoute::Reference);
  CHECK(mentions(bidirectional_window.passed_over, "cudnn: its ALiBi mask and band are used causally only"));
  auto proven = stand_ins();
  proven.new_routes = false;
  CHECK(call.route(windowed_none, proven).route == GpuRoute::Reference);

  Call dropout;
  dropout.options.training = true;
  dropout.options.dropout = 0.1;
  const auto with_dropout = dropout.route(marked_alibi());
  CHECK(with_dropout.route == GpuRoute::Reference);
  CHECK(mentions(with_dropout.passed_over, "cudnn: attention dropout"));
  dropout.options.training = false;  // evaluation: dropout is off
  CHECK(dropout.route(marked_alibi()).route == GpuRoute::Cudnn);

  const auto dense = call.route(AttentionBias::dense_blocks([](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    return torch::zeros({4, q1 - q0, k1 - k0});
  }));
  CHECK(dense.route == GpuRoute::Reference);
  CHECK(mentions(dense.passed_over, "cudnn: the bias is neither none nor the paper's ALiBi"));
  CHECK(mentions(dense.passed_over, "extrap-fused: not by offset"));
  // A bias of j - i alone (T5, KERPLE, Sandwich) goes to extrap's kernels, unless an option or
  // dropout is set.
  auto by_offset = AttentionBias::dense_by_offset([](int64_t lo, int64_t hi) { return torch::zeros({4, hi - lo}); });
  CHECK(call.route(by_offset).route == GpuRoute::ExtrapFused);
  CHECK(dropout.route(by_offset).route == GpuRoute::ExtrapFused);  // evaluation (set above)
  by_offset.window = 8;
  CHECK(call.route(by_offset).route == GpuRoute::Reference);

  const auto nothing = call.route(marked_alibi(), GpuKernels{});
  CHECK(nothing.route == GpuRoute::Reference);
  CHECK(mentions(nothing.passed_over, "extrap-fused: not loaded"));
  // Fewer queries than keys is not the table's (the dispatcher sends it to the reference first).
  CHECK_THROWS(choose_gpu_route(torch::zeros({1, 4, 3, 64}), torch::zeros({1, 4, 8, 64}), torch::zeros({1, 4, 8, 64}),
                                marked_alibi(), AttentionOptions{}, stand_ins()));
}

TEST_CASE("the alibi method marks its slopes as the paper's only while its buffer holds them",
          "[attention][gpu-routes][alibi]") {
  for (int64_t heads : {1, 3, 8, 12}) {
    auto method = make_method("alibi", heads);
    CHECK(method->bias(layer_window(0, 8)).paper_slopes);
    auto slopes = method->named_buffers()["slopes"];
    const auto kept = slopes.clone();
    slopes.mul_(1.5);  // a checkpoint or a plugin wrote other slopes
    CHECK_FALSE(method->bias(layer_window(0, 8)).paper_slopes);
    slopes.copy_(kept);
    CHECK(method->bias(layer_window(0, 8)).paper_slopes);
    slopes[0] = std::nextafter(slopes[0].item<float>(), 1.0f);  // one ulp off
    CHECK_FALSE(method->bias(layer_window(0, 8)).paper_slopes);
  }
  // The methods whose slopes are learned or laid out otherwise never claim the paper's.
  CHECK_FALSE(make_method("alibi_learned", 4)->bias(layer_window(0, 8)).paper_slopes);
  for (const char* other : {"alibi_symmetric", "alibi_nonsymmetric"}) {
    INFO(other);
    CHECK_FALSE(make_method(other, 4, /*causal=*/false)->bias(layer_window(0, 8)).paper_slopes);
  }
}

TEST_CASE("GPU routes not yet run on a GPU are taken only with EXTRAP_GPU_NEW_ROUTES=1", "[attention][gpu-routes]") {
  Call call;
  auto proven = stand_ins();
  proven.new_routes = false;
  // Where each call went before the new routes: no bias and the paper's ALiBi to extrap's
  // kernels, dense biases of j - i to the reference; each says why.
  const auto none = call.route(AttentionBias::none(), proven);
  CHECK(none.route == GpuRoute::ExtrapFused);
  CHECK(mentions(none.passed_over, "sdpa: not yet run on a GPU (EXTRAP_GPU_NEW_ROUTES=1 takes it)"));
  const auto alibi = call.route(marked_alibi(), proven);
  CHECK(alibi.route == GpuRoute::ExtrapFused);
  CHECK(mentions(alibi.passed_over, "cudnn: not yet run on a GPU"));
  const auto offsets = call.route(
      AttentionBias::dense_by_offset([](int64_t lo, int64_t hi) { return torch::zeros({4, hi - lo}); }), proven);
  CHECK(offsets.route == GpuRoute::Reference);
  CHECK(mentions(offsets.passed_over, "extrap-fused: its offsets mode is not yet run on a GPU"));

  // The switch itself: unset or 0 off, 1 on, anything else refused naming it.
  const char* kept = std::getenv("EXTRAP_GPU_NEW_ROUTES");
  const std::string kept_value = kept ? kept : "";
  ::unsetenv("EXTRAP_GPU_NEW_ROUTES");
  CHECK_FALSE(gpu_new_routes_on());
  ::setenv("EXTRAP_GPU_NEW_ROUTES", "0", 1);
  CHECK_FALSE(gpu_new_routes_on());
  ::setenv("EXTRAP_GPU_NEW_ROUTES", "1", 1);
  CHECK(gpu_new_routes_on());
  CHECK(gpu_kernels_present().new_routes);
  ::setenv("EXTRAP_GPU_NEW_ROUTES", "yes", 1);
  CHECK_THROWS_WITH(gpu_new_routes_on(), Catch::Matchers::Contains("EXTRAP_GPU_NEW_ROUTES=yes"));
  if (kept) ::setenv("EXTRAP_GPU_NEW_ROUTES", kept_value.c_str(), 1);
  else ::unsetenv("EXTRAP_GPU_NEW_ROUTES");
}
