#include "core/model/model.h"

#include "core/base/hashing.h"
#include "core/kernels/cpu_linear.h"
#include "core/kernels/gelu_linear.h"
#include "core/kernels/glu_linear.h"
#include "core/kernels/precision.h"
#include "core/kernels/qkv_heads.h"
#include "core/kernels/residual_norm.h"

#include <cmath>
#include <stdexcept>

namespace extrap {

namespace {

// ATen's linear, not the C++ frontend's Linear::forward: for (B, T, D) inputs the frontend
// runs matmul and then adds the bias in a separate pass, where ATen folds B and T into one
// addmm with the bias in the product: the same numbers without a pass of its own for the bias,
// which under bf16 would be LibTorch's bfloat16 broadcast add, slow on the CPU. In float32 on
// the CPU the products run through oneDNN (core/kernels/cpu_linear.h).
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return extrap::linear(x, layer->weight, layer->bias);
}

}  // namespace

SelfAttentionImpl::SelfAttentionImpl(SelfAttentionOptions options_) : options(std::move(options_)) {
  reset();
}

void SelfAttentionImpl::reset() {
  const int64_t D = options.d_model(), H = options.heads(), Dh = options.d_head(), Hkv = options.key_value_heads();
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(D, (H + 2 * Hkv) * Dh).bias(options.bias() || options.qkv_bias())));
  out = register_module("out", torch::nn::Linear(torch::nn::LinearOptions(H * Dh, D).bias(options.bias())));
  if (options.qk_norm()) {
    const bool whole = options.qk_norm_over() == QkNormOver::projection;
    const auto norm = [&](int64_t width) {
      return Norm(NormOptions(width, options.norm(), options.norm_eps(), options.norm_bias(), options.norm_affine()));
    };
    q_norm = register_module("q_norm", norm(whole ? H * Dh : Dh));
    k_norm = register_module("k_norm", norm(whole ? Hkv * Dh : Dh));
  }
  const AttentionConfig& extras = options.extras();
  // gpt-oss draws its sinks from N(0, 0.02), the initialiser of its other weights.
  if (extras.sink) sink = register_parameter("sink", torch::randn({H}) * 0.02);
  if (extras.ssmax) {
    TORCH_CHECK(extras.ssmax_init > 0, "attention.ssmax_init must be resolved (positive) when the model is built");
    ssmax = register_parameter("ssmax", torch::full({H}, extras.ssmax_init));
  }
  if (extras.gate != AttentionGate::none) {
    const int64_t width = extras.gate == AttentionGate::headwise ? H : H * Dh;
    gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(options.d_model(), width).bias(false)));
  }
}

AttentionBias SelfAttentionImpl::with_options(AttentionBias bias, const LayerInput& at, bool causal) const {
  const AttentionConfig& extras = options.extras();
  bias.window = extras.window;
  bias.chunk = extras.chunk;
  bias.softcap = extras.softcap;
  if (sink.defined()) bias.sink = sink;
  if (ssmax.defined()) {  // c[h, i] = s_h ln n_i, n_i the keys row i sees (its masks' count)
    const auto n = bias.visible_keys(options.heads(), at.length(), at.key_length(), causal);
    bias.logit_scale = ssmax.view({-1, 1}) * n.log().to(ssmax.device());
  }
  return bias;
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, PositionMethod& position,
                                         const TokenPositions& positions,
                                         const AttentionOptions& attention_options,
                                         KVCache::Layer* cache, const torch::Tensor& projected) {
  const auto B = x.size(0), T = x.size(1), H = options.heads(), Dh = options.d_head();
  // Views of the projection (core/kernels/qkv_heads.h): their gradients go back into its layout with
  // no copy where the fused attention writes them there, else with one.
  const auto& input = projected.defined() ? projected : x;
  auto projection = linear(qkv, input);
  if (options.clip_qkv() > 0) projection = projection.clamp(-options.clip_qkv(), options.clip_qkv());  // OLMo's, MPT's
  auto [q, k, v] = split_heads(projection, H, options.key_value_heads());  // q (B, H, T, Dh), k, v (B, Hkv, T, Dh)
  if (q_norm && options.qk_norm_over() == QkNormOver::head) {
    // in float32 (as Hugging Face's RMSNorm computes), then back to the projection's dtype
    q = q_norm->forward(q.to(torch::kFloat32)).to(v.scalar_type());
    k = k_norm->forward(k.to(torch::kFloat32)).to(v.scalar_type());
  } else if (q_norm) {  // over all heads' values: (B, H, T, Dh) as (B, T, H Dh), normed, and back
    const auto whole = [&](Norm& norm, const torch::Tensor& t) {
      const int64_t heads = t.size(1);
      const auto rows = t.transpose(1, 2).reshape({B, T, heads * Dh}).to(torch::kFloat32);
      return norm->forward(rows).to(v.scalar_type()).view({B, T, heads, Dh}).transpose(1, 2);
    };
    q = whole(q_norm, q);
    k = whole(k_norm, k);
  }
  auto y = positions.stream_cache > 0 ? attend_streaming(q, k, v, x, position, positions, attention_options)
                                      : attend(q, k, v, x, position, positions, attention_options, cache);
  if (gate) {  // each head's output times sigmoid(x W_g): (B, T, H, 1) head-wise, (B, T, H, Dh) element-wise
    auto g = torch::sigmoid(linear(gate, input)).view({B, T, H, -1});
    y = y.transpose(1, 2) * g.to(y.scalar_type());
    y = y.reshape({B, T, H * Dh});
  } else {
    y = y.transpose(1, 2).reshape({B, T, H * Dh});
  }
  y = linear(out, y);
  if (attention_options.training && options.dropout() > 0) y = torch::dropout(y, options.dropout(), true);
  return y;
}

