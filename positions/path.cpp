// `path`: PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating
// Householder Transformations"; fla-org/flash-linear-attention, fla/layers/path_attn.py). Each
// position t of a layer carries a reflection H_t = I - beta_t w_t w_t^T made from the layer's
// normalised input x_t, and the logit of query i and key j is q_i^T (H_i ... H_{j+1}) k_j / sqrt(d)
// (core/attention/householder.h): position information that depends on the data in between.
// As the reference (MHA setting), per layer:
//     w_t    = l2norm_per_head(silu(causal depthwise conv, kernel 3, of  W_up W_down x_t)),
//              W_down: d_model -> 32, W_up: 32 -> heads x d_head, no biases; l2norm(v) =
//              v / sqrt(|v|^2 + 1e-6), so a zero input gives w = 0 (every H_t = I, plain NoPE);
//     beta_t = 2 sigmoid(W_beta x_t + b_beta), one per head, in (0, 2);
//     optionally FoX's forget gate (the reference's use_forget_gate): F_i - F_j added, F the
//     cumulative sum of logsigmoid(W_g x_t + b_g).
// Every weight starts N(0, init_std = 0.02), every bias 0, as the reference model's _init_weights.
// Causal only. The reference attention path trains it; long evaluations compute the same scores a
// block of query rows at a time; the fused kernels refuse it by name. Decoding with a KV cache
// keeps each cached key's projections, so the reflections of the whole sequence are rebuilt.
#include "positions/position.h"

namespace extrap {
namespace {

struct PathOptions {
  int64_t rank = 32;
  int64_t conv_size = 3;
  bool forget_gate = false;
  double init_std = 0.02;
  void read(const OptionReader& r) {
    r.read("rank", rank, "width of the low-rank projection d_model -> rank -> heads x d_head that gives w; "
                         "0: one full-rank projection");
    r.read("conv_size", conv_size, "kernel of the causal depthwise convolution (then SiLU) over w's projection; "
                                   "0: none");
    r.read("forget_gate", forget_gate, "add FoX's forget gates, F_i - F_j with F the summed logsigmoid gates (PaTH-FoX)");
    r.read("init_std", init_std, "standard deviation of every initial weight (biases start at 0)");
    if (!r.decoding()) return;
    r.at_least("rank", rank, 0);
    r.at_least("conv_size", conv_size, 0);
    r.at_least("init_std", init_std, 0.0);
  }
};

class Path : public PositionMethod {
 public:
  Path(const PositionContext& context, PathOptions options)
      : heads_(context.num_heads), d_head_(context.d_head), d_model_(context.d_model), options_(options) {
    const int64_t layers = context.num_layers, width = heads_ * d_head_;
    const auto normal = [&](std::vector<int64_t> shape) { return torch::randn(shape) * options.init_std; };
    if (options.rank > 0) {
      w_down_ = register_parameter("w_down", normal({layers, options.rank, d_model_}));
      w_up_ = register_parameter("w_up", normal({layers, width, options.rank}));
    } else {
      w_up_ = register_parameter("w_proj", normal({layers, width, d_model_}));
    }
    if (options.conv_size > 0) conv_ = register_parameter("w_conv", normal({layers, width, options.conv_size}));
    beta_weight_ = register_parameter("beta_weight", normal({layers, heads_, d_model_}));
    beta_bias_ = register_parameter("beta_bias", torch::zeros({layers, heads_}));
    if (options.forget_gate) {
      gate_weight_ = register_parameter("gate_weight", normal({layers, heads_, d_model_}));
      gate_bias_ = register_parameter("gate_bias", torch::zeros({layers, heads_}));
    }
  }

