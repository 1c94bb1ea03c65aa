// The fused CUDA attention's LibTorch side: input checks, the mapping from AttentionBias to
// a kernel bias mode, and the autograd function (forward saves q, k, v, o and the row
// log-sum-exp; backward recomputes the probabilities in the kernel).
#include "core/attention/cuda/fused_attention.h"

#include "core/attention/cuda/flash_dispatch.h"
#include "core/attention/cuda/vector_layout.h"
#include "core/base/environment.h"
#include "core/kernels/qkv_heads.h"
#ifdef EXTRAP_CUDNN_FRONTEND
#include "core/attention/cuda/cudnn_attention.h"
#endif

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <vector>

namespace extrap {
namespace {

using fused_detail::KernelBias;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kBitWords = cuda::kMaxLinearHeads / 64;

cuda::ElementType element_type(torch::ScalarType type) {
  return type == torch::kBFloat16 ? cuda::ElementType::BFloat16 : cuda::ElementType::Float16;
}

// "" if q, k, v suit the kernels (before any layout copy), else why not.
std::string input_problem(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  if (!q.defined() || !k.defined() || !v.defined()) return "q, k and v must be defined";
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.sizes() != q.sizes())
    return "q, k and v must all be (B, H, T, D) of one shape, got q " + c10::str(q.sizes()) +
           ", k " + c10::str(k.sizes()) + ", v " + c10::str(v.sizes());
  if (!q.is_cuda() || k.device() != q.device() || v.device() != q.device())
    return "q, k and v must be on one CUDA device, got " + q.device().str() + ", " +
           k.device().str() + ", " + v.device().str();
  const auto type = q.scalar_type();
  if ((type != torch::kBFloat16 && type != torch::kHalf) || k.scalar_type() != type ||
      v.scalar_type() != type)
    return "q, k and v must all be bfloat16 or float16, got " + c10::str(q.scalar_type()) + ", " +
           c10::str(k.scalar_type()) + ", " + c10::str(v.scalar_type());
  const int64_t head_dim = q.size(3);
  if (!cuda::flash_supports(element_type(type), static_cast<int>(head_dim)))
    return "head dimension must be 64 or 128, got " + std::to_string(head_dim);
  if (q.size(0) < 1 || q.size(0) > 65535 || q.size(1) < 1 || q.size(1) > 65535)
    return "batch and heads must be in [1, 65535], got " + c10::str(q.sizes());
  if (q.size(2) < 1 || q.size(2) > (int64_t{1} << 24))
    return "sequence length must be in [1, 2^24], got " + std::to_string(q.size(2));
  return "";
}

cuda::TensorView view_of(const torch::Tensor& t) {
  TORCH_CHECK(vector_layout(t), "fused attention: tensor of sizes ", t.sizes(), " and strides ",
              t.strides(), " is not in the kernels' layout");
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

// Absent slopes: undefined, or the empty placeholder apply_fused passes for them.
torch::Tensor device_slopes(const torch::Tensor& slopes, torch::Device device) {
  if (!slopes.defined() || slopes.numel() == 0) return {};
  return slopes.detach().to(device, torch::kFloat32).contiguous();
}

std::vector<int64_t> bits_of(const cuda::FlashBias& flash) {
  std::vector<int64_t> bits;
  for (int w = 0; w < kBitWords; ++w) bits.push_back(static_cast<int64_t>(flash.look_left_bits[w]));
  for (int w = 0; w < kBitWords; ++w) bits.push_back(static_cast<int64_t>(flash.look_right_bits[w]));
  return bits;
}

KernelBias kernel_bias_from(int64_t mode, const std::vector<int64_t>& bits,
                            torch::Tensor slopes_left, torch::Tensor slopes_right, bool slope_grads,
                            torch::Tensor offsets = {}, int64_t offsets_origin = 0, bool offsets_grad = false) {
  KernelBias kb;
  if (offsets.defined() && offsets.numel() > 0) kb.offsets = std::move(offsets);
  kb.offsets_origin = offsets_origin;
  kb.offsets_grad = offsets_grad;
  kb.flash.mode = static_cast<cuda::BiasMode>(mode);
  for (int w = 0; w < kBitWords; ++w) {
    kb.flash.look_left_bits[w] = static_cast<uint64_t>(bits[w]);
    kb.flash.look_right_bits[w] = static_cast<uint64_t>(bits[kBitWords + w]);
  }
  kb.slopes_left = std::move(slopes_left);
  kb.slopes_right = std::move(slopes_right);
  kb.slope_grads = slope_grads;
  return kb;
}

cuda::FlashFwdParams forward_params(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const KernelBias& bias, bool causal,
                                    torch::Tensor& out, torch::Tensor& lse) {
  TORCH_CHECK(bias.unsupported.empty(), "fused attention: ", bias.unsupported);
  const std::string problem = input_problem(q, k, v);
  TORCH_CHECK(problem.empty(), "fused attention: ", problem);
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() &&
                  out.device() == q.device(),
              "fused attention: out must be like q");
  TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) &&
                  lse.size(2) == q.size(2) && lse.scalar_type() == torch::kFloat32 &&
                  lse.is_contiguous() && lse.device() == q.device(),
              "fused attention: lse must be (B, H, T) fp32 contiguous on q's device");
  cuda::FlashFwdParams p;
  p.q = view_of(q);
  p.k = view_of(k);
  p.v = view_of(v);
  p.o = view_of(out);
  p.lse = lse.data_ptr<float>();
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.seq_len = static_cast<int>(q.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  p.causal = causal;
  p.dtype = element_type(q.scalar_type());
  p.bias = bias.flash;
  for (const auto* slopes : {&bias.slopes_left, &bias.slopes_right}) {
    if (!slopes->defined()) continue;
    TORCH_CHECK(slopes->scalar_type() == torch::kFloat32 && slopes->is_contiguous() &&
                    slopes->device() == q.device() && slopes->numel() == q.size(1),
                "fused attention: slopes must be (H,) fp32 contiguous on q's device");
  }
  p.bias.slopes_left = bias.slopes_left.defined() ? bias.slopes_left.data_ptr<float>() : nullptr;
  p.bias.slopes_right = bias.slopes_right.defined() ? bias.slopes_right.data_ptr<float>() : nullptr;
  if (bias.flash.mode == cuda::BiasMode::Offsets) {
    const auto& table = bias.offsets;
    TORCH_CHECK(table.defined() && table.dim() == 2 && table.size(0) == q.size(1) &&
                    table.scalar_type() == torch::kFloat32 && table.is_contiguous() && table.device() == q.device(),
                "fused attention: the offsets table must be (H, len) fp32 contiguous on q's device");
    p.bias.offsets = table.data_ptr<float>();
    p.bias.offsets_len = static_cast<int>(table.size(1));
    p.bias.offsets_origin = static_cast<int>(bias.offsets_origin);
  }
  return p;
}

