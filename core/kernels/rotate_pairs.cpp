#include "core/kernels/rotate_pairs.h"

#include "core/base/environment.h"
#include "core/runtime/cpu_isa.h"

#include <ATen/Parallel.h>

namespace extrap {
namespace {

// One row: out[first..] = a c - b s, out[second..] = a s + b c over the P pairs (a, b) of x,
// with s = sign * sin (sign -1: the inverse rotation, for the backward); the dimensions past
// the rotated ones copied. Pair p is (p, p + P) for half, (2p, 2p + 1) otherwise.
EXTRAP_ISA_KERNEL(void, rotate_row, (const float* x, const float* c, const float* s, float sign, bool half, int64_t P, int64_t D, float* out), (x, c, s, sign, half, P, D, out)) {
  if (half) {
#pragma omp simd
    for (int64_t p = 0; p < P; ++p) {
      const float a = x[p], b = x[p + P], sn = sign * s[p];
      out[p] = a * c[p] - b * sn;
      out[p + P] = a * sn + b * c[p];
    }
  } else {
#pragma omp simd
    for (int64_t p = 0; p < P; ++p) {
      const float a = x[2 * p], b = x[2 * p + 1], sn = sign * s[p];
      out[2 * p] = a * c[p] - b * sn;
      out[2 * p + 1] = a * sn + b * c[p];
    }
  }
  for (int64_t j = 2 * P; j < D; ++j) out[j] = x[j];
}

// out (B, H, T, D) contiguous from x (B, H, T, D) with a contiguous last dimension.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, int64_t rotated,
                     bool half, float sign) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), P = rotated / 2;
  auto out = torch::empty({B, H, T, D}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2);
  at::parallel_for(0, B * H * T, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r % T, h = (r / T) % H, b = r / (T * H);
      rotate_row(xp + b * sb + h * sh + t * st, cp + t * P, sp + t * P, sign, half, P, D, op + r * D);
    }
  });
  return out;
}

class RotatePairsFunction : public torch::autograd::Function<RotatePairsFunction> {
 public:
  // (The non-tensor arguments first: ctx->needs_input_grad counts the tensor inputs alone.)
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, int64_t rotated, bool half,
                               const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["rotated"] = rotated;
    ctx->saved_data["half"] = half;
    return rotate(x, cos, sin, rotated, half, 1.0f);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto g = grads[0];
    if (g.stride(-1) != 1 || g.scalar_type() != torch::kFloat32) g = g.to(torch::kFloat32).contiguous();
    // The rotation's transpose is the rotation by -angle; the copied dimensions pass through.
    const auto dx = rotate(g, saved[0], saved[1], ctx->saved_data["rotated"].toInt(), ctx->saved_data["half"].toBool(),
                           -1.0f);
    return {torch::Tensor(), torch::Tensor(), dx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_rotation_switched_on() {
  static const bool on = environment_switch("EXTRAP_FUSED_ROTATION", "the rotary rotation as LibTorch runs it",
                                            "the rotation of q and k in one pass each way, the default");
  return on;
}

bool rotate_pairs_fused_takes(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                              int64_t rotated) {
  if (!fused_rotation_switched_on()) return false;
  if (x.dim() != 4 || !x.device().is_cpu() || x.scalar_type() != torch::kFloat32 || x.stride(-1) != 1) return false;
  const int64_t T = x.size(2), P = rotated / 2;
  const auto table = [&](const torch::Tensor& t) {
    return t.dim() == 2 && t.size(0) == T && t.size(1) == P && t.device().is_cpu() &&
           t.scalar_type() == torch::kFloat32 && t.is_contiguous() && !t.requires_grad();
  };
  return rotated % 2 == 0 && rotated <= x.size(3) && table(cos) && table(sin);
}

torch::Tensor rotate_pairs_fused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                 int64_t rotated, bool half) {
  TORCH_CHECK(rotate_pairs_fused_takes(x, cos, sin, rotated), "rotate_pairs_fused: x ", x.sizes(), " (",
              x.scalar_type(), ") with tables ", cos.sizes(), " and ", sin.sizes(), " is not a call it takes");
  return RotatePairsFunction::apply(rotated, half, x, cos, sin);
}

}  // namespace extrap