torch::Tensor SelfAttentionImpl::attend(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                        const torch::Tensor& x, PositionMethod& position,
                                        const TokenPositions& positions,
                                        const AttentionOptions& attention_options, KVCache::Layer* cache,
                                        int64_t last_queries) {
  const auto T = q.size(2);
  LayerInput at{options.layer_index(), positions, x};
  torch::Tensor far_q, far_k;  // Self-Extend: the same q and k rotated at grouped positions
  if (positions.group_size > 0) {
    TORCH_CHECK(!cache, "Self-Extend is not supported with a KV cache");
    far_q = q.clone();
    far_k = k.clone();
    auto unused_k = k.clone(), unused_q = q.clone();
    position.rotate_qk(far_q, unused_k, LayerInput{options.layer_index(), positions.grouped(/*queries=*/true), x});
    position.rotate_qk(unused_q, far_k, LayerInput{options.layer_index(), positions.grouped(/*queries=*/false), x});
  }
  position.rotate_qk(q, k, at);
  if (const double a = options.extras().temperature; a > 0) {  // Llama 4: q at p times 1 + a ln(floor((p + 1) / F) + 1)
    const auto p = positions.values(torch::TensorOptions().dtype(torch::kFloat64));
    const auto factor = 1 + a * torch::log(torch::floor((p + 1) / double(options.extras().temperature_floor)) + 1);
    q = q * factor.to(q.device(), q.scalar_type()).view({1, 1, T, 1});
    if (far_q.defined()) far_q = far_q * factor.to(q.device(), q.scalar_type()).view({1, 1, T, 1});
  }
  if (const double s = options.extras().scale_dim; s > 0) {  // q.k / sqrt(s): q times sqrt(d_head / s)
    const double factor = std::sqrt(double(options.d_head()) / s);
    q = q * factor;
    if (far_q.defined()) far_q = far_q * factor;
  }
  AttentionOptions attn = attention_options;
  const bool last_only = last_queries > 0 && last_queries < T;
  if (last_only) {  // the last rows attend, against every key
    TORCH_CHECK(!cache, "attention of the last queries only: not with a KV cache");
    q = q.narrow(2, T - last_queries, last_queries);
    if (far_q.defined()) far_q = far_q.narrow(2, T - last_queries, last_queries);
    attn.backend = AttentionBackend::Auto;  // fewer queries than keys: the reference path's
  }
  if (cache) {  // the new tokens' keys and values join the cached ones
    if (cache->keys.defined()) {
      k = torch::cat({cache->keys, k}, 2);
      v = torch::cat({cache->values, v}, 2);
    }
    cache->keys = k;
    cache->values = v;
    at.keys = k.size(2);
    at.state = &cache->state;
  }
  attn.dropout = options.attention_dropout();
  AttentionBias bias = with_options(position.bias(at), at, attention_options.causal);
  if (last_only && bias.logit_scale.defined())  // (H, T): the attending rows'
    bias.logit_scale = bias.logit_scale.narrow(1, T - last_queries, last_queries);
  if (far_q.defined()) {
    bias.far_queries = far_q;
    bias.far_keys = far_k;
    bias.near_window = positions.neighbor_window;
  }
  return attention(q, k, v, bias, attn);  // (B, H, T, Dh)
}

