// The CUDA training loss's own source (core/kernels/cuda/cross_entropy_kernels.cuh), run as CPU
// threads by simt.h's host emulation: the summed loss, each row's log-sum-exp and loss, and the
// gradient against float64, for float32 and bfloat16 logits, class counts from one to GPT-2's,
// ignored rows, a confident row (a loss far below float32's rounding of the log-sum-exp), and a
// target outside the classes (NaN, not a number that looks right). On any machine;
// tests/kernels/test_cross_entropy_cuda.cpp runs the compiled kernels on a GPU.
#include <catch2/catch.hpp>

#include "core/kernels/cuda/cross_entropy_kernels.cuh"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <cmath>

using namespace extrap;
using namespace extrap::testing;

namespace {


struct CeResult {
  torch::Tensor lse, row_loss, loss, grad;
};

// The kernels on `logits` (float32 or bfloat16, (N, V)) and `targets`, backward with gradient g.
CeResult run_kernels(const torch::Tensor& logits, const torch::Tensor& targets, float g, int64_t ignore_index) {
  const int64_t N = logits.size(0), V = logits.size(1);
  const auto type = logits.scalar_type() == torch::kBFloat16 ? cuda::RowType::bfloat16 : cuda::RowType::float32;
  CeResult r{torch::full({N}, NAN), torch::full({N}, NAN, torch::kFloat64), torch::full({}, NAN),
             torch::full({N, V}, NAN, logits.options())};
  cuda::CrossEntropyRows rows;
  rows.rows = N;
  rows.classes = V;
  rows.logits = logits.data_ptr();
  rows.logits_type = type;
  rows.targets = targets.data_ptr<int64_t>();
  rows.ignore_index = ignore_index;
  rows.lse = r.lse.data_ptr<float>();
  cuda::CrossEntropyForward f;
  static_cast<cuda::CrossEntropyRows&>(f) = rows;
  f.row_loss = r.row_loss.data_ptr<double>();
  f.loss = r.loss.data_ptr<float>();
  cuda::dispatch_cross_entropy_forward(f, simt::HostLaunch{});
  const auto grad_loss = torch::full({}, g);
  cuda::CrossEntropyBackward b;
  static_cast<cuda::CrossEntropyRows&>(b) = rows;
  b.grad_loss = grad_loss.data_ptr<float>();
  b.grad = r.grad.data_ptr();
  cuda::dispatch_cross_entropy_backward(b, simt::HostLaunch{});
  return r;
}

}  // namespace

TEST_CASE("CUDA cross-entropy's source on CPU threads: loss, log-sum-exp and gradient equal float64's", "[simt]") {
  torch::manual_seed(41);
  const int64_t ignore = -100;
  for (const int64_t V : {1, 7, 256, 257, 1000, 50304}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      INFO("classes " << V << (dtype == torch::kBFloat16 ? " bfloat16" : " float32"));
      const int64_t N = V >= 50000 ? 3 : 9;
      const auto logits = (4 * torch::randn({N, V})).to(dtype);
      auto targets = torch::randint(0, V, {N}, torch::kInt64);
      targets[1] = ignore;  // an ignored row
      const float g = 0.37f;
      const auto r = run_kernels(logits, targets, g, ignore);

      // float64 from the definition: -log softmax at the target, summed over the rows not ignored.
      const auto x64 = logits.to(torch::kFloat64).requires_grad_();
      const auto lse64 = x64.detach().logsumexp(1);
      const auto kept = targets.ne(ignore);
      const auto safe = targets.clamp_min(0);
      const auto rows64 = (x64.logsumexp(1) - x64.gather(1, safe.view({-1, 1})).squeeze(1)) * kept.to(torch::kFloat64);
      (rows64.sum() * double(g)).backward();

      CHECK(std::abs(r.loss.item<double>() - rows64.sum().item<double>()) <= 1e-5 * rows64.abs().sum().item<double>() + 1e-6);
      CHECK(max_scaled_error(r.row_loss, rows64.detach()) < 1e-5);
      CHECK(r.row_loss[1].item<double>() == 0);
      CHECK(r.lse[1].item<float>() == 0);
      const auto kept_lse = r.lse.masked_select(kept), kept_lse64 = lse64.masked_select(kept);
      CHECK(max_scaled_error(kept_lse, kept_lse64) < 1e-6);
      CHECK(torch::equal(r.grad[1], torch::zeros({V}, logits.options())));  // ignored: zero
      CHECK(max_scaled_error(r.grad, x64.grad()) < (dtype == torch::kBFloat16 ? 1.0 / 128 : 1e-5));
    }
  }
}

TEST_CASE("CUDA cross-entropy's source on CPU threads: a confident row's loss below float32's rounding of the log-sum-exp", "[simt]") {
  // The target's logit 30 above 999 others at 0: the loss is log(1 + 999 e^-30), about 9.4e-11,
  // far below the half-ulp of a log-sum-exp near 30 (1e-6); computed as log(1 + rest) - 0, it keeps
  // its digits.
  auto logits = torch::zeros({2, 1000});
  logits[0][5] = 30;
  logits[1][7] = 30;
  const auto targets = torch::tensor({int64_t(5), int64_t(7)});
  const auto r = run_kernels(logits, targets, 1.0f, -100);
  const double expected = std::log1p(999 * std::exp(-30.0));
  for (int i = 0; i < 2; ++i) CHECK(std::abs(r.row_loss[i].item<double>() - expected) < 1e-4 * expected);
}

TEST_CASE("CUDA cross-entropy's source on CPU threads: a target outside the classes gives NaN, not a number", "[simt]") {
  const auto logits = torch::randn({3, 50});
  const auto targets = torch::tensor({int64_t(4), int64_t(50), int64_t(-1)});
  const auto r = run_kernels(logits, targets, 1.0f, -100);
  CHECK(std::isfinite(r.row_loss[0].item<double>()));
  CHECK(std::isnan(r.row_loss[1].item<double>()));
  CHECK(std::isnan(r.row_loss[2].item<double>()));
  CHECK(std::isnan(r.loss.item<float>()));
  CHECK(r.grad[0].isfinite().all().item<bool>());
  CHECK(r.grad[1].isnan().all().item<bool>());
}