// Kernel errors (std::invalid_argument, std::runtime_error) become c10::Error.
template <class Fn>
void run_kernel(const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "fused attention ", what, ": ", e.what());
  }
}

class FusedAttentionFunction : public torch::autograd::Function<FusedAttentionFunction> {
 public:
  // slopes_left/right: the bias's own slope tensors (undefined for None and in-kernel ALiBi),
  // and offsets: the Offsets mode's table (fused_detail::offsets_table), passed so that autograd
  // routes their gradients; mode, bits, slope_grads, offsets_origin, offsets_grad: from the plan.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& slopes_left,
                               const torch::Tensor& slopes_right, const torch::Tensor& offsets, int64_t mode,
                               bool causal, std::vector<int64_t> bits, bool slope_grads, int64_t offsets_origin,
                               bool offsets_grad) {
    const auto qk = in_vector_layout(q), kk = in_vector_layout(k), vk = in_vector_layout(v);
    KernelBias kb = kernel_bias_from(mode, bits, device_slopes(slopes_left, q.device()),
                                     device_slopes(slopes_right, q.device()), slope_grads, offsets.detach(),
                                     offsets_origin, offsets_grad);
    // (B, H, T, D); laid out as (B, T, H, D) with the new GPU paths (not yet run on a GPU).
    auto out = gpu_new_routes_on() ? empty_heads_major(q) : torch::empty(q.sizes(), q.options());
    auto lse = torch::empty({q.size(0), q.size(1), q.size(2)},
                            q.options().dtype(torch::kFloat32));             // (B, H, T)
    fused_detail::forward_into(qk, kk, vk, kb, causal, out, lse);

    ctx->save_for_backward({qk, kk, vk, out, lse, kb.slopes_left, kb.slopes_right, kb.offsets});
    ctx->saved_data["offsets_origin"] = offsets_origin;
    ctx->saved_data["offsets_grad"] = offsets_grad;
    ctx->saved_data["mode"] = mode;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["bits"] = bits;
    ctx->saved_data["slope_grads"] = slope_grads;
    if (slope_grads) {
      // Gradients go back in each slope tensor's own type and device.
      ctx->saved_data["left_type"] = static_cast<int64_t>(slopes_left.scalar_type());
      ctx->saved_data["left_device"] = slopes_left.device().str();
      ctx->saved_data["right_type"] = static_cast<int64_t>(slopes_right.scalar_type());
      ctx->saved_data["right_device"] = slopes_right.device().str();
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const bool slope_grads = ctx->saved_data["slope_grads"].toBool();
    const bool causal = ctx->saved_data["causal"].toBool();
    const bool offsets_grad = ctx->saved_data["offsets_grad"].toBool();
    const KernelBias kb = kernel_bias_from(ctx->saved_data["mode"].toInt(),
                                           ctx->saved_data["bits"].toIntVector(), saved[5],
                                           saved[6], slope_grads, saved[7],
                                           ctx->saved_data["offsets_origin"].toInt(), offsets_grad);
    const auto dout = in_vector_layout(grads[0]);
    // With the new GPU paths, one (B, T, 3, H, D) buffer where q, k and v are its slices.
    auto [dq, dk, dv] = gpu_new_routes_on() ? empty_head_gradients(q, k, v)
                                            : std::array<torch::Tensor, 3>{torch::empty(q.sizes(), q.options()),
                                                                           torch::empty(k.sizes(), k.options()),
                                                                           torch::empty(v.sizes(), v.options())};
    torch::Tensor dslopes_left, dslopes_right;
    if (slope_grads) {
      dslopes_left = torch::zeros({q.size(1)}, q.options().dtype(torch::kFloat32));
      dslopes_right = torch::zeros({q.size(1)}, q.options().dtype(torch::kFloat32));
    }
    torch::Tensor doffsets;
    if (offsets_grad) doffsets = torch::zeros_like(kb.offsets);
    fused_detail::backward_into(q, k, v, out, lse, dout, kb, causal, dq, dk, dv, dslopes_left,
                                dslopes_right, doffsets);
    if (slope_grads) {
      const auto to_input = [&](const torch::Tensor& grad, const char* side) {
        const auto type = static_cast<torch::ScalarType>(
            ctx->saved_data[std::string(side) + "_type"].toInt());
        const torch::Device device(ctx->saved_data[std::string(side) + "_device"].toStringRef());
        return grad.to(device, type);
      };
      dslopes_left = to_input(dslopes_left, "left");
      dslopes_right = to_input(dslopes_right, "right");
    }
    // One entry per forward argument: q, k, v, slopes_left, slopes_right, offsets, mode,
    // causal, bits, slope_grads, offsets_origin, offsets_grad.
    return {dq, dk, dv, dslopes_left, dslopes_right, doffsets, {}, {}, {}, {}, {}, {}};
  }
};