// Token t < W (the cache size) attends as in a plain causal pass over the first W tokens.
// Token t >= W attends as the last query of a W-token window made of the sinks (tokens 0 ..
// S - 1) and the last W - S tokens (t - W + S + 1 .. t), at positions 0 .. W - 1: its cache
// at cache slots. The keys and values are the tokens' own, from their hidden states of the
// layer below, each computed when that token was the query: what a KV cache holds. Every
// method (biases, rotations, data-dependent positions) sees only these windows; only the last
// row of each attends (its one query against the window's keys).
torch::Tensor SelfAttentionImpl::attend_streaming(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v, const torch::Tensor& x,
                                                  PositionMethod& position, const TokenPositions& positions,
                                                  const AttentionOptions& attention_options) {
  TORCH_CHECK(attention_options.causal, "StreamingLLM evaluation needs a causal model");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3), D = x.size(2);
  const int64_t W = positions.stream_cache, S = positions.stream_sinks;
  TORCH_CHECK(S >= 0 && S < W, "StreamingLLM: ", S, " sinks in a cache of ", W, " tokens");
  const auto index_options = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  // Copies (index_select), since a method may rotate q and k in place.
  const auto head = torch::arange(std::min(T, W), index_options);
  std::vector<torch::Tensor> parts{attend(q.index_select(2, head), k.index_select(2, head), v.index_select(2, head),
                                          x.index_select(1, head), position, TokenPositions::window(head.size(0)),
                                          attention_options, nullptr)};
  // Windows per pass: about 2^24 gathered inputs (windows x B x W x D for each of q, k, v and x);
  // each window's last query alone attends (B x H x W scores).
  const int64_t per_pass = std::max<int64_t>(1, (int64_t(1) << 24) / (B * W * D));
  const auto sinks = torch::arange(S, index_options).unsqueeze(0);            // (1, S)
  const auto recent = torch::arange(S - W + 1, 1, index_options).unsqueeze(0);  // (1, W - S): t + these
  for (int64_t first = W; first < T; first += per_pass) {
    const int64_t c = std::min(per_pass, T - first);
    const auto t = torch::arange(first, first + c, index_options).unsqueeze(1);  // (c, 1)
    const auto rows = torch::cat({sinks.expand({c, S}), t + recent}, 1).reshape({-1});  // (c W)
    const auto gather = [&](const torch::Tensor& z) {  // (B, heads, T, Dh) -> (B c, heads, W, Dh): k and v
      const int64_t heads = z.size(1);                   // keep their kv_heads, the cache's size
      return z.index_select(2, rows).view({B, heads, c, W, Dh}).permute({0, 2, 1, 3, 4}).reshape({B * c, heads, W, Dh});
    };
    const auto y = attend(gather(q), gather(k), gather(v), x.index_select(1, rows).view({B * c, W, D}),
                          position, TokenPositions::window(W), attention_options, nullptr,
                          /*last_queries=*/1);                                      // (B c, H, 1, Dh)
    parts.push_back(y.select(2, 0).view({B, c, H, Dh}).permute({0, 2, 1, 3}));     // (B, H, c, Dh)
  }
  return torch::cat(parts, 2);
}

torch::Tensor FeedForward::forward(const torch::nn::Linear& in, const torch::nn::Linear& out, const torch::Tensor& x,
                                  bool training) const {
  const auto a = linear(in, x);
  const bool dropout = training && activation_dropout > 0;
  if (kind != FfnKind::mlp) {
    const GluGate gate = kind == FfnKind::swiglu            ? GluGate::silu
                         : activation == Activation::gelu_tanh ? GluGate::gelu_tanh
                                                               : GluGate::gelu;
    if (dropout) return linear(out, torch::dropout(glu_reference(a, gate), activation_dropout, true));
    return glu_linear(a, gate, out->weight, out->bias);
  }
  const auto act = [&](const torch::Tensor& t) {
    return activation == Activation::relu ? torch::relu(t) : torch::gelu(t, "tanh");
  };
  if (dropout) {
    const auto h = activation == Activation::gelu ? torch::gelu(a) : act(a);
    return linear(out, torch::dropout(h, activation_dropout, true));
  }
  return activation == Activation::gelu ? gelu_linear(a, out->weight, out->bias) : linear(out, act(a));
}

BlockImpl::BlockImpl(BlockOptions options_) : options(std::move(options_)) { reset(); }

void BlockImpl::reset() {
  const ModelConfig& m = options.model();
  const int64_t D = m.d_model, F = m.ffn_width();
  ffn = FeedForward{m.ffn, m.activation, m.activation_dropout};
  const bool input_norms = m.sublayer_norms != SublayerNorms::output;
  if (input_norms) ln_attention = register_module("ln_attention", Norm(NormOptions::of(m, D)));
  attention = register_module(
      "attention", SelfAttention(SelfAttentionOptions(D, m.heads)
                                     .kv_heads(m.kv_heads)
                                     .head_dim(m.head_dim)
                                     .bias(m.bias)
                                     .qkv_bias(m.qkv_bias)
                                     .qk_norm(m.qk_norm)
                                     .qk_norm_over(m.qk_norm_over)
                                     .norm_bias(m.norm_biased())
                                     .norm_affine(m.norm_affine)
                                     .clip_qkv(m.clip_qkv)
                                     .norm(m.norm)
                                     .norm_eps(m.norm_eps)
                                     .dropout(m.dropout)
                                     .attention_dropout(m.attention_dropout)
                                     .layer_index(options.layer_index())
                                     .extras(options.extras())));
  if (m.block != BlockKind::parallel_shared && input_norms) ln_ffn = register_module("ln_ffn", Norm(NormOptions::of(m, D)));
  if (m.sublayer_norms != SublayerNorms::input) {
    ln_attention_out = register_module("ln_attention_out", Norm(NormOptions::of(m, D)));
    ln_ffn_out = register_module("ln_ffn_out", Norm(NormOptions::of(m, D)));
  }
  ffn_in = register_module("ffn_in", torch::nn::Linear(torch::nn::LinearOptions(D, ffn.input_width(F)).bias(m.bias)));
  ffn_out = register_module("ffn_out", torch::nn::Linear(torch::nn::LinearOptions(F, D).bias(m.bias)));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, PositionMethod& position,
                                 const TokenPositions& positions,
                                 const AttentionOptions& attention_options,
                                 KVCache::Layer* cache) {
  auto [h, f] = forward_residual(x, {}, position, positions, attention_options, cache);
  return h + f;
}

