// The CUDA residual add and LayerNorm's own source (core/kernels/cuda/residual_norm_kernels.cuh),
// run as CPU threads by simt.h's host emulation: h, u, its bfloat16 copy, the row statistics and
// every gradient against float64 autograd, for row widths that fill one column a thread, part of
// one, several and the widest taken, with each kind of y, u and incoming gradient, and backward
// block counts from one to a block a row. On any machine; tests/kernels/test_residual_norm_cuda.cpp
// runs the compiled kernels on a GPU.
#include <catch2/catch.hpp>

#include "core/kernels/cuda/residual_norm_kernels.cuh"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <array>

using namespace extrap;
using namespace extrap::testing;

namespace {

struct SimtCase {
  int64_t rows, width;
  cuda::RowType y, du;
  bool u_float, u_bf16, du_copy, dh;
  int64_t blocks;
  bool rms = false;   // an RMSNorm (model.norm: rmsnorm)
  bool bias = true;   // with the norm's bias (model.bias)
};

std::string describe(const SimtCase& c) {
  const auto type = [](cuda::RowType t) {
    return t == cuda::RowType::none ? "none" : t == cuda::RowType::float32 ? "float32" : "bfloat16";
  };
  return "rows " + std::to_string(c.rows) + " width " + std::to_string(c.width) + " y " + type(c.y) + " u" +
         (c.u_float ? " float32" : "") + (c.u_bf16 ? " bfloat16" : "") + " du " + type(c.du) +
         (c.du_copy ? " +copy" : "") + (c.dh ? " dh" : "") + " blocks " + std::to_string(c.blocks) +
         (c.rms ? " rmsnorm" : "") + (c.bias ? "" : " no bias");
}

torch::Tensor of_type(const torch::Tensor& t, cuda::RowType type) {
  if (type == cuda::RowType::none) return torch::Tensor();
  return t.to(type == cuda::RowType::bfloat16 ? torch::kBFloat16 : torch::kFloat32).contiguous();
}

const void* pointer(const torch::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

void run_case(const SimtCase& c) {
  INFO(describe(c));
  const int64_t N = c.rows, D = c.width;
  const float eps = 1e-5f;
  // Rows far from zero with a spread of their own: the two-pass variance matters.
  const auto x = (3 + 2 * torch::randn({N, D})).contiguous();
  const auto y = of_type(torch::randn({N, D}), c.y);
  const auto gamma = (1 + 0.5 * torch::randn({D})).contiguous();
  const auto beta = (0.5 * torch::randn({D})).contiguous();
  const auto du = of_type(torch::randn({N, D}), c.du);
  const auto du_copy = c.du_copy ? of_type(torch::randn({N, D}), cuda::RowType::bfloat16) : torch::Tensor();
  const auto dh = c.dh ? torch::randn({N, D}) : torch::Tensor();

  // Outputs poisoned with NaN: every element the kernels should write is checked.
  const auto nan = [&](torch::ScalarType type) { return torch::full({N, D}, NAN, torch::dtype(type)); };
  auto h = c.y != cuda::RowType::none ? nan(torch::kFloat32) : torch::Tensor();
  auto u = c.u_float ? nan(torch::kFloat32) : torch::Tensor();
  auto u_bf16 = c.u_bf16 ? nan(torch::kBFloat16) : torch::Tensor();
  auto mean = torch::full({N}, NAN), rstd = torch::full({N}, NAN);
  cuda::AddLayerNormForward f;
  f.rows = N;
  f.width = D;
  f.eps = eps;
  f.rms = c.rms;
  f.x = x.data_ptr<float>();
  f.y = pointer(y);
  f.y_type = c.y;
  f.gamma = gamma.data_ptr<float>();
  f.beta = c.bias ? beta.data_ptr<float>() : nullptr;
  f.h = h.defined() ? h.data_ptr<float>() : nullptr;
  f.u = u.defined() ? u.data_ptr<float>() : nullptr;
  f.u_bf16 = u_bf16.defined() ? u_bf16.data_ptr() : nullptr;
  f.mean = mean.data_ptr<float>();
  f.rstd = rstd.data_ptr<float>();
  cuda::dispatch_add_layer_norm_forward(f, simt::HostLaunch{});

  // float64 autograd from the definition.
  const auto x64 = x.to(torch::kFloat64).requires_grad_();
  const auto y64 = y.defined() ? y.to(torch::kFloat64).requires_grad_() : torch::Tensor();
  const auto g64 = gamma.to(torch::kFloat64).requires_grad_(), b64 = beta.to(torch::kFloat64).requires_grad_();
  const auto h64 = y.defined() ? x64 + y64 : x64;
  // LayerNorm from LibTorch in float64; RMSNorm from its definition, h / sqrt(mean(h^2) + eps) gamma.
  auto u64 = c.rms ? h64 * (h64.pow(2).mean(-1, true) + eps).rsqrt() * g64
                   : torch::layer_norm(h64, {D}, g64, c.bias ? b64 : torch::Tensor(), eps);
  if (c.rms && c.bias) u64 = u64 + b64;
  auto du_total = torch::zeros({N, D}, torch::kFloat64);
  if (du.defined()) du_total += du.to(torch::kFloat64);
  if (du_copy.defined()) du_total += du_copy.to(torch::kFloat64);
  auto loss = (u64 * du_total).sum();
  if (dh.defined()) loss = loss + (h64 * dh.to(torch::kFloat64)).sum();
  loss.backward();

  if (h.defined()) CHECK(torch::equal(h, x + y.to(torch::kFloat32)));  // one float32 rounding, as x + y
  const auto mean64 = c.rms ? torch::zeros({N}, torch::kFloat64) : h64.detach().mean(-1);
  const auto var64 = c.rms ? h64.detach().pow(2).mean(-1) : h64.detach().var(-1, /*unbiased=*/false);
  CHECK(max_scaled_error(mean, mean64) < 1e-5);
  CHECK(max_relative_error(rstd, (var64 + eps).rsqrt()) < 1e-5);
  if (u.defined()) CHECK(max_scaled_error(u, u64.detach()) < 1e-5);
  if (u_bf16.defined()) {
    if (u.defined()) CHECK(torch::equal(u_bf16, u.to(torch::kBFloat16)));  // u rounded to nearest even
    else CHECK(max_relative_error(u_bf16.to(torch::kFloat32), u64.detach()) < 1.0 / 128);
  }

  auto dx = nan(torch::kFloat32);
  auto dy_bf16 = c.y == cuda::RowType::bfloat16 ? nan(torch::kBFloat16) : torch::Tensor();
  auto partial = torch::full({c.blocks, 2, D}, NAN), dgamma = torch::full({D}, NAN), dbeta = torch::full({D}, NAN);
  cuda::AddLayerNormBackward b;
  b.rows = N;
  b.width = D;
  b.h = h.defined() ? h.data_ptr<float>() : x.data_ptr<float>();
  b.mean = mean.data_ptr<float>();
  b.rstd = rstd.data_ptr<float>();
  b.gamma = gamma.data_ptr<float>();
  b.rms = c.rms;
  b.du = pointer(du);
  b.du_type = c.du;
  b.du_copy = pointer(du_copy);
  b.dh = dh.defined() ? dh.data_ptr<float>() : nullptr;
  b.dx = dx.data_ptr<float>();
  b.dy_bf16 = dy_bf16.defined() ? dy_bf16.data_ptr() : nullptr;
  b.blocks = c.blocks;
  b.partial = partial.data_ptr<float>();
  b.dgamma = dgamma.data_ptr<float>();
  b.dbeta = c.bias ? dbeta.data_ptr<float>() : nullptr;
  cuda::dispatch_add_layer_norm_backward(b, simt::HostLaunch{});

  if (!du.defined() && !du_copy.defined() && !dh.defined()) {  // nothing read the outputs
    CHECK(torch::equal(dx, torch::zeros_like(dx)));
    CHECK(torch::equal(dgamma, torch::zeros_like(dgamma)));
    return;
  }
  CHECK(max_scaled_error(dx, x64.grad()) < 1e-5);
  if (dy_bf16.defined()) CHECK(torch::equal(dy_bf16, dx.to(torch::kBFloat16)));
  if (du.defined() || du_copy.defined()) {
    CHECK(max_scaled_error(dgamma, g64.grad()) < 1e-5);
    if (c.bias) CHECK(max_scaled_error(dbeta, b64.grad()) < 1e-5);
    else CHECK(torch::isnan(dbeta).all().item<bool>());  // no bias: nothing written
  }
}

}  // namespace

TEST_CASE("CUDA add_layer_norm's source on CPU threads: every output and gradient equals float64's", "[simt]") {
  torch::manual_seed(5);
  using T = cuda::RowType;
  // Widths: part of one column a thread (1, 37), exactly one (128), one and a bit (129), the
  // quick and GPT-2 shapes (512, 768: 4 and 8 columns, 6 of them filled), the widest (4096).
  for (const int64_t width : {1, 37, 128, 129, 512, 768, 4096}) {
    const int64_t rows = width >= 768 ? 3 : 7;
    run_case({rows, width, T::float32, T::float32, true, false, false, true, rows});
    run_case({rows, width, T::bfloat16, T::bfloat16, false, true, false, true, 2});
    run_case({rows, width, T::none, T::float32, true, true, true, false, 1});
    // RMSNorm (Llama's: no bias), and with a bias; a LayerNorm without its bias (MPT's).
    run_case({rows, width, T::float32, T::float32, true, false, false, true, rows, true, false});
    run_case({rows, width, T::bfloat16, T::bfloat16, false, true, false, true, 2, true, true});
    run_case({rows, width, T::none, T::float32, true, true, true, false, 1, false, false});
  }
  // Each kind of y, u and gradient at one width; the backward's blocks from 1 to one a row, and
  // h's gradient present or not, in turn.
  int64_t turn = 0;
  for (const T y : {T::none, T::float32, T::bfloat16})
    for (const int u_kind : {0, 1, 2})
      for (const T du : {T::none, T::float32, T::bfloat16})
        for (const bool copy : {false, true}) {
          const bool u_float = u_kind != 1, u_bf16 = u_kind != 0;
          if (du == T::bfloat16 && u_float) continue;  // u's gradient has u's dtype
          if (du == T::float32 && !u_float) continue;
          if (copy && !(u_float && u_bf16)) continue;  // a copy's gradient needs the copy
          const int64_t blocks = std::array<int64_t, 3>{1, 3, 5}[size_t(turn++ % 3)];
          run_case({5, 200, y, du, u_float, u_bf16, copy, y != T::none && turn % 2 == 0, blocks});
        }
}

TEST_CASE("CUDA add_layer_norm's dispatch refuses widths and block counts it does not take, by value", "[simt]") {
  cuda::AddLayerNormForward f;
  f.rows = 1;
  f.width = cuda::kAddLayerNormMaxWidth + 1;
  CHECK_THROWS_WITH(cuda::dispatch_add_layer_norm_forward(f, simt::HostLaunch{}),
                    Catch::Matchers::Contains("rows of 4097 values (1 to 4096)"));
  cuda::AddLayerNormBackward b;
  b.rows = 4;
  b.width = 8;
  b.blocks = 5;
  CHECK_THROWS_WITH(cuda::dispatch_add_layer_norm_backward(b, simt::HostLaunch{}),
                    Catch::Matchers::Contains("5 backward blocks for 4 rows"));
}

namespace {

// A kernel whose barrier only the first warp reaches: a hang on a GPU, an error here.
EXTRAP_SIMT_KERNEL void barrier_in_a_branch(int* reached) {
  if (simt::thread_index() < 32) {
    simt::sync_block();
    ++reached[simt::thread_index()];
  }
}

}  // namespace

TEST_CASE("the SIMT host emulation: shuffles exchange lanes, barriers order blocks, a missed barrier is an error", "[simt]") {
  // Lane l gets lane l ^ m's value, for every mask of a butterfly.
  std::vector<float> got(64 * 5);
  simt::launch(1, 64, [&] {
    const int t = simt::thread_index();
    for (int m = 1, k = 0; m < 32; m <<= 1, ++k) got[size_t(t * 5 + k)] = simt::shuffle_xor(float(t), m);
  });
  for (int t = 0; t < 64; ++t)
    for (int m = 1, k = 0; m < 32; m <<= 1, ++k) CHECK(got[size_t(t * 5 + k)] == float(t ^ m));
  // A value written before a barrier is seen by every thread after it, in each block.
  std::vector<int> seen(3 * 96, -1);
  simt::launch(3, 96, [&] {
    EXTRAP_SIMT_SHARED int shared_value;
    if (simt::thread_index() == 95) shared_value = 1000 + simt::block_index();
    simt::sync_block();
    seen[size_t(simt::block_index() * 96 + simt::thread_index())] = shared_value;
    simt::sync_block();
  });
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 96; ++t) CHECK(seen[size_t(b * 96 + t)] == 1000 + b);
  // A barrier that the second warp never reaches.
  const int kept = simt::host::barrier_seconds;
  simt::host::barrier_seconds = 1;
  std::vector<int> reached(64, 0);
  CHECK_THROWS_WITH(simt::launch(1, 64, [&] { barrier_in_a_branch(reached.data()); }),
                    Catch::Matchers::Contains("never reached it"));
  simt::host::barrier_seconds = kept;
  CHECK_THROWS_WITH(simt::launch(1, 48, [] {}), Catch::Matchers::Contains("1 blocks of 48 threads"));
}
