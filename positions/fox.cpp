// `fox`: the Forgetting Transformer's forget gate (Lin et al., 2025, "Forgetting Transformer:
// Softmax Attention with a Forget Gate"; zhixuan-lin/forgetting-transformer), also called
// data-dependent ALiBi. Each layer projects its attention input x_t (the normalised input that
// q, k and v come from) to one forget gate per head,
//     log f_t = logsigmoid(w_h . x_t + b_h),
// and score(i, j) gets the sum of log forget gates over (j, i]:
//     bias(i, j) = F_i - F_j,   F_i = sum_{t <= i} log f_t   (in fp32, as the reference)
// Fixed ALiBi is the special case log f_t = -m_h. The bias is described as that one vector F
// per batch and head (AttentionBias::cumulative_sum), never as a T x T tensor. Initialised as
// the reference: w ~ N(0, 0.02), b = 0 (gates near 0.5; x-transformers starts b at 5 instead).
// Depends on the content only, so a window gives the same bias at any offset. Causal only,
// as the reference.
#include "positions/position.h"

namespace extrap {
namespace {

struct FoxOptions {
  double gate_bias_init = 0.0;
  double init_std = 0.02;
  void read(const OptionReader& r) {
    r.read("gate_bias_init", gate_bias_init,
           "initial b of every gate (0 as the reference; larger keeps more of the past at the start)");
    r.read("init_std", init_std, "standard deviation of the initial gate weights w");
    if (!r.decoding()) return;
    r.at_least("init_std", init_std, 0.0);
  }
};

class Fox : public PositionMethod {
 public:
  Fox(const PositionContext& context, FoxOptions options) : d_model_(context.d_model) {
    gate_weight_ = register_parameter(
        "gate_weight",
        torch::randn({context.num_layers, context.num_heads, context.d_model}) * options.init_std);
    gate_bias_ = register_parameter(
        "gate_bias", torch::full({context.num_layers, context.num_heads}, options.gate_bias_init));
  }

  AttentionBias bias(const LayerInput& at) override {
    auto w = gate_weight_[at.layer], b = gate_bias_[at.layer];  // (H, D), (H,)
    // Without a layer input (inspection of a method on its own): a zero input, where every
    // gate is sigmoid(b).
    auto x = at.input.defined() ? at.input
                                : torch::zeros({1, at.length(), d_model_}, w.options().requires_grad(false));
    auto logits = torch::matmul(x.to(torch::kFloat32), w.t().to(torch::kFloat32)) + b;  // (B, T, H)
    auto F = torch::log_sigmoid(logits).cumsum(1).transpose(1, 2);  // (B, H, T)
    if (at.state) {  // decoding with a KV cache: continue the running sum of the cached keys
      if (at.state->defined()) F = torch::cat({*at.state, F + at.state->narrow(2, -1, 1)}, 2);
      *at.state = F;
      TORCH_CHECK(F.size(2) == at.key_length(), "fox: the cached gates cover ", F.size(2),
                  " keys, the layer has ", at.key_length());
    }
    return AttentionBias::cumulative_sum(F);
  }

 private:
  int64_t d_model_;
  torch::Tensor gate_weight_;  // (layers, H, d_model)
  torch::Tensor gate_bias_;    // (layers, H)
};

PositionInfo make_fox_info() {
  PositionInfo info;
  info.name = "fox";
  info.description =
      "Forgetting Transformer gate: bias = sum of per-head log forget gates of the layer input "
      "(Lin et al., 2025)";
  info.hooks = kBias;
  info.modes = kCausal;
  info.mode_reason = "the gates accumulate from each key forward to the query";
  info.tensors =
      "position.gate_weight (layers, H, d_model), position.gate_bias (layers, H): in layer l, "
      "log f_t = logsigmoid(gate_weight[l] . x_t + gate_bias[l]) with x_t the layer's normalised "
      "attention input (ln_attention output), F_i = sum_{t <= i} log f_t, bias(i, j) = F_i - F_j";
  info.options = document_options<FoxOptions>();
  info.factory = factory_for<Fox, FoxOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(fox, extrap::make_fox_info);
