// The bfloat16 products of the CPU attention kernel (core/kernels/bf16_gemm.h) against a float64 product
// of the same bfloat16 values: packing from float32 (rounded to nearest even, as LibTorch's
// casts) and from bfloat16, either way round; sizes that fill, split and overrun the 8 x 32
// tiles and the 16-column packing; odd depths; prefixes of a packed operand; alpha and
// accumulation. The kernels' bfloat16 stores (cpu_vector_math.h's narrow() and narrow_rows())
// bit for bit against LibTorch's cast, subnormals, ties and infinities included (NaN stays NaN).
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/cpu_vector_math.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include <limits>

using namespace extrap;

namespace {

// x (rows x cols), float32, stored as `stored` (transposed or not) in a buffer with row stride
// ld > its width, so that the packers must use ld.
struct Stored {
  torch::Tensor buffer;  // float32 or bfloat16
  int64_t ld;
};

Stored store(const torch::Tensor& x, bool transposed, torch::ScalarType dtype) {
  const auto laid = transposed ? x.t() : x;
  const int64_t ld = laid.size(1) + 3;
  auto buffer = torch::full({laid.size(0), ld}, 1e30f, torch::kFloat32);  // padding must never be read
  buffer.narrow(1, 0, laid.size(1)).copy_(laid);
  return {buffer.to(dtype), ld};
}

template <typename T>
const T* data_of(const torch::Tensor& t);
template <>
const float* data_of<float>(const torch::Tensor& t) { return t.data_ptr<float>(); }
template <>
const c10::BFloat16* data_of<c10::BFloat16>(const torch::Tensor& t) {
  return reinterpret_cast<const c10::BFloat16*>(t.data_ptr<at::BFloat16>());
}

}  // namespace