std::pair<torch::Tensor, torch::Tensor> BlockImpl::forward_residual(const torch::Tensor& base,
                                                                    const torch::Tensor& delta,
                                                                    PositionMethod& position,
                                                                    const TokenPositions& positions,
                                                                    const AttentionOptions& attention_options,
                                                                    KVCache::Layer* cache) {
  if (options.model().sublayer_norms != SublayerNorms::input)
    return normed_outputs(base, delta, position, positions, attention_options, cache);
  return options.model().block == BlockKind::sequential
             ? sequential(base, delta, position, positions, attention_options, cache)
             : parallel(base, delta, position, positions, attention_options, cache);
}

torch::Tensor BlockImpl::feed_forward(const torch::Tensor& x, const AttentionOptions& attention_options) {
  // Without a gradient, rows in chunks of about 16 MiB of hidden activations: a long evaluation
  // window's hidden layer (8k tokens x 2 x 2048 for a Llama-style 100M model: 134 MB) is the
  // largest tensor of its forward. Rows are independent, so the chunks compute the same rows.
  const int64_t D = x.size(-1), rows = D > 0 ? x.numel() / D : 0;
  const int64_t hidden = ffn_in->weight.size(0);
  const int64_t chunk = std::max<int64_t>(256, (int64_t(1) << 22) / std::max<int64_t>(hidden, 1));
  if (!torch::GradMode::is_enabled() && !attention_options.training && rows > chunk) {
    const auto flat = x.reshape({rows, D});
    torch::Tensor out;
    for (int64_t r = 0; r < rows; r += chunk) {
      const int64_t c = std::min(chunk, rows - r);
      const auto part = ffn.forward(ffn_in, ffn_out, flat.narrow(0, r, c), false);
      if (!out.defined()) out = torch::empty({rows, part.size(1)}, part.options());
      out.narrow(0, r, c).copy_(part);
    }
    auto sizes = x.sizes().vec();
    sizes.back() = out.size(1);
    return out.view(sizes);
  }
  auto f = ffn.forward(ffn_in, ffn_out, x, attention_options.training);
  const double dropout = options.model().dropout;
  if (attention_options.training && dropout > 0) f = torch::dropout(f, dropout, true);
  return f;
}

// x = base + delta, h = x + attn(n1(x)), f = ffn(n2(h)): {h, f}.
std::pair<torch::Tensor, torch::Tensor> BlockImpl::sequential(const torch::Tensor& base, const torch::Tensor& delta,
                                                              PositionMethod& position, const TokenPositions& positions,
                                                              const AttentionOptions& attention_options,
                                                              KVCache::Layer* cache) {
  // The feed-forward norm's output goes only to ffn_in: under bf16 autocast it may leave the norm
  // in bfloat16, the cast autocast would make. The attention's input stays float32 (position
  // methods read it), with a bfloat16 copy from the same pass for the q, k, v product.
  const auto ffn_dtype = autocast_bf16(base.device().type()) ? torch::kBFloat16 : torch::kFloat32;
  auto [x, normed, normed_low] = add_layer_norm_with_copy(base, delta, ln_attention->row_norm());
  auto [h, ffn_input] = add_layer_norm(
      x, attention->forward(normed, position, positions, attention_options, cache, normed_low), ln_ffn->row_norm(),
      ffn_dtype);
  return {h, feed_forward(ffn_input, attention_options)};
}

// x = base + delta, h = x + n1'(attn(n1(x))), f = n2'(ffn(n2(h))): {h, f}, with n1 and n2 the
// identity for model.sublayer_norms output. The output norms run in float32 (a bfloat16 branch
// output under autocast widened first), the residual stream's dtype; a branch's dropout comes
// before its output norm.
std::pair<torch::Tensor, torch::Tensor> BlockImpl::normed_outputs(const torch::Tensor& base, const torch::Tensor& delta,
                                                                  PositionMethod& position,
                                                                  const TokenPositions& positions,
                                                                  const AttentionOptions& attention_options,
                                                                  KVCache::Layer* cache) {
  const auto out_norm = [](Norm& norm, const torch::Tensor& y) { return norm->forward(y.to(torch::kFloat32)); };
  torch::Tensor x, a;
  if (ln_attention) {
    torch::Tensor normed, normed_low;
    std::tie(x, normed, normed_low) = add_layer_norm_with_copy(base, delta, ln_attention->row_norm());
    a = attention->forward(normed, position, positions, attention_options, cache, normed_low);
  } else {
    x = delta.defined() ? base + delta : base;
    a = attention->forward(x, position, positions, attention_options, cache);
  }
  const auto h = x + out_norm(ln_attention_out, a);
  torch::Tensor ffn_input = h;
  if (ln_ffn) {
    const auto ffn_dtype = autocast_bf16(base.device().type()) ? torch::kBFloat16 : torch::kFloat32;
    ffn_input = add_layer_norm(h, {}, ln_ffn->row_norm(), ffn_dtype).second;
  }
  return {h, out_norm(ln_ffn_out, feed_forward(ffn_input, attention_options))};
}

