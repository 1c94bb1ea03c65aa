#include "core/kernels/fused_cpu_loss.h"

#include "core/base/environment.h"
#include "core/base/late_registration.h"
#include "core/kernels/cpu_vector_math.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>


#include <cmath>
#include <vector>

namespace extrap {

namespace {

constexpr int64_t kRowsPerTask = 64;

EXTRAP_ISA_KERNEL(float, row_max, (const float* x, int64_t n), (x, n)) {
  float max = x[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 0; j < n; ++j) max = x[j] > max ? x[j] : max;
  return max;
}

// The row's sum of exp(x - shift), shift its maximum, as the count of terms at the maximum
// (each exactly 1) and the float32 sum of the rest: a confident row's sum is 1 plus terms
// below float32's half-ulp at 1, and its loss is their log, so the rest is kept apart from the
// 1s (summing everything in float32 would round the loss to 0). Float32 sums vectorise twice as
// wide as double ones, and keeping the 1s apart makes float32 accurate enough.
struct ExpSum {
  float at_max, rest;
  double total() const { return double(at_max) + double(rest); }
};

EXTRAP_ISA_KERNEL(ExpSum, row_exp_sum, (const float* x, int64_t n, float shift), (x, n, shift)) {
  float at_max = 0, rest = 0;
#pragma omp simd reduction(+ : at_max, rest)
  for (int64_t j = 0; j < n; ++j) {
    const bool top = x[j] >= shift;
    const float e = exp_float(x[j] - shift);
    at_max += top ? 1.0f : 0.0f;
    rest += top ? 0.0f : e;
  }
  return {at_max, rest};
}

// out = scale * exp(x - lse), the softmax of the row times the incoming gradient.
EXTRAP_ISA_KERNEL(void, row_softmax_scaled, (const float* x, int64_t n, float lse, float scale, float* out), (x, n, lse, scale, out)) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = scale * exp_float(x[j] - lse);
}

// Row i of the logits as float32: in place for float32 logits, widened into `buffer` for
// bfloat16 ones.
const float* row_of(const torch::Tensor& logits, int64_t i, std::vector<float>& buffer) {
  const int64_t V = logits.size(1);
  if (logits.scalar_type() == torch::kFloat32) return logits.data_ptr<float>() + i * V;
  buffer.resize(size_t(V));
  widen(logits.data_ptr<at::BFloat16>() + i * V, buffer.data(), V);
  return buffer.data();
}

LateRegistration<CudaCrossEntropy> registered_cross_entropy;

// The rows both CUDA passes read; `lse` (N) float32 on the logits' device.
cuda::CrossEntropyRows cuda_rows(const torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index,
                                 const torch::Tensor& lse) {
  cuda::CrossEntropyRows r;
  r.rows = logits.size(0);
  r.classes = logits.size(1);
  r.logits = logits.data_ptr();
  r.logits_type = logits.scalar_type() == torch::kBFloat16 ? cuda::RowType::bfloat16 : cuda::RowType::float32;
  r.targets = targets.data_ptr<int64_t>();
  r.ignore_index = ignore_index;
  r.lse = lse.data_ptr<float>();
  return r;
}

// The forward on a GPU (core/kernels/cuda/cross_entropy_kernels.cuh): the same arithmetic, the
// rows' losses summed on the device in a fixed order; no wait for the device.
torch::Tensor forward_cuda(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                           const torch::Tensor& targets, int64_t ignore_index) {
  const int64_t N = logits.size(0);
  const auto floats = logits.options().dtype(torch::kFloat32);
  auto lse = torch::empty({N}, floats), loss = torch::empty({}, floats);
  auto row_loss = torch::empty({N}, logits.options().dtype(torch::kFloat64));
  cuda::CrossEntropyForward p;
  static_cast<cuda::CrossEntropyRows&>(p) = cuda_rows(logits, targets, ignore_index, lse);
  p.row_loss = row_loss.data_ptr<double>();
  p.loss = loss.data_ptr<float>();
  const c10::DeviceGuard guard(logits.device());
  registered_cross_entropy.get()->forward(p);
  ctx->save_for_backward({logits, targets, lse});
  ctx->saved_data["ignore_index"] = ignore_index;
  return loss;
}

torch::Tensor backward_cuda(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                            int64_t ignore_index, const torch::Tensor& grad_loss) {
  const auto g = grad_loss.to(logits.device(), torch::kFloat32).contiguous();
  auto grad = torch::empty_like(logits);
  cuda::CrossEntropyBackward p;
  static_cast<cuda::CrossEntropyRows&>(p) = cuda_rows(logits, targets, ignore_index, lse);
  p.grad_loss = g.data_ptr<float>();
  p.grad = grad.data_ptr();
  const c10::DeviceGuard guard(logits.device());
  registered_cross_entropy.get()->backward(p);
  return grad;
}

class CrossEntropySumFunction : public torch::autograd::Function<CrossEntropySumFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t ignore_index) {
    if (logits.is_cuda()) return forward_cuda(ctx, logits, targets, ignore_index);
    const int64_t N = logits.size(0), V = logits.size(1);
    const auto* target = targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < N; ++i)
      TORCH_CHECK(target[i] == ignore_index || (target[i] >= 0 && target[i] < V), "cross-entropy: target ",
                  target[i], " of row ", i, " is outside the ", V, " classes (and is not ignore_index ",
                  ignore_index, ")");
    auto lse = torch::empty({N}, logits.options().dtype(torch::kFloat32));
    std::vector<double> loss(size_t(N), 0.0);
    float* lse_data = lse.data_ptr<float>();
    at::parallel_for(0, N, kRowsPerTask, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer;
      for (int64_t i = begin; i < end; ++i) {
        const float* x = row_of(logits, i, buffer);
        const float max = row_max(x, V);
        const double log_sum = std::log(row_exp_sum(x, V, max).total());
        lse_data[i] = float(double(max) + log_sum);
        // log-sum-exp - x[t] as log(sum) - (x[t] - max): exact where x[t] is the maximum (a
        // confident row's loss near 0 loses nothing to the rounding of the log-sum-exp).
        if (target[i] != ignore_index) loss[size_t(i)] = log_sum - (double(x[target[i]]) - double(max));
      }
    });
    double total = 0;  // in row order, whatever the thread count
    for (double l : loss) total += l;
    ctx->save_for_backward({logits, targets, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    return torch::tensor(float(total), logits.options().dtype(torch::kFloat32));
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &logits = saved[0], &targets = saved[1], &lse = saved[2];
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    if (logits.is_cuda()) return {backward_cuda(logits, targets, lse, ignore_index, grads[0]), torch::Tensor(), torch::Tensor()};
    const int64_t N = logits.size(0), V = logits.size(1);
    const float g = grads[0].item<float>();
    auto grad = torch::empty_like(logits);
    const auto* target = targets.data_ptr<int64_t>();
    const float* lse_data = lse.data_ptr<float>();
    const bool bf16 = logits.scalar_type() == torch::kBFloat16;
    at::parallel_for(0, N, kRowsPerTask, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer, row(static_cast<size_t>(V));
      for (int64_t i = begin; i < end; ++i) {
        float* out = bf16 ? row.data() : grad.data_ptr<float>() + i * V;
        if (target[i] == ignore_index) {
          std::fill(out, out + V, 0.0f);
        } else {
          row_softmax_scaled(row_of(logits, i, buffer), V, lse_data[i], g, out);
          out[target[i]] -= g;
        }
        if (bf16) narrow(out, grad.data_ptr<at::BFloat16>() + i * V, V);
      }
    });
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void register_cuda_cross_entropy(const CudaCrossEntropy& entry) { registered_cross_entropy.set(entry); }

const CudaCrossEntropy* cuda_cross_entropy() { return registered_cross_entropy.get(); }

std::string cross_entropy_sum_unsupported_reason(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.device() != targets.device()) return "logits and targets on different devices";
  if (logits.is_cuda()) {
    if (!cuda_cross_entropy()) return "libextrap_cuda.so has not loaded";
    if (!gpu_new_routes_on()) return "the CUDA loss has not yet run on a GPU (EXTRAP_GPU_NEW_ROUTES=1 takes it)";
  } else if (!logits.device().is_cpu()) {
    return "not CPU or CUDA tensors";
  }
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0))
    return "logits not (N, V) with N targets";
  if (logits.size(1) == 0) return "no classes";
  if (logits.scalar_type() != torch::kFloat32 && logits.scalar_type() != torch::kBFloat16)
    return "logits not float32 or bfloat16";
  if (targets.scalar_type() != torch::kInt64) return "targets not int64";
  return "";
}

torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index) {
  const std::string reason = cross_entropy_sum_unsupported_reason(logits, targets);
  TORCH_CHECK(reason.empty(), "cross_entropy_sum: ", reason);
  return CrossEntropySumFunction::apply(logits.contiguous(), targets.contiguous(), ignore_index);
}

}  // namespace extrap