torch::Tensor apply_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const KernelBias& plan, const torch::Tensor& slopes_left,
                          const torch::Tensor& slopes_right, bool causal) {
  const std::string problem = input_problem(q, k, v);
  TORCH_CHECK(problem.empty(), "fused attention: ", problem);
  TORCH_CHECK(plan.unsupported.empty(), "fused attention: ", plan.unsupported);
  // Function::apply records the device of every tensor argument (PyTorch 2.11 fails on an
  // undefined one: "tensor does not have a device"), so absent slopes travel as empty tensors.
  const auto present = [](const torch::Tensor& slopes) {
    return slopes.defined() ? slopes : torch::empty({0}, torch::kFloat32);
  };
  return FusedAttentionFunction::apply(q, k, v, present(slopes_left), present(slopes_right),
                                       present(plan.offsets), static_cast<int64_t>(plan.flash.mode), causal,
                                       bits_of(plan.flash), plan.slope_grads, plan.offsets_origin,
                                       plan.offsets_grad);
}

cuda::BiasMode mode_of(FusedAlibiLayout layout) {
  switch (layout) {
    case FusedAlibiLayout::Causal: return cuda::BiasMode::AlibiCausal;
    case FusedAlibiLayout::Symmetric: return cuda::BiasMode::AlibiSymmetric;
    case FusedAlibiLayout::Nonsymmetric: return cuda::BiasMode::AlibiNonsymmetric;
  }
  return cuda::BiasMode::AlibiCausal;
}

}  // namespace