// x = base + delta, both branches read x: {x + attn(n1(x)), ffn(n2(x))}, n2 = n1 for parallel_shared.
std::pair<torch::Tensor, torch::Tensor> BlockImpl::parallel(const torch::Tensor& base, const torch::Tensor& delta,
                                                            PositionMethod& position, const TokenPositions& positions,
                                                            const AttentionOptions& attention_options,
                                                            KVCache::Layer* cache) {
  auto [x, normed, normed_low] = add_layer_norm_with_copy(base, delta, ln_attention->row_norm());
  torch::Tensor ffn_input = normed_low.defined() ? normed_low : normed;
  if (ln_ffn) {
    const auto ffn_dtype = autocast_bf16(base.device().type()) ? torch::kBFloat16 : torch::kFloat32;
    ffn_input = add_layer_norm(x, {}, ln_ffn->row_norm(), ffn_dtype).second;
  }
  const auto a = attention->forward(normed, position, positions, attention_options, cache, normed_low);
  return {x + a, feed_forward(ffn_input, attention_options)};
}

namespace {
// One kind, every layer: the position method with the model's attention options.
LayerPlan single_kind(const ModelConfig& config, const std::string& position_name, const YAML::Node& position_options) {
  LayerPlan plan;
  plan.kinds.push_back({"", position_name, position_options, "position", config.attention_options});
  plan.layer_kind.assign(config.layers, 0);
  for (int64_t l = 0; l < config.layers; ++l) plan.layer_index.push_back(l);
  return plan;
}
}  // namespace

TransformerLMImpl::TransformerLMImpl(const ModelConfig& config, int64_t vocab_size,
                                     const std::string& position_name,
                                     const YAML::Node& position_options, const std::string& source)
    : TransformerLMImpl(config, vocab_size, single_kind(config, position_name, position_options), source) {}

TransformerLMImpl::TransformerLMImpl(const ModelConfig& config, int64_t vocab_size, const LayerPlan& plan,
                                     const std::string& source)
    : config_(config), vocab_size_(vocab_size), backend_(config.attention),
      position_name_(plan.kinds.at(0).position_name), plan_(plan) {
  TORCH_CHECK(int64_t(plan.layer_kind.size()) == config.layers && plan.layer_index.size() == plan.layer_kind.size(),
              "the layer plan has ", plan.layer_kind.size(), " layers, the model ", config.layers);
  if (config.adaptive()) {
    adaptive_ = register_module("adaptive", AdaptiveVocabulary(vocab_size, config.d_model, config.adaptive_cutoffs,
                                                               config.adaptive_factor, config.adaptive_dropout));
  } else {
    embedding = register_module("embedding", torch::nn::Embedding(vocab_size, config.d_model));
    // Scaled by sqrt(d_model) in forward(): initialise so that the scaled embedding has unit-ish
    // variance, as fairseq does (normal with std d_model^-0.5). Unscaled (model.scale_embedding
    // false): std 0.02, GPT-2's and Llama's initializer_range.
    const double std = config.scale_embedding ? std::pow(double(config.d_model), -0.5) : 0.02;
    torch::nn::init::normal_(embedding->weight, 0.0, std);
  }
  embedding_dropout = register_module("embedding_dropout", torch::nn::Dropout(config.dropout));

  for (int64_t k = 0; k < int64_t(plan.kinds.size()); ++k) {
    const LayerKind& kind = plan.kinds[k];
    PositionContext context = position_context(config);
    context.num_layers = plan.layers_of(k);
    auto method = PositionRegistry::instance().create(kind.position_name, context,
                                                      OptionReader(kind.position, source, kind.position_key));
    positions_.push_back(register_module(kind.name.empty() ? "position" : "position_" + kind.name, method));
  }

  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < config.layers; ++l) {
    blocks->push_back(Block(BlockOptions(config)
                                .layer_index(plan.layer_index[l])
                                .extras(plan.kinds[plan.layer_kind[l]].attention)));
  }
  if (config.init == InitKind::fairseq) {
    torch::NoGradGuard no_grad;
    const int64_t kv = config.key_value_heads() * config.d_head();
    for (size_t l = 0; l < blocks->size(); ++l) {
      auto& attention = *blocks[l]->as<Block>()->attention;
      for (auto& part : attention.qkv->weight.split_with_sizes({config.heads * config.d_head(), kv, kv}, 0))  // q, k, v
        torch::nn::init::xavier_uniform_(part, 1.0 / std::sqrt(2.0));
      torch::nn::init::xavier_uniform_(attention.out->weight);
      if (attention.out->bias.defined()) attention.out->bias.zero_();
    }
  }
  if (config.embedding_norm)
    embedding_norm = register_module("embedding_norm", Norm(NormOptions::of(config, config.d_model)));
  if (config.final_norm) ln_final = register_module("ln_final", Norm(NormOptions::of(config, config.d_model)));
  if (!config.tie_embeddings)
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(config.d_model, vocab_size).bias(false)));
}