  AttentionBias bias(const LayerInput& at) override {
    TORCH_CHECK(at.layer < beta_weight_.size(0), "path: layer ", at.layer, " of a method built for ",
                beta_weight_.size(0), " layers");
    const int64_t l = at.layer, width = heads_ * d_head_;
    // Without a layer input (inspection of a method on its own): a zero input, where every
    // reflection is the identity.
    auto x = at.input.defined() ? at.input.to(torch::kFloat32)
                                : torch::zeros({1, at.length(), d_model_}, beta_weight_.options().requires_grad(false));
    // Each token's projections (B, T, width + H [+ H]); with a KV cache, those of every cached key before them.
    auto w_in = options_.rank > 0 ? torch::linear(torch::linear(x, w_down_[l]), w_up_[l]) : torch::linear(x, w_up_[l]);
    std::vector<torch::Tensor> parts = {w_in, torch::linear(x, beta_weight_[l], beta_bias_[l])};
    if (options_.forget_gate) parts.push_back(torch::linear(x, gate_weight_[l], gate_bias_[l]));
    auto raw = torch::cat(parts, -1);
    if (at.state) {
      if (at.state->defined()) raw = torch::cat({*at.state, raw}, 1);
      *at.state = raw;
      TORCH_CHECK(raw.size(1) == at.key_length(), "path: the cached projections cover ", raw.size(1),
                  " keys, the layer has ", at.key_length());
    }
    const int64_t B = raw.size(0), T = raw.size(1);
    auto w = raw.narrow(-1, 0, width);
    if (options_.conv_size > 0) {  // causal: position t sees t - size + 1 .. t, zeros before the start
      const int64_t size = options_.conv_size;
      auto channels = torch::constant_pad_nd(w.transpose(1, 2), {size - 1, 0});  // (B, width, T + size - 1)
      w = torch::silu(torch::conv1d(channels, conv_[l].unsqueeze(1), torch::Tensor(), /*stride=*/std::vector<int64_t>{1},
                                    /*padding=*/std::vector<int64_t>{0}, /*dilation=*/std::vector<int64_t>{1}, width)).transpose(1, 2);
    }
    w = w.reshape({B, T, heads_, d_head_}).permute({0, 2, 1, 3});  // (B, H, T, d)
    w = w * torch::rsqrt(w.pow(2).sum(-1, /*keepdim=*/true) + 1e-6);
    auto beta = 2 * torch::sigmoid(raw.narrow(-1, width, heads_)).transpose(1, 2);  // (B, H, T)
    torch::Tensor F;
    if (options_.forget_gate)
      F = torch::log_sigmoid(raw.narrow(-1, width + heads_, heads_)).cumsum(1).transpose(1, 2);
    return AttentionBias::householder(w, beta, F);
  }

 private:
  int64_t heads_, d_head_, d_model_;
  PathOptions options_;
  torch::Tensor w_down_, w_up_, conv_;     // (layers, rank, D), (layers, H d, rank or D), (layers, H d, size)
  torch::Tensor beta_weight_, beta_bias_;  // (layers, H, D), (layers, H)
  torch::Tensor gate_weight_, gate_bias_;  // (layers, H, D), (layers, H): forget_gate only
};

PositionInfo make_path_info() {
  PositionInfo info;
  info.name = "path";
  info.description = "PaTH: logits q_i^T H_i ... H_{j+1} k_j, Householder reflections from the layer input "
                     "(Yang et al., 2025)";
  info.hooks = kBias;
  info.modes = kCausal;
  info.mode_reason = "the reflections accumulate from each key forward to the query";
  // What backward keeps beyond the scores and the probabilities: the tiles, the rows joined from
  // them and their padded copies (about 3 score-sized tensors), and the scans' reflected rows,
  // 3 C (B, H, T, d) tensors with C ~ sqrt(T) (one more score-sized tensor at the lengths trained).
  info.training_scores = 4;
  info.tensors =
      "position.w_down (layers, rank, D), position.w_up (layers, H d_head, rank) [rank 0: position.w_proj (layers, "
      "H d_head, D)], position.w_conv (layers, H d_head, conv_size), position.beta_weight (layers, H, D), "
      "position.beta_bias (layers, H) [forget_gate: position.gate_weight (layers, H, D), position.gate_bias (layers, "
      "H)]: in layer l, w_t = l2norm per head (eps 1e-6 inside the root) of silu(causal depthwise conv of w_up w_down "
      "x_t), beta_t = 2 sigmoid(beta_weight . x_t + beta_bias), logit(i, j) = q_i^T (H_i ... H_{j+1}) k_j / "
      "sqrt(d_head) with H_t = I - beta_t w_t w_t^T, plus F_i - F_j with F the cumulative logsigmoid gates";
  info.options = document_options<PathOptions>();
  info.factory = factory_for<Path, PathOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(path, extrap::make_path_info);