namespace fused_detail {

KernelBias plan_bias(const AttentionBias& bias, int64_t heads, bool causal, torch::Device device) {
  KernelBias kb;
  switch (bias.kind) {
    case AttentionBias::Kind::None:
      kb.flash.mode = cuda::BiasMode::None;
      return kb;
    case AttentionBias::Kind::Dense:
      if (bias.by_offset) {  // the table itself is made per call (fused_attention)
        kb.flash.mode = cuda::BiasMode::Offsets;
        return kb;
      }
      kb.unsupported = "the kernels take dense biases of the offset j - i alone (T5, KERPLE, Sandwich), not " +
                       bias.describe() + " (FIRE's depends on i); use the reference or efficient backend";
      return kb;
    case AttentionBias::Kind::Cumulative:  // could be taken as two vectors: not written yet
    case AttentionBias::Kind::Contextual:
    case AttentionBias::Kind::ScoreMixing:
    case AttentionBias::Kind::StickBreaking:
    case AttentionBias::Kind::Householder:
      kb.unsupported = "the kernels take slope-described biases only (none or linear), got " +
                       bias.describe() + "; use the reference or efficient backend";
      return kb;
    case AttentionBias::Kind::Linear:
      break;
  }
  if (bias.positions.defined()) {
    kb.unsupported = "the kernels take no sampled positions (position.randomize_max, position.pose_target)";
    return kb;
  }
  if (bias.slopes_left.size(0) != heads) {
    kb.unsupported = "the linear bias has " + std::to_string(bias.slopes_left.size(0)) +
                     " slopes for " + std::to_string(heads) + " heads";
    return kb;
  }
  kb.slope_grads = torch::GradMode::is_enabled() &&
                   (bias.slopes_left.requires_grad() || bias.slopes_right.requires_grad());

  // Direction of each head as the kernel sees it (a causal call hides the right side).
  const auto look_left = bias.look_left.to(torch::kCPU, torch::kBool).contiguous();
  const auto look_right = bias.look_right.to(torch::kCPU, torch::kBool).contiguous();
  const bool* left = look_left.data_ptr<bool>();
  const bool* right = look_right.data_ptr<bool>();
  bool all_left_only = true, all_both = true, halves = heads % 2 == 0;
  for (int64_t h = 0; h < heads; ++h) {
    const bool l = left[h], r = right[h] && !causal;
    all_left_only = all_left_only && l && !r;
    all_both = all_both && l && r;
    halves = halves && (h < heads / 2 ? (l && !r) : (!l && r));
  }
  if (kb.slope_grads || !(all_left_only || all_both || halves)) {
    kb.flash.mode = cuda::BiasMode::Linear;
    if (heads > cuda::kMaxLinearHeads) {
      kb.unsupported = "learned or mixed-direction linear biases support at most " +
                       std::to_string(cuda::kMaxLinearHeads) + " heads, got " +
                       std::to_string(heads);
      return kb;
    }
    for (int64_t h = 0; h < heads; ++h) {
      if (left[h]) kb.flash.look_left_bits[h / 64] |= uint64_t{1} << (h % 64);
      if (right[h]) kb.flash.look_right_bits[h / 64] |= uint64_t{1} << (h % 64);
    }
  } else {
    kb.flash.mode = all_left_only ? cuda::BiasMode::AlibiCausal
                    : all_both    ? cuda::BiasMode::AlibiSymmetric
                                  : cuda::BiasMode::AlibiNonsymmetric;
  }
  kb.slopes_left = device_slopes(bias.slopes_left, device);
  kb.slopes_right = device_slopes(bias.slopes_right, device);
  return kb;
}

KernelBias plan_alibi(FusedAlibiLayout layout, int64_t heads) {
  KernelBias kb;
  kb.flash.mode = mode_of(layout);
  if (layout == FusedAlibiLayout::Nonsymmetric && heads % 2 != 0)
    kb.unsupported = "nonsymmetric ALiBi needs an even number of heads, got " + std::to_string(heads);
  return kb;
}

void forward_into(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const KernelBias& bias, bool causal, torch::Tensor& out, torch::Tensor& lse) {
  const cuda::FlashFwdParams p = forward_params(q, k, v, bias, causal, out, lse);
  const c10::cuda::CUDAGuard guard(q.device());
  run_kernel("forward", [&] {
    cuda::flash_attention_forward(p, at::cuda::getCurrentCUDAStream().stream());
  });
}

void backward_into(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& out, const torch::Tensor& lse, const torch::Tensor& dout,
                   const KernelBias& bias, bool causal, torch::Tensor& dq, torch::Tensor& dk,
                   torch::Tensor& dv, torch::Tensor& dslopes_left, torch::Tensor& dslopes_right,
                   const torch::Tensor& doffsets) {
  torch::Tensor out_arg = out, lse_arg = lse;
  cuda::FlashBwdParams p;
  p.fwd = forward_params(q, k, v, bias, causal, out_arg, lse_arg);
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&dout, &dq, &dk, &dv})
    TORCH_CHECK(t->sizes() == q.sizes() && t->scalar_type() == q.scalar_type() &&
                    t->device() == q.device(),
                "fused attention backward: dout, dq, dk and dv must be like q");
  p.dout = view_of(dout);
  p.dq = view_of(dq);
  p.dk = view_of(dk);
  p.dv = view_of(dv);
  const int batch = p.fwd.batch, heads = p.fwd.heads, seq_len = p.fwd.seq_len;
  const auto workspace_options = q.options().dtype(torch::kFloat32);
  auto delta = torch::empty({cuda::flash_bwd_delta_floats(batch, heads, seq_len)}, workspace_options);
  auto dq_accum = torch::empty(
      {cuda::flash_bwd_dq_accum_floats(batch, heads, seq_len, p.fwd.head_dim)}, workspace_options);
  p.delta = delta.data_ptr<float>();
  p.dq_accum = dq_accum.data_ptr<float>();
  if (bias.offsets_grad) {
    TORCH_CHECK(bias.flash.mode == cuda::BiasMode::Offsets && doffsets.defined() &&
                    doffsets.sizes() == bias.offsets.sizes() && doffsets.scalar_type() == torch::kFloat32 &&
                    doffsets.is_contiguous() && doffsets.device() == q.device(),
                "fused attention backward: the offsets gradient must be fp32 and shaped like the table");
    p.doffsets = doffsets.data_ptr<float>();
  }
  if (bias.slope_grads) {
    TORCH_CHECK(bias.flash.mode == cuda::BiasMode::Linear,
                "fused attention backward: slope gradients need the linear bias mode");
    for (const auto* t : {&dslopes_left, &dslopes_right})
      TORCH_CHECK(t->defined() && t->scalar_type() == torch::kFloat32 && t->is_contiguous() &&
                      t->numel() == heads && t->device() == q.device(),
                  "fused attention backward: slope gradients must be (H,) fp32 on q's device");
    p.dslopes_left = dslopes_left.data_ptr<float>();
    p.dslopes_right = dslopes_right.data_ptr<float>();
  }
  const c10::cuda::CUDAGuard guard(q.device());
  run_kernel("backward", [&] {
    cuda::flash_attention_backward(p, at::cuda::getCurrentCUDAStream().stream());
  });
}