torch::Tensor TransformerLMImpl::forward(const torch::Tensor& tokens, int64_t offset) {
  // Under bf16 autocast the final LayerNorm may write bfloat16: its output goes only to the
  // output projection here.
  const bool low = tokens.device().is_cpu() && cpu_autocast_bf16() && !adaptive_;
  return logits(hidden_as(tokens, offset, low ? torch::kBFloat16 : torch::kFloat32));
}

torch::Tensor TransformerLMImpl::logits(const torch::Tensor& x) {
  if (adaptive_) return adaptive_->log_probs(x);  // (..., V); no softcap (refused with adaptive_cutoffs)
  const auto l = head ? linear(head, x) : extrap::linear(x, embedding->weight, {});  // (..., V)
  const double c = config_.logit_softcap;
  return c > 0 ? torch::tanh(l * (1.0 / c)) * c : l;
}

torch::Tensor TransformerLMImpl::nll(const torch::Tensor& hidden, const torch::Tensor& targets) {
  if (adaptive_) return adaptive_->nll(hidden, targets);
  return torch::nn::functional::cross_entropy(
      logits(hidden).to(torch::kFloat32), targets,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kNone));
}

torch::Tensor TransformerLMImpl::embed(const torch::Tensor& tokens) {
  const auto x = adaptive_ ? adaptive_->embed(tokens) : embedding->forward(tokens);
  const auto scaled = config_.scale_embedding ? x * std::sqrt(double(config_.d_model)) : x;  // (B, T, D)
  return embedding_norm ? embedding_norm->forward(scaled) : scaled;
}

torch::Tensor TransformerLMImpl::final_hidden(const torch::Tensor& x, const torch::Tensor& delta,
                                              torch::ScalarType dtype) {
  if (ln_final) return add_layer_norm(x, delta, ln_final->row_norm(), dtype).second;
  return delta.defined() ? x + delta : x;
}

torch::Tensor TransformerLMImpl::hidden(const torch::Tensor& tokens, int64_t offset) {
  return hidden_as(tokens, offset, torch::kFloat32);
}

torch::Tensor TransformerLMImpl::hidden_as(const torch::Tensor& tokens, int64_t offset, torch::ScalarType dtype) {
  TORCH_CHECK(tokens.dim() == 2, "model input must be (B, T) token ids, got ", tokens.sizes());
  auto x = embed(tokens);  // (B, T, D)
  const int64_t length = tokens.size(1);
  auto positions = TokenPositions::window(length, offset);
  if (const PositionSampling& sampling = position().sampling(); sampling.active() && is_training())
    positions.sampled = sampling.draw(length);
  if (rope_scaling_.kind == RopeScalingKind::self_extend && rope_scaling_.factor > 1) {  // G = 1 changes nothing
    positions.neighbor_window = rope_scaling_.neighbor_window;
    positions.group_size = int64_t(rope_scaling_.factor);
  }
  if (streaming_.active()) {
    TORCH_CHECK(!is_training(), "StreamingLLM is an evaluation: call model->eval()");
    TORCH_CHECK(offset == 0, "StreamingLLM: each window is a stream from its first token (offset 0, got ", offset, ")");
    // An absolute method embeds each token once, at its cache slot when it arrives.
    auto slots = TokenPositions::window(length);
    slots.sampled = torch::arange(length, torch::kLong).clamp_max(streaming_.cache - 1);
    x = position().embed(x, slots);
    positions.stream_sinks = streaming_.sinks;
    positions.stream_cache = streaming_.cache;
  } else {
    x = position().embed(x, positions);  // (a pattern's methods do not embed: check_position_method)
  }
  x = embedding_dropout->forward(x);
  AttentionOptions attention_options;
  attention_options.causal = config_.causal();
  attention_options.training = is_training();
  attention_options.backend = backend_;
  attention_options.efficient_threshold = config_.efficient_threshold;
  // Each block's last residual add is left to the next LayerNorm (core/kernels/residual_norm.h).
  torch::Tensor delta;
  for (size_t l = 0; l < blocks->size(); ++l)
    std::tie(x, delta) = blocks[l]->as<Block>()->forward_residual(x, delta, *positions_[plan_.layer_kind[l]], positions,
                                                                  attention_options);
  return final_hidden(x, delta, dtype);  // (B, T, D)
}

