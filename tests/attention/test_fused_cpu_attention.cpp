// The fused CPU training attention (core/attention/fused_cpu_attention.h) against the reference path in
// float64: outputs and the gradients of q, k and v, for every bias it takes, causal or not,
// lengths that fill, split and overrun its 64-row query blocks, strided and contiguous inputs.
// And what it refuses, which attention() then sends to the reference.
#include "core/attention/attention.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/kernels/bf16_gemm.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <tuple>

using namespace extrap;

namespace {

// A bias of each kind the kernel takes, for 4 heads.
std::vector<std::pair<std::string, AttentionBias>> biases() {
  const auto slopes = torch::tensor({0.5f, 0.25f, 0.125f, 0.0625f});
  return {
      {"none", AttentionBias::none()},
      {"alibi", AttentionBias::linear_causal(slopes)},
      {"symmetric", AttentionBias::linear_symmetric(slopes)},
      // Per head: both ways with other right slopes, left only, right only, neither (diagonal only).
      {"directions", AttentionBias::linear(slopes, torch::tensor({0.3f, 0.2f, 0.1f, 0.05f}),
                                           torch::tensor({true, true, false, false}),
                                           torch::tensor({true, false, true, false}))},
  };
}

// A dense bias of j - i alone (as T5, KERPLE and Sandwich describe theirs), for 4 heads: one that
// tells left from right, so that an offset read from the wrong side shows. The kernel takes it
// for inference only.
AttentionBias offset_bias() {
  return AttentionBias::dense_by_offset([](int64_t lo, int64_t hi) {
    const auto o = torch::arange(lo, hi, torch::kFloat32);               // (R,)
    const auto h = torch::arange(1, 5, torch::kFloat32).view({-1, 1});  // (4, 1)
    return torch::sin(0.3f * o * h) - 0.02f * o.abs() * h + 0.01f * o;  // (4, R)
  });
}

// The biases of inference: the training ones, a bias by offset, and one with a window, a sink
// and a logit scale of T rows.
std::vector<std::pair<std::string, AttentionBias>> inference_biases(int64_t T) {
  auto out = biases();
  out.emplace_back("by offset", offset_bias());
  AttentionBias options = offset_bias();
  options.window = 37;
  options.sink = torch::tensor({0.5f, -1.0f, 2.0f, 0.0f});
  options.logit_scale = torch::rand({4, T}) + 0.5;
  out.emplace_back("by offset + window 37 + sink + logit scale", options);
  return out;
}

// Largest difference over the largest expected magnitude, or over 1 where everything expected
// is smaller (a single key's q and k gradients are exactly 0: rounding noise is all there is).
double max_relative_difference(const torch::Tensor& got, const torch::Tensor& expected) {
  return ((got.to(torch::kFloat64) - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item<double>();
}

// Skips the test (and returns false) where LibTorch exports no sgemm_.
bool kernel_available() {
  if (fused_cpu_attention_unsupported_reason(torch::zeros({1, 1, 1, 1}), torch::zeros({1, 1, 1, 1}),
                                             torch::zeros({1, 1, 1, 1}), AttentionBias::none(), {})
          .empty())
    return true;
  testing::skip_test("this LibTorch exports no sgemm_: the fused CPU attention is not available");
  return false;
}

// The kernel's output and q, k, v gradients (in the inputs' dtype) against attention_reference
// in float64 on the same values: the largest difference relative to the largest value.
void check_against_float64(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                           const AttentionBias& bias, bool causal, double out_tolerance, double grad_tolerance) {
  auto q = q_in.detach().requires_grad_(), k = k_in.detach().requires_grad_(), v = v_in.detach().requires_grad_();
  REQUIRE(fused_cpu_attention_unsupported_reason(q, k, v, bias, {}).empty());
  AttentionOptions options;
  options.causal = causal;
  options.training = true;
  const auto y = fused_cpu_attention(q, k, v, bias, options);
  REQUIRE(y.sizes() == q.sizes());
  REQUIRE(y.scalar_type() == q.scalar_type());
  REQUIRE(y.transpose(1, 2).is_contiguous());  // the output projection's layout
  const auto grad_y = torch::randn(y.sizes()).to(y.scalar_type());
  y.backward(grad_y);
  REQUIRE(q.grad().scalar_type() == q.scalar_type());

  auto q64 = q.detach().to(torch::kFloat64).requires_grad_(), k64 = k.detach().to(torch::kFloat64).requires_grad_(),
       v64 = v.detach().to(torch::kFloat64).requires_grad_();
  const auto expected = attention_reference(q64, k64, v64, bias, options);
  expected.backward(grad_y.to(torch::kFloat64));
  CHECK(max_relative_difference(y.detach(), expected.detach()) < out_tolerance);
  CHECK(max_relative_difference(q.grad(), q64.grad()) < grad_tolerance);
  CHECK(max_relative_difference(k.grad(), k64.grad()) < grad_tolerance);
  CHECK(max_relative_difference(v.grad(), v64.grad()) < grad_tolerance);
}

// A bias by offset scaled by a learned factor per head, as T5's table, KERPLE's and Sandwich's
// parameters reach theirs: the gradient goes through the offsets to `w` (4,), in w's dtype.
AttentionBias learned_offset_bias(const torch::Tensor& w) {
  return AttentionBias::dense_by_offset([w](int64_t lo, int64_t hi) {
    const auto o = torch::arange(lo, hi, w.options().requires_grad(false));
    const auto h = torch::arange(1, 5, w.options().requires_grad(false)).view({-1, 1});
    return (torch::sin(0.3 * o * h) - 0.02 * o.abs() * h + 0.01 * o) * w.view({-1, 1});
  });
}

// Training with a learned bias by offset (and, `with_options`, a window, a learned sink and a
// learned logit scale): the kernel's output and the gradients of q, k, v, the bias's factors,
// the sink and the logit scale against attention_reference in float64 on the same values.
void check_learned_offsets(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                           bool causal, bool with_options, double out_tolerance, double grad_tolerance) {
  const int64_t T = q_in.size(2);
  const auto factors = torch::tensor({1.0, 0.5, -0.7, 2.0}), sink = torch::tensor({0.5, -1.0, 2.0, 0.0});
  const auto logit_scale = torch::rand({4, T}, torch::kFloat64) + 0.5;
  struct Run {
    torch::Tensor q, k, v, w, sink, scale, y;
  };
  // The leaves in `type` (q, k, v in the inputs' dtype for the kernel), the bias over them.
  const auto run = [&](torch::ScalarType type, bool kernel) {
    Run r;
    const auto leaf = [](const torch::Tensor& x, torch::ScalarType t) { return x.detach().to(t).requires_grad_(); };
    r.q = leaf(q_in, kernel ? q_in.scalar_type() : type), r.k = leaf(k_in, r.q.scalar_type()),
    r.v = leaf(v_in, r.q.scalar_type());
    r.w = leaf(factors, type), r.sink = leaf(sink, type), r.scale = leaf(logit_scale, type);
    AttentionBias bias = learned_offset_bias(r.w);
    if (with_options) {
      bias.window = 37;
      bias.sink = r.sink;
      bias.logit_scale = r.scale;
    }
    AttentionOptions options;
    options.causal = causal;
    options.training = true;
    if (kernel) REQUIRE(fused_cpu_attention_unsupported_reason(r.q, r.k, r.v, bias, options).empty());
    r.y = kernel ? fused_cpu_attention(r.q, r.k, r.v, bias, options) : attention_reference(r.q, r.k, r.v, bias, options);
    return r;
  };
  Run got = run(torch::kFloat32, true), expected = run(torch::kFloat64, false);
  const auto grad_y = torch::randn(got.y.sizes());
  got.y.backward(grad_y.to(got.y.scalar_type()));
  expected.y.backward(grad_y.to(torch::kFloat64));
  CHECK(max_relative_difference(got.y.detach(), expected.y.detach()) < out_tolerance);
  for (const auto& [name, a, b] : std::vector<std::tuple<const char*, torch::Tensor, torch::Tensor>>{
           {"q", got.q, expected.q}, {"k", got.k, expected.k}, {"v", got.v, expected.v},
           {"the bias's factors", got.w, expected.w}}) {
    INFO("gradient of " << name);
    REQUIRE(a.grad().defined());
    CHECK(max_relative_difference(a.grad(), b.grad()) < grad_tolerance);
  }
  if (with_options) {
    CHECK(max_relative_difference(got.sink.grad(), expected.sink.grad()) < grad_tolerance);
    CHECK(max_relative_difference(got.scale.grad(), expected.scale.grad()) < grad_tolerance);
  }
}

}  // namespace

TEST_CASE("fused CPU attention: a learned bias by offset trains, its gradient equal to the float64 reference's", "[attention][fused_cpu]") {
  if (!kernel_available()) return;
  torch::manual_seed(13);
  const int64_t B = 2, H = 4;
  for (int64_t T : {1, 17, 64, 65, 150}) {
    for (bool causal : {true, false}) {
      for (bool with_options : {false, true}) {
        INFO("T " << T << (causal ? ", causal" : ", bidirectional")
                  << (with_options ? ", window 37, sink and logit scale" : ""));
        const auto parts = torch::randn({B, T, 3, H, 16}).permute({2, 0, 3, 1, 4}).unbind(0);
        check_learned_offsets(parts[0], parts[1], parts[2], causal, with_options, 1e-5, 1e-4);
      }
    }
  }
}

TEST_CASE("fused CPU attention: outputs and q, k, v gradients equal the float64 reference", "[attention][fused_cpu]") {
  if (!kernel_available()) return;
  torch::manual_seed(11);
  const int64_t B = 2, H = 4;
  for (int64_t T : {1, 17, 64, 65, 150}) {
    for (int64_t D : {8, 32}) {
      for (bool causal : {true, false}) {
        for (const auto& [name, bias] : biases()) {
          for (bool strided : {true, false}) {
            INFO("T " << T << ", D " << D << (causal ? ", causal, " : ", bidirectional, ") << name
                      << (strided ? ", strided (as the model's unbind gives)" : ", contiguous"));
            // Strided like the model's: (B, T, 3, H, D) permuted to (3, B, H, T, D) and unbound.
            auto qkv = torch::randn({B, T, 3, H, D});
            if (!strided) qkv = qkv.permute({2, 0, 3, 1, 4}).contiguous().permute({1, 3, 0, 2, 4});
            const auto parts = qkv.permute({2, 0, 3, 1, 4}).unbind(0);
            check_against_float64(parts[0], parts[1], parts[2], bias, causal, 1e-5, 1e-4);
          }
        }
      }
    }
  }
}

TEST_CASE("fused CPU attention for inference: equal to the float64 reference, whatever the thread count",
          "[attention][fused_cpu]") {
  if (!kernel_available()) return;
  torch::manual_seed(12);
  const int64_t B = 2, H = 4, D = 16;
  const int threads = at::get_num_threads();
  torch::NoGradGuard no_grad;
  // 1 to 5 query blocks of 64, odd and even block counts (tasks alternate first and last blocks),
  // and two key tiles of 256 at 300.
  for (int64_t T : {1, 63, 130, 192, 300}) {
    for (bool causal : {true, false}) {
      for (const auto& [name, bias] : inference_biases(T)) {
        INFO("T " << T << (causal ? ", causal, " : ", bidirectional, ") << name);
        const auto parts = torch::randn({B, T, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
        AttentionOptions options;
        options.causal = causal;
        const auto expected = attention_reference(parts[0].to(torch::kFloat64), parts[1].to(torch::kFloat64),
                                                  parts[2].to(torch::kFloat64), bias, options);
        torch::Tensor first;
        for (int n : {1, 3}) {
          at::set_num_threads(n);
          const auto y = fused_cpu_attention(parts[0], parts[1], parts[2], bias, options);
          REQUIRE(y.sizes() == parts[0].sizes());
          REQUIRE(y.transpose(1, 2).is_contiguous());
          CHECK(max_relative_difference(y, expected) < 1e-5);
          // Every row is one task's work, whoever runs it: the same bits on any thread count.
          if (first.defined()) CHECK(torch::equal(y, first));
          first = y;
        }
        at::set_num_threads(threads);
      }
    }
  }
  // Past a few key tiles of 256, where far tiles of a linear bias are skipped as negligible, and
  // past 1024 queries, where a problem whose tiles cannot be skipped takes blocks of 256 queries
  // and tiles of 512 keys (5 blocks and 3 tiles at 1100): the reference's numbers still, for keys
  // left and right of every block, and the same bits on any thread count.
  for (bool causal : {true, false}) {
    for (const auto& [name, bias] : inference_biases(1100)) {
      INFO("T 1100" << (causal ? ", causal, " : ", bidirectional, ") << name);
      const auto parts = torch::randn({1, 1100, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
      AttentionOptions options;
      options.causal = causal;
      const auto expected = attention_reference(parts[0].to(torch::kFloat64), parts[1].to(torch::kFloat64),
                                                parts[2].to(torch::kFloat64), bias, options);
      torch::Tensor first;
      for (int n : {1, 3}) {
        at::set_num_threads(n);
        const auto y = fused_cpu_attention(parts[0], parts[1], parts[2], bias, options);
        CHECK(max_relative_difference(y, expected) < 1e-5);
        if (first.defined()) CHECK(torch::equal(y, first));
        first = y;
      }
      at::set_num_threads(threads);
    }
  }
  // attention() sends long CPU evaluations here: past the efficient threshold, the same result.
  AttentionOptions options;
  options.efficient_threshold = 64 * 64;
  const auto parts = torch::randn({1, 150, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
  const auto bias = biases()[1].second;
  CHECK(torch::equal(attention(parts[0], parts[1], parts[2], bias, options),
                     fused_cpu_attention(parts[0], parts[1], parts[2], bias, options)));
  // And every evaluation from fused_cpu_min_length queries on, at the default threshold; below
  // it the reference path.
  torch::NoGradGuard evaluating;
  const AttentionOptions plain;
  for (const int64_t T : {plain.fused_cpu_min_length - 1, plain.fused_cpu_min_length}) {
    INFO("T " << T);
    const auto window = torch::randn({1, T, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
    const auto expected = T >= plain.fused_cpu_min_length
                              ? fused_cpu_attention(window[0], window[1], window[2], bias, plain)
                              : attention_reference(window[0], window[1], window[2], bias, plain);
    CHECK(torch::equal(attention(window[0], window[1], window[2], bias, plain), expected));
  }
}

TEST_CASE("fused CPU attention: what it does not take goes to the reference, named", "[attention][fused_cpu]") {
  const auto q = torch::randn({1, 4, 16, 8}), k = torch::randn({1, 4, 16, 8}), v = torch::randn({1, 4, 16, 8});
  const auto slopes = torch::tensor({0.5f, 0.25f, 0.125f, 0.0625f});
  AttentionOptions training;
  training.training = true;
  auto reason = [&](const torch::Tensor& a, const AttentionBias& bias, const AttentionOptions& options) {
    return fused_cpu_attention_unsupported_reason(a, a.is_same(q) ? k : k.to(a.scalar_type()),
                                                  a.is_same(q) ? v : v.to(a.scalar_type()), bias, options);
  };
  REQUIRE_THAT(reason(q, AttentionBias::linear_causal(slopes.clone().requires_grad_()), training),
               Catch::Contains("learned slopes"));
  REQUIRE_THAT(reason(q, AttentionBias::linear_causal(slopes).at_positions(torch::arange(16) * 2), training),
               Catch::Contains("sampled positions"));
  REQUIRE_THAT(reason(q, AttentionBias::cumulative_sum(torch::zeros({1, 4, 16})), training),
               Catch::Contains("cumulative"));
  REQUIRE_THAT(reason(q.to(torch::kFloat64), AttentionBias::none(), training), Catch::Contains("float32"));
  // A dense bias: one of j - i alone, in training and in inference; no other.
  const auto tile = AttentionBias::dense_blocks([](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    return torch::zeros({4, q1 - q0, k1 - k0});
  });
  {
    torch::AutoGradMode grad(true);
    REQUIRE(reason(q, offset_bias(), training).empty());
    REQUIRE_THAT(reason(q, tile, training), Catch::Contains("not one of j - i alone"));
    torch::NoGradGuard inference;
    REQUIRE(reason(q, offset_bias(), AttentionOptions{}).empty());
    REQUIRE_THAT(reason(q, tile, AttentionOptions{}), Catch::Contains("not one of j - i alone"));
  }
  AttentionOptions dropout = training;
  dropout.dropout = 0.1;
  REQUIRE_THAT(reason(q, AttentionBias::none(), dropout), Catch::Contains("dropout"));
  // The fused backend named outright refuses with the reason; Auto takes the reference instead.
  AttentionOptions fused = training;
  fused.backend = AttentionBackend::Fused;
  const auto learned = AttentionBias::linear_causal(slopes.clone().requires_grad_());
  REQUIRE_THROWS_WITH(attention(q, k, v, learned, fused), Catch::Contains("learned slopes"));
  AttentionOptions fused_dropout = fused;
  fused_dropout.dropout = 0.1;  // never trained without the dropout it asks for
  REQUIRE_THROWS_WITH(attention(q, k, v, AttentionBias::none(), fused_dropout), Catch::Contains("dropout"));
  torch::Tensor via_auto, via_reference;
  {
    torch::AutoGradMode grad(true);
    via_auto = attention(q, k, v, learned, training);
    via_reference = attention_reference(q, k, v, learned, training);
  }
  REQUIRE(torch::equal(via_auto, via_reference));
  // Auto trains with the kernel from fused_cpu_min_length queries on (its output is a view of
  // a (B, T, H, D) tensor), with the reference below; evaluation likewise.
  const auto slopes_only = AttentionBias::linear_causal(slopes);
  for (int64_t T : {training.fused_cpu_min_length - 1, training.fused_cpu_min_length}) {
    INFO("T " << T);
    const auto x = torch::randn({1, 4, T, 8});
    const bool fused_layout = attention(x, x, x, slopes_only, training).transpose(1, 2).is_contiguous();
    REQUIRE(fused_layout == (T >= training.fused_cpu_min_length));
    torch::NoGradGuard inference;
    AttentionOptions evaluation;
    REQUIRE(attention(x, x, x, slopes_only, evaluation).transpose(1, 2).is_contiguous() ==
            (T >= evaluation.fused_cpu_min_length));
  }
}

TEST_CASE("fused CPU attention: a model's training loss and gradients equal the reference path's", "[attention][fused_cpu]") {
  const auto corpus = testing::tiny_byte_corpus(4);
  // bf16: both paths under autocast; the kernel takes bfloat16 q, k, v (with AVX512_BF16, its
  // products in bfloat16 too), the reference gets float32 copies.
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    for (const char* position :
         {"alibi", "none", "rotary", "alibi_symmetric", "alibi_learned", "t5_bias", "kerple_log", "sandwich"}) {
      INFO(position << (precision == Precision::bf16 ? ", bf16" : ", fp32"));
      Config config = testing::tiny_config(position);
      config.train.seq_len = 130;  // three query blocks, the last of 2 rows; Auto takes the kernel
      const std::string name = position;
      if (name == "alibi_symmetric" || name == "t5_bias")
        config.model.objective = Objective::masked_lm;  // bidirectional
      torch::manual_seed(2);
      TransformerLM model = build_model(config, corpus.vocab_size);
      model->train();
      const auto tokens = torch::randint(0, 256, {3, 131}, torch::kLong);
      auto run = [&](AttentionBackend backend) {
        model->set_attention_backend(backend);
        return testing::loss_and_gradients(model, tokens, precision);
      };
      const auto [loss_auto, grad_auto] = run(AttentionBackend::Auto);
      const auto [loss_reference, grad_reference] = run(AttentionBackend::Reference);
      const bool bf16 = precision == Precision::bf16;
      REQUIRE(loss_auto == Approx(loss_reference).epsilon(bf16 ? 2e-3 : 1e-6));
      REQUIRE((grad_auto - grad_reference).abs().max().item<double>() <
              (bf16 ? 3e-2 : 1e-4) * grad_reference.abs().max().item<double>());
    }
  }
}

TEST_CASE("fused CPU attention on bfloat16 inputs: float32 inside, equal to the float64 reference to bfloat16's precision", "[attention][fused_cpu][bf16]") {
  if (!kernel_available()) return;
  torch::manual_seed(12);
  const int64_t B = 2, H = 4;
  // With AVX512_BF16 the products run in bfloat16 (P and dS rounded, as FlashAttention does);
  // without it (or switched off) q, k, v are widened and the products are float32. Either way
  // the result is rounded to bfloat16 (relative 2^-9).
  std::vector<std::pair<bool, double>> paths = {{false, 6e-3}};
  if (bf16_gemm::available()) paths.push_back({true, 2e-2});
  for (const auto& [bf16_products, tolerance] : paths) {
    bf16_gemm::set_enabled(bf16_products);
    for (int64_t T : {1, 17, 64, 65, 150}) {
      for (int64_t D : {8, 32}) {
        for (bool causal : {true, false}) {
          for (const auto& [name, bias] : biases()) {
            INFO((bf16_products ? "bfloat16 products, " : "float32 products, ")
                 << "T " << T << ", D " << D << (causal ? ", causal, " : ", bidirectional, ") << name);
            const auto parts = torch::randn({B, T, 3, H, D}).to(torch::kBFloat16).permute({2, 0, 3, 1, 4}).unbind(0);
            check_against_float64(parts[0], parts[1], parts[2], bias, causal, tolerance, tolerance);
          }
          INFO((bf16_products ? "bfloat16 products, " : "float32 products, ")
               << "T " << T << ", D " << D << (causal ? ", causal, " : ", bidirectional, ")
               << "a learned bias by offset with a window, sink and logit scale");
          const auto parts = torch::randn({B, T, 3, H, D}).to(torch::kBFloat16).permute({2, 0, 3, 1, 4}).unbind(0);
          check_learned_offsets(parts[0], parts[1], parts[2], causal, true, tolerance, tolerance);
        }
      }
    }
  }
  bf16_gemm::set_enabled(true);
  // Switched off between a forward that used the bfloat16 products and its backward: the
  // backward still runs them (the switch picks the path of new calls only).
  if (bf16_gemm::available()) {
    const auto parts = torch::randn({1, 70, 3, H, 8}).to(torch::kBFloat16).permute({2, 0, 3, 1, 4}).unbind(0);
    auto q = parts[0].detach().requires_grad_();
    AttentionOptions options;
    options.training = true;
    const auto y = fused_cpu_attention(q, parts[1], parts[2], AttentionBias::none(), options);
    bf16_gemm::set_enabled(false);
    y.sum().backward();
    bf16_gemm::set_enabled(true);
    REQUIRE(torch::isfinite(q.grad()).all().item<bool>());
  }
}