torch::Tensor offsets_table(const AttentionBias& bias, int64_t heads, int64_t length, bool causal,
                            torch::Device device) {
  TORCH_CHECK(bias.kind == AttentionBias::Kind::Dense && bias.by_offset,
              "fused attention: an offsets table needs a dense bias described by offset, got ", bias.describe());
  const int64_t lo = -(length - 1), hi = causal ? 1 : length;  // offsets lo .. hi - 1
  auto table = bias.by_offset(lo, hi);
  TORCH_CHECK(table.dim() == 2 && table.size(0) == heads && table.size(1) == hi - lo,
              "fused attention: the bias's by_offset(", lo, ", ", hi, ") returned ", table.sizes(), ", not (", heads,
              ", ", hi - lo, ")");
  return table.to(device, torch::kFloat32).contiguous();
}

}  // namespace fused_detail

std::string fused_attention_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v, const AttentionBias& bias,
                                               bool causal) {
  std::string problem = input_problem(q, k, v);
  if (!problem.empty()) return problem;
  return fused_detail::plan_bias(bias, q.size(1), causal, q.device()).unsupported;
}

torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const AttentionBias& bias, bool causal) {
  const std::string problem = input_problem(q, k, v);
  TORCH_CHECK(problem.empty(), "fused attention: ", problem);
  KernelBias plan = fused_detail::plan_bias(bias, q.size(1), causal, q.device());
  if (plan.flash.mode == cuda::BiasMode::Offsets && plan.unsupported.empty()) {
    plan.offsets = fused_detail::offsets_table(bias, q.size(1), q.size(2), causal, q.device());
    plan.offsets_origin = q.size(2) - 1;
    plan.offsets_grad = torch::GradMode::is_enabled() && plan.offsets.requires_grad();
  }
  return apply_fused(q, k, v, plan, bias.slopes_left, bias.slopes_right, causal);
}