void TransformerLMImpl::set_rope_scaling(const RopeScaling& scaling) {
  bool scaled = false;
  for (auto& method : positions_)
    if (method->set_rope_scaling(scaling)) scaled = true;
  if (!scaled) {
    if (!scaling.active()) return;  // nothing to restore
    std::string names;
    for (const auto& kind : plan_.kinds) names += (names.empty() ? "" : ", ") + kind.position_name;
    throw ConfigError("RoPE scaling " + rope_scaling_name(scaling.kind) + ": position method" +
                      (plan_.kinds.size() > 1 ? "s '" : " '") + names +
                      "' " + (plan_.kinds.size() > 1 ? "have" : "has") + " no rotary angles to scale (rotary and xpos have)");
  }
  rope_scaling_ = scaling;
}

void TransformerLMImpl::set_streaming(const StreamingCache& streaming) {
  if (streaming.active()) {
    if (!config_.causal())
      throw std::invalid_argument("StreamingLLM evaluation needs a causal model; this one is a masked LM");
    if (streaming.sinks < 0 || streaming.sinks >= streaming.cache)
      throw std::invalid_argument("StreamingLLM: " + std::to_string(streaming.sinks) +
                                  " sinks in a cache of " + std::to_string(streaming.cache) +
                                  " tokens (sinks must be at least 0 and fewer than the cache)");
  }
  streaming_ = streaming;
}

torch::Tensor TransformerLMImpl::hidden(const torch::Tensor& tokens, KVCache& cache) {
  TORCH_CHECK(tokens.dim() == 2, "model input must be (B, T) token ids, got ", tokens.sizes());
  TORCH_CHECK(config_.causal(), "a KV cache needs a causal model; this one is a masked LM");
  TORCH_CHECK(!is_training() && !torch::GradMode::is_enabled(),
              "a KV cache is for inference: call model->eval() under torch::NoGradGuard");
  TORCH_CHECK(!rope_scaling_.active(),
              "a KV cache with RoPE scaling is not supported (dynamic NTK would rotate cached "
              "keys with an older base)");
  TORCH_CHECK(!streaming_.active(), "StreamingLLM evaluation and a KV cache: one at a time");
  const int64_t length = tokens.size(1);
  TORCH_CHECK(cache.length + length <= cache.planned, "the KV cache was planned for ",
              cache.planned, " tokens; ", cache.length, " are cached and ", length, " more came");
  if (cache.layers.empty()) cache.layers.resize(blocks->size());
  TORCH_CHECK(cache.layers.size() == blocks->size(), "the KV cache holds ", cache.layers.size(),
              " layers, the model has ", blocks->size());
  auto x = embed(tokens);  // (B, T, D)
  auto positions = TokenPositions::window(length, cache.length);
  positions.centre = (cache.planned - 1) / 2;
  x = position().embed(x, positions);
  AttentionOptions attention_options;
  attention_options.causal = true;
  attention_options.training = false;
  attention_options.backend = backend_;
  attention_options.efficient_threshold = config_.efficient_threshold;
  for (size_t l = 0; l < blocks->size(); ++l)
    x = blocks[l]->as<Block>()->forward(x, *positions_[plan_.layer_kind[l]], positions, attention_options,
                                        &cache.layers[l]);
  cache.length += length;
  return final_hidden(x, {}, torch::kFloat32);  // (B, T, D)
}

int64_t TransformerLMImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

std::string TransformerLMImpl::weights_digest() const {
  ContentHasher hasher;
  const auto add = [&](const std::string& name, const torch::Tensor& tensor) {
    const torch::Tensor values = tensor.detach().to(torch::kCPU).contiguous();
    hasher.add_field(name).add_field(std::string(c10::toString(values.scalar_type())));
    for (const int64_t size : values.sizes()) hasher.add(&size, sizeof size);
    hasher.add(values.data_ptr(), size_t(values.nbytes()));
  };
  for (const auto& p : named_parameters()) add(p.key(), p.value());
  for (const auto& b : named_buffers()) add("buffer " + b.key(), b.value());
  return hex64(hasher.digest());
}

PositionContext position_context(const ModelConfig& config) {
  PositionContext context;
  context.num_layers = config.layers;
  context.num_heads = config.heads;
  context.d_model = config.d_model;
  context.d_head = config.d_head();
  context.causal = config.causal();
  return context;
}