TEST_CASE("bf16 products equal a float64 product of the same bfloat16 values", "[attention][fused_cpu][bf16][avx512_bf16]") {
  if (!bf16_gemm::available()) {
    testing::skip_test("this CPU has no AVX512_BF16: the bfloat16 attention products are not used here");
    return;
  }
  torch::manual_seed(21);
  for (int64_t m : {1, 7, 8, 9, 64}) {
    for (int64_t n : {1, 16, 17, 33, 64}) {
      for (int64_t depth : {1, 2, 31, 32, 64}) {
        for (bool a_transposed : {false, true}) {
          for (bool b_transposed : {false, true}) {
            for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
              INFO(m << " x " << depth << " by " << depth << " x " << n << (a_transposed ? ", A^T" : "")
                     << (b_transposed ? ", B^T" : "") << (dtype == torch::kFloat32 ? ", float32" : ", bfloat16")
                     << " sources");
              const auto a = torch::randn({m, depth}), b = torch::randn({depth, n});
              const Stored sa = store(a, a_transposed, dtype), sb = store(b, b_transposed, dtype);
              bf16_gemm::PackedA pa;
              bf16_gemm::PackedB pb;
              if (dtype == torch::kFloat32) {
                bf16_gemm::pack_a(data_of<float>(sa.buffer), sa.ld, a_transposed, m, depth, pa);
                bf16_gemm::pack_b(data_of<float>(sb.buffer), sb.ld, b_transposed, depth, n, pb);
              } else {
                bf16_gemm::pack_a(data_of<c10::BFloat16>(sa.buffer), sa.ld, a_transposed, m, depth, pa);
                bf16_gemm::pack_b(data_of<c10::BFloat16>(sb.buffer), sb.ld, b_transposed, depth, n, pb);
              }
              const auto a64 = a.to(torch::kBFloat16).to(torch::kFloat64), b64 = b.to(torch::kBFloat16).to(torch::kFloat64);
              const auto prior = torch::randn({m, n});
              for (bool accumulate : {false, true}) {
                const int64_t ldc = n + 5;
                auto c = torch::full({m, ldc}, 7.0f);
                c.narrow(1, 0, n).copy_(prior);
                bf16_gemm::multiply(pa, pb, m, n, 0.5f, c.data_ptr<float>(), ldc, accumulate);
                auto expected = 0.5 * a64.matmul(b64);
                if (accumulate) expected += prior.to(torch::kFloat64);
                // float32 accumulation of depth products: a few ulps of sum |a| |b|.
                const double bound = 1e-6 * double(depth + 2) * (a64.abs().matmul(b64.abs()).max().item<double>() + 1);
                REQUIRE((c.narrow(1, 0, n).to(torch::kFloat64) - expected).abs().max().item<double>() < bound);
                REQUIRE(torch::all(c.narrow(1, n, ldc - n) == 7.0f).item<bool>());  // nothing past n written
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("bf16 products of a prefix: the first rows and columns of packed operands", "[attention][fused_cpu][bf16][avx512_bf16]") {
  if (!bf16_gemm::available()) {
    testing::skip_test("this CPU has no AVX512_BF16: the bfloat16 attention products are not used here");
    return;
  }
  torch::manual_seed(22);
  // As the attention uses them: B packed once for all T keys, A packed per block with the
  // block's depth. An odd depth's last pair holds B's next row, which must not reach C even
  // when it is NaN or inf (0 x inf is NaN): that row is poisoned here.
  const int64_t T = 70, D = 16;
  const auto keys = torch::randn({T, D}).to(torch::kBFloat16).to(torch::kFloat32);
  for (int64_t depth : {1, 2, 33, 69, 70}) {
    for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      INFO("depth " << depth << ", row " << depth << " of B " << poison);
      auto packed_keys = keys.clone();
      if (depth < T) packed_keys[depth].fill_(poison);
      bf16_gemm::PackedB pb;
      bf16_gemm::pack_b(packed_keys.data_ptr<float>(), D, false, T, D, pb);
      const auto a = torch::randn({5, depth}).to(torch::kBFloat16).to(torch::kFloat32).contiguous();
      bf16_gemm::PackedA pa;
      bf16_gemm::pack_a(a.data_ptr<float>(), depth, false, 5, depth, pa);
      auto c = torch::zeros({5, D});
      bf16_gemm::multiply(pa, pb, 5, D, 1.0f, c.data_ptr<float>(), D, false);
      const auto expected = a.to(torch::kFloat64).matmul(keys.narrow(0, 0, depth).to(torch::kFloat64));
      REQUIRE((c.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-4);
    }
  }
  // Fewer columns than packed, fewer rows than packed.
  const auto a = torch::randn({9, D}).to(torch::kBFloat16).to(torch::kFloat32).contiguous();
  const auto b = torch::randn({D, 40}).to(torch::kBFloat16).to(torch::kFloat32).contiguous();
  bf16_gemm::PackedA pa;
  bf16_gemm::PackedB wide;
  bf16_gemm::pack_a(a.data_ptr<float>(), D, false, 9, D, pa);
  bf16_gemm::pack_b(b.data_ptr<float>(), 40, false, D, 40, wide);
  auto c = torch::zeros({3, 21});
  bf16_gemm::multiply(pa, wide, 3, 21, 1.0f, c.data_ptr<float>(), 21, false);
  const auto expected = a.narrow(0, 0, 3).to(torch::kFloat64).matmul(b.narrow(1, 0, 21).to(torch::kFloat64));
  REQUIRE((c.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-4);
}

TEST_CASE("EXTRAP_BF16_ATTENTION_KERNEL: 0 switches the bf16 products off, 1 on, anything else is refused by value", "[attention][fused_cpu][bf16][avx512_bf16]") {
  if (!bf16_gemm::supported()) {
    testing::skip_test("this CPU has no AVX512_BF16: the switch has nothing to switch");
    return;
  }
  // The CLI, a fresh process, reads the variable (set_enabled() in this one would override it).
  testing::TempDir d("bf16-switch");
  testing::require_environment_switch(d, "EXTRAP_BF16_ATTENTION_KERNEL", testing::one_step_bench({"--set", "train.precision=bf16"}),
                                      "off", "EXTRAP_BF16_ATTENTION_KERNEL=off: expected 0");
}

namespace {

// float32 values that exercise the rounding: random magnitudes from subnormal to huge, ties
// to even (x.5 ulp of bfloat16 with even and odd last bits), values that round up to infinity,
// both infinities and NaN.
torch::Tensor awkward_floats(int64_t count) {
  auto x = torch::randn({count}) * torch::pow(10.0, torch::randint(-44, 38, {count}).to(torch::kFloat32));
  const float specials[] = {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1e-40f, -3e-39f,
                            std::numeric_limits<float>::denorm_min(), 3.4e38f, -3.4e38f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials) && int64_t(i) < count; ++i) x[int64_t(i) * 3 % count] = specials[i];
  return x;
}

// got (bfloat16) is x (float32) cast by LibTorch, bit for bit, except that a NaN need only stay
// a NaN: LibTorch's own casts differ there (c10::BFloat16 gives 0x7fc0, its vectorised cast 0xffff).
bool same_as_cast(const torch::Tensor& got, const torch::Tensor& x) {
  const auto expected = x.to(torch::kBFloat16), nan = x.isnan();
  const auto differ = (got.view(torch::kInt16) != expected.view(torch::kInt16)) & ~nan;
  UNSCOPED_INFO("bits differ at " << differ.nonzero().numel() << " values; NaN lost at "
                                 << (nan & ~got.isnan()).nonzero().numel());
  return !differ.any().item<bool>() && torch::equal(got.isnan(), nan);
}

}  // namespace

TEST_CASE("bf16 stores: narrow() and narrow_rows() round as LibTorch's cast, bit for bit (NaN stays NaN)", "[attention][fused_cpu][bf16]") {
  torch::manual_seed(5);
  for (int64_t n : {1, 15, 16, 17, 64, 257}) {
    INFO("narrow() of " << n << " values");
    const auto x = awkward_floats(n);
    auto got = torch::empty({n}, torch::kBFloat16);
    narrow(x.data_ptr<float>(), reinterpret_cast<c10::BFloat16*>(got.data_ptr<at::BFloat16>()), n);
    REQUIRE(same_as_cast(got, x));
  }
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t n : {1, 16, 33}) {
      INFO("narrow_rows() of " << rows << " rows of " << n);
      const auto x = awkward_floats(rows * n).view({rows, n});
      const int64_t stride = n + 5;  // destination rows further apart than their width
      auto dst = torch::full({rows, stride}, 7.0f, torch::kBFloat16);
      narrow_rows(x.data_ptr<float>(), rows, n, reinterpret_cast<c10::BFloat16*>(dst.data_ptr<at::BFloat16>()), stride);
      REQUIRE(same_as_cast(dst.narrow(1, 0, n), x));
      REQUIRE(torch::equal(dst.narrow(1, n, stride - n), torch::full({rows, stride - n}, 7.0f, torch::kBFloat16)));
    }
  }
}