torch::Tensor fused_attention_alibi(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, FusedAlibiLayout layout, bool causal) {
  const std::string problem = input_problem(q, k, v);
  TORCH_CHECK(problem.empty(), "fused attention: ", problem);
  return apply_fused(q, k, v, fused_detail::plan_alibi(layout, q.size(1)), {}, {}, causal);
}

std::pair<torch::Tensor, torch::Tensor> fused_alibi_geometric_slopes(FusedAlibiLayout layout,
                                                                     int64_t heads,
                                                                     torch::Device device) {
  TORCH_CHECK(device.is_cuda(), "fused_alibi_geometric_slopes: needs a CUDA device, got ", device);
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto left = torch::empty({heads}, options), right = torch::empty({heads}, options);
  const c10::cuda::CUDAGuard guard(device);
  run_kernel("slopes", [&] {
    cuda::flash_geometric_slopes(mode_of(layout), static_cast<int>(heads), left.data_ptr<float>(),
                                 right.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
  });
  return {left, right};
}

namespace {

std::string kernel_shapes() {
  return "fwd_rows=" + cuda::flash_fwd_rows_setting() +
         " bwd_dq_atomic=" + std::to_string(cuda::flash_bwd_atomic_width());
}

// Runs when libextrap_cuda.so loads (core/runtime/cuda_support.h).
// cuDNN's attention where libextrap_cuda.so was built with the frontend (EXTRAP_CUDNN_FRONTEND).
const bool registered_fused_attention = [] {
  CudaAttention entry{};
  entry.unsupported_reason = &fused_attention_unsupported_reason;
  entry.attention = &fused_attention;
  entry.alibi = &fused_attention_alibi;
  entry.kernel_shapes = &kernel_shapes;
#ifdef EXTRAP_CUDNN_FRONTEND
  entry.cudnn_unsupported_reason = &cudnn_unsupported_reason;
  entry.cudnn = &cudnn_attention;
  entry.cudnn_alibi_slopes = &cudnn_alibi_slopes;
  entry.cudnn_description = &cudnn_description;
#endif
  register_cuda_attention(entry);
  return true;
}();

}  // namespace

}  // namespace extrap