namespace {
// A kind's method exists, supports the plan, and (checked with `build`) decodes its options.
// A pattern's methods act in their own layers only: one that adds to the token embeddings, or
// draws the window's positions (randomize_max, pose_target: one draw for the whole model), is
// refused.
void check_kinds(const Config& config, const LayerPlan& plan, bool build) {
  auto& registry = PositionRegistry::instance();
  const unsigned mode = config.model.causal() ? kCausal : kBidirectional;
  for (int64_t k = 0; k < int64_t(plan.kinds.size()); ++k) {
    const LayerKind& kind = plan.kinds[k];
    const OptionReader at(kind.position, config.source, kind.position_key);
    if (plan.patterned() && !registry.contains(kind.position_name)) {
      std::string known;
      for (const auto& n : registry.names()) known += (known.empty() ? "" : ", ") + n;
      if (kind.position_key == "layers.pattern")  // a pattern entry that names no kind
        OptionReader(config.layers, config.source, "layers")
            .fail("pattern", "'" + kind.name + "' is neither a kind of layers.kinds nor a position method (known: " + known + ")");
      throw ConfigError(config.source + ": key '" + kind.position_key + "': unknown position method '" +
                        kind.position_name + "' (known: " + known + ")");
    }
    const PositionInfo& info = registry.get(kind.position_name);
    if (plan.patterned() && (info.hooks & kEmbed))
      throw ConfigError(config.source + ": " + kind.position_key + ": kind '" + kind.name + "' uses position method '" + kind.position_name +
                        "', which adds to the token embeddings once for the whole model; the methods of a layer pattern act "
                        "in their own layers (rotary, alibi, none, ...)");
    for (const char* key : kSampledPositionKeys)
      if (plan.patterned() && kind.position.IsMap() && kind.position[key] && kind.position[key].Scalar() != "0")
        throw ConfigError(config.source + ": " + kind.position_key + "." + key + ": sampled training positions are drawn "
                          "once for the whole model and are not supported with layers.pattern");
    // Built here when asked, and with a sink, which a method without a softmax refuses.
    if (!(build || kind.attention.sink) || !(info.modes & mode)) continue;
    PositionContext context = position_context(config.model);
    context.num_layers = plan.layers_of(k);
    const auto method = registry.create(kind.position_name, context, at);
    if (kind.attention.sink && method->bias(layer_window(0, 2)).kind == AttentionBias::Kind::StickBreaking)
      throw ConfigError(config.source + ": attention.sink: position method '" + kind.position_name + "'" +
                        (kind.name.empty() ? "" : " (kind '" + kind.name + "')") +
                        " has no softmax for a sink column to join; leave the sink out");
  }
}

// The plan build_model builds: SSMax's initial scale resolved in each kind.
LayerPlan resolved_plan(const Config& config) {
  LayerPlan plan = layer_plan(config);
  for (auto& kind : plan.kinds) {
    AttentionConfig& extras = kind.attention;
    if (extras.ssmax && extras.ssmax_init == 0)  // s ln L = 1: plain softmax for a row that sees L keys
      extras.ssmax_init = 1.0 / std::log(double(std::max<int64_t>(config.train.seq_len, 2)));
  }
  return plan;
}
}  // namespace

void check_position_method(const Config& config) {
  for (const auto& plugin : config.plugins) PositionRegistry::instance().load_plugin(plugin);
  check_kinds(config, layer_plan(config), true);
}

TransformerLM build_model(const Config& config, int64_t vocab_size) {
  for (const auto& plugin : config.plugins) PositionRegistry::instance().load_plugin(plugin);
  const LayerPlan plan = resolved_plan(config);
  check_kinds(config, plan, false);  // the model builds (and so checks) each method
  ModelConfig model = config.model;
  if (model.adaptive() && model.adaptive_cutoffs.back() >= vocab_size)
    throw ConfigError(config.source + ": key 'model.adaptive_cutoffs': the last cutoff, " +
                      std::to_string(model.adaptive_cutoffs.back()) + ", must be below the vocabulary's " +
                      std::to_string(vocab_size) + " tokens");
  model.attention_options = plan.kinds.front().attention;
  return TransformerLM(model, vocab_size, plan, config.source);
}

std::string position_label(const Config& config) {
  const LayerPlan plan = layer_plan(config);
  if (!plan.patterned()) return config.position_name;
  const auto kind_text = [&](int64_t k) {
    const LayerKind& kind = plan.kinds[k];
    std::string text = kind.position_name;
    const std::string options = kind.attention.describe();
    return options.empty() ? text : text + " (" + options + ")";
  };
  std::string out;
  const auto& pattern = config.layer_pattern;
  for (size_t i = 0; i < pattern.size();) {
    size_t j = i;
    while (j < pattern.size() && pattern[j] == pattern[i]) ++j;
    const int64_t k = plan.layer_kind[i];
    out += (out.empty() ? "" : ", ") + kind_text(k) + (j - i > 1 ? " x" + std::to_string(j - i) : "");
    i = j;
  }
  return out;
}

bool has_rotary_angles(const Config& config) {
  for (const auto& plugin : config.plugins) PositionRegistry::instance().load_plugin(plugin);
  for (const auto& kind : layer_plan(config).kinds)
    if (PositionRegistry::instance().contains(kind.position_name) &&
        PositionRegistry::instance().get(kind.position_name).rope_scaling)
      return true;
  return false;
}

}  // namespace extrap
