// The transformer language model: pre-norm decoder (causal LM) or encoder (masked LM).
//
//   x = embed(tokens) * sqrt(d_model); [x = N(x)]; x = position.embed(x)
//   for each block (model.block):
//     sequential:       x = x + Attn(N1(x));  x = x + FFN(N2(x))
//     parallel:         x = x + Attn(N1(x)) + FFN(N2(x))
//     parallel_shared:  x = x + Attn(N(x)) + FFN(N(x))
//   logits = N(x) @ W_out   (W_out = the input embedding when tied)
//
// A block is built from named parts chosen by the config, in the manner of torchtune's and
// x-transformers' blocks: its norms (Norm: LayerNorm or RMSNorm, with or without a bias;
// core/model/norm.h), its attention (SelfAttention: q, k and v heads, grouped-query where
// model.kv_heads says, a norm of q and k where model.qk_norm says), its feed-forward part
// (FeedForward: mlp, swiglu or geglu) and its residual pattern. The defaults are GPT-2's block
// (LayerNorm with biases, GELU mlp, full multi-head attention), with the parameter names of
// every run before these options.
//
// Attention goes through extrap::attention() with the position method's bias description;
// the position method is a registered submodule, so its parameters train and checkpoint
// with the model.
#pragma once

#include "core/attention/attention.h"
#include "core/model/adaptive.h"
#include "core/model/config.h"
#include "core/model/norm.h"
#include "positions/position.h"

#include <torch/torch.h>

namespace extrap {

struct SelfAttentionOptions {
  SelfAttentionOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(int64_t, kv_heads) = 0;            // key and value heads (0: heads)
  TORCH_ARG(int64_t, head_dim) = 0;            // each head's width (0: d_model / heads)
  TORCH_ARG(bool, bias) = true;                // the projections' biases
  TORCH_ARG(bool, qkv_bias) = false;           // with bias false: q, k and v's alone (Qwen2)
  TORCH_ARG(bool, qk_norm) = false;            // a norm of q and k before the position method
  TORCH_ARG(QkNormOver, qk_norm_over) = QkNormOver::head;  // over each head (d_head) or the projection
  TORCH_ARG(bool, norm_bias) = true;           // qk_norm's biases
  TORCH_ARG(bool, norm_affine) = true;         // qk_norm's weights (false: none, nor biases)
  TORCH_ARG(double, clip_qkv) = 0;             // q, k and v clamped to [-C, C] after the projection (0: off)
  TORCH_ARG(NormKind, norm) = NormKind::layernorm;  // qk_norm's kind and epsilon
  TORCH_ARG(double, norm_eps) = 1e-5;
  TORCH_ARG(double, dropout) = 0.0;            // on the output projection
  TORCH_ARG(double, attention_dropout) = 0.0;  // on attention probabilities
  TORCH_ARG(int64_t, layer_index) = 0;
  TORCH_ARG(AttentionConfig, extras);  // sink, SSMax, temperature, gate, window, chunk

 public:
  int64_t key_value_heads() const { return kv_heads_ > 0 ? kv_heads_ : heads_; }
  int64_t d_head() const { return head_dim_ > 0 ? head_dim_ : d_model_ / heads_; }
};

// The keys and values a causal model has computed, layer by layer, for generation. A forward
// pass with a cache attends to the cached tokens and its own, then appends its own: decoding a
// sequence block by block gives the logits of one forward pass over the whole sequence.
struct KVCache {
  struct Layer {
    torch::Tensor keys, values;  // (B, kv_heads, cached, d_head), rotated where the method rotates
    torch::Tensor state;         // the position method's (LayerInput::state)
  };
  // `planned`: the sequence's full length; position-dependent scales (xpos) are measured from
  // its middle, and tokens past it are refused.
  explicit KVCache(int64_t planned) : planned(planned) {}
  std::vector<Layer> layers;
  int64_t length = 0;  // tokens cached
  int64_t planned;
};

// StreamingLLM evaluation (Xiao et al., ICLR 2024; REFERENCE.md): a causal model reads a
// stream through a KV cache of `cache` tokens, the first `sinks` tokens of the stream (attention
// sinks) and the most recent cache - sinks; positions are cache slots (sinks 0 .. sinks - 1,
// the recent tokens right after), so no position ever reaches `cache`. cache 0: off.
struct StreamingCache {
  int64_t sinks = 0;
  int64_t cache = 0;
  bool active() const { return cache > 0; }
};

class SelfAttentionImpl : public torch::nn::Cloneable<SelfAttentionImpl> {
 public:
  explicit SelfAttentionImpl(SelfAttentionOptions options);
  void reset() override;
  // x: (B, T, D) -> (B, T, D)
  // With `cache`: x holds the new tokens only; their keys and values are appended to it.
  // `projected`, where defined, is x as the q, k, v projection should read it (x rounded to
  // bfloat16 under bf16 autocast, core/kernels/residual_norm.h); position methods still see x.
  torch::Tensor forward(const torch::Tensor& x, PositionMethod& position,
                        const TokenPositions& positions, const AttentionOptions& attention_options,
                        KVCache::Layer* cache = nullptr, const torch::Tensor& projected = {});

  SelfAttentionOptions options;
  torch::nn::Linear qkv = nullptr;  // D -> (H + 2 Hkv) d_head: the query heads, then the key heads, then the value heads
  torch::nn::Linear out = nullptr;  // D -> D
  // model.qk_norm: over each head's d_head values, shared by the heads (qk_norm_over head), or
  // over the projection's H d_head (q) and Hkv d_head (k) values (projection)
  Norm q_norm = nullptr, k_norm = nullptr;
  // The attention options' parameters, where set (extras): each head's sink logit (H,), SSMax's s
  // (H,), and the gate's projection (D -> H head-wise, D -> D element-wise, no bias).
  torch::Tensor sink, ssmax;
  torch::nn::Linear gate = nullptr;

  // What the attention options add to the position method's bias for queries at `at`.
  AttentionBias with_options(AttentionBias bias, const LayerInput& at, bool causal) const;

 private:
  // The attention of q, k, v (B, H, T, Dh) of tokens at `positions`, x their input (B, T, D):
  // the method's rotation and bias, the attention options, the cache. (B, H, T, Dh); with
  // last_queries n > 0 (no cache), only the last n queries attend, against every key: (B, H, n, Dh).
  torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, const torch::Tensor& x,
                       PositionMethod& position, const TokenPositions& positions,
                       const AttentionOptions& attention_options, KVCache::Layer* cache,
                       int64_t last_queries = 0);
  // attend() under StreamingLLM (positions.stream_cache > 0): each query over its cache.
  torch::Tensor attend_streaming(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& x, PositionMethod& position,
                                 const TokenPositions& positions, const AttentionOptions& attention_options);
};
TORCH_MODULE(SelfAttention);

// The feed-forward part of a block (model.ffn), over the two linear layers the block registers
// as ffn_in and ffn_out (the names every checkpoint has):
//   mlp:            ffn_out(act(ffn_in x)), act model.activation
//   swiglu, geglu:  ffn_out(act(g) o u), [g, u] = ffn_in x (2 d_ffn wide, the gate's half first),
//                   act SiLU or GELU (erf)
// On the CPU in training the activation, its product and their backward are fused with ffn_out
// (core/kernels/gelu_linear.h, core/kernels/glu_linear.h).
struct FeedForward {
  FfnKind kind = FfnKind::mlp;
  Activation activation = Activation::gelu;
  double activation_dropout = 0.0;  // on the hidden activations (the gated product's for a GLU)
  // ffn_in's output width for a hidden width of d_ffn: 2 d_ffn for a GLU.
  int64_t input_width(int64_t d_ffn) const { return kind == FfnKind::mlp ? d_ffn : 2 * d_ffn; }
  torch::Tensor forward(const torch::nn::Linear& in, const torch::nn::Linear& out, const torch::Tensor& x,
                        bool training) const;
};

struct BlockOptions {
  explicit BlockOptions(ModelConfig model) : model_(std::move(model)) {}
  TORCH_ARG(ModelConfig, model);  // the block's shape and parts (model.*)
  TORCH_ARG(int64_t, layer_index) = 0;
  TORCH_ARG(AttentionConfig, extras);  // the layer's attention options
};

class BlockImpl : public torch::nn::Cloneable<BlockImpl> {
 public:
  explicit BlockImpl(BlockOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x, PositionMethod& position,
                        const TokenPositions& positions, const AttentionOptions& attention_options,
                        KVCache::Layer* cache = nullptr);
  // forward() of base + delta (delta undefined: base), with that residual add fused into the
  // first norm (core/kernels/residual_norm.h), returning the block's residual stream and its
  // last branch's output unsummed, {h, f}, for the next norm to add: forward() is h + f.
  std::pair<torch::Tensor, torch::Tensor> forward_residual(const torch::Tensor& base, const torch::Tensor& delta,
                                                           PositionMethod& position, const TokenPositions& positions,
                                                           const AttentionOptions& attention_options,
                                                           KVCache::Layer* cache = nullptr);

  BlockOptions options;
  Norm ln_attention = nullptr;  // the attention's norm (parallel_shared: the block's one norm; none
                                // with model.sublayer_norms output)
  SelfAttention attention = nullptr;
  Norm ln_ffn = nullptr;        // the feed-forward's norm (none for parallel_shared, nor with output)
  // The norms of the attention's and the feed-forward's outputs, before the residual add
  // (model.sublayer_norms output and both; none with input).
  Norm ln_attention_out = nullptr, ln_ffn_out = nullptr;
  torch::nn::Linear ffn_in = nullptr;
  torch::nn::Linear ffn_out = nullptr;
  FeedForward ffn;

 private:
  // The residual patterns (model.block), each returning forward_residual's {h, f}.
  std::pair<torch::Tensor, torch::Tensor> sequential(const torch::Tensor& base, const torch::Tensor& delta,
                                                     PositionMethod& position, const TokenPositions& positions,
                                                     const AttentionOptions& attention_options, KVCache::Layer* cache);
  std::pair<torch::Tensor, torch::Tensor> parallel(const torch::Tensor& base, const torch::Tensor& delta,
                                                   PositionMethod& position, const TokenPositions& positions,
                                                   const AttentionOptions& attention_options, KVCache::Layer* cache);
  // sequential() with norms after the sublayers (model.sublayer_norms output or both).
  std::pair<torch::Tensor, torch::Tensor> normed_outputs(const torch::Tensor& base, const torch::Tensor& delta,
                                                         PositionMethod& position, const TokenPositions& positions,
                                                         const AttentionOptions& attention_options,
                                                         KVCache::Layer* cache);
  // The feed-forward branch's output from its normed input, with the residual dropout.
  torch::Tensor feed_forward(const torch::Tensor& x, const AttentionOptions& attention_options);
};
TORCH_MODULE(Block);

class TransformerLMImpl : public torch::nn::Module {
 public:
  // Builds the position method from config.position through the registry: every layer that
  // method with config.attention_options.
  TransformerLMImpl(const ModelConfig& config, int64_t vocab_size, const std::string& position_name,
                    const YAML::Node& position_options, const std::string& source);
  // Each layer its kind's position method and attention options (config.attention_options
  // unused). One method per kind, built for the layers of its kind: its parameters are
  // "position.*" without a pattern and "position_KIND.*" with one.
  TransformerLMImpl(const ModelConfig& config, int64_t vocab_size, const LayerPlan& plan, const std::string& source);

  // tokens: (B, T) int64 -> logits (B, T, V). `offset` is the absolute position of column 0.
  // In training with sampled positions (position.randomize_max, position.pose_target:
  // PositionSampling) they are instead drawn from LibTorch's default generator (saved with
  // checkpoints).
  torch::Tensor forward(const torch::Tensor& tokens, int64_t offset = 0);
  // The two halves of forward(): final hidden states (B, T, D), and their logits (..., V).
  // Evaluation projects only the positions it scores.
  torch::Tensor hidden(const torch::Tensor& tokens, int64_t offset = 0);
  // Generation (causal models, inference): the hidden states of `tokens`, the next tokens of
  // the sequence whose first cache->length tokens the cache holds, attending to those too; the
  // cache then holds them as well. Equal to the matching rows of hidden(whole sequence).
  torch::Tensor hidden(const torch::Tensor& tokens, KVCache& cache);
  // With an adaptive softmax (model.adaptive_cutoffs) the logits are the exact log-probabilities,
  // float32: their softmax is themselves.
  torch::Tensor logits(const torch::Tensor& hidden);
  // Each target's negative log-likelihood from final hidden states (N, D) and targets (N,):
  // (N,) float32, 0 where the target is -100. With an adaptive softmax only the targets' bands
  // are computed.
  torch::Tensor nll(const torch::Tensor& hidden, const torch::Tensor& targets);
  // The adaptive input and softmax, where the model has them (else null).
  const AdaptiveVocabulary& adaptive() const { return adaptive_; }

  // The position method of the model (of the first kind where layers follow a pattern), and
  // of each kind of layer.
  PositionMethod& position() { return *positions_.front(); }
  PositionMethod& kind_position(int64_t kind) { return *positions_.at(kind); }
  const LayerPlan& plan() const { return plan_; }
  const ModelConfig& config() const { return config_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_parameters() const;
  // hex64 of every parameter and buffer (name, dtype, shape and values, in registration order):
  // what a recorded evaluation was computed with (core/results/results_store.h, EvalInputs).
  std::string weights_digest() const;
  // Backend used by the attention call (evaluation may force one; config().attention stays the
  // trained config's).
  void set_attention_backend(AttentionBackend backend) { backend_ = backend; }
  AttentionBackend attention_backend() const { return backend_; }
  // Evaluation-time RoPE scaling for every later forward pass (none: the trained angles), in
  // every layer whose method has rotary angles. Refuses (ConfigError, naming the method) a
  // model with no such layer.
  void set_rope_scaling(const RopeScaling& scaling);
  const RopeScaling& rope_scaling() const { return rope_scaling_; }
  // StreamingLLM for every later forward pass (evaluation of a causal model, windows from
  // offset 0; inactive: off). Each window is one stream: token t < cache attends as usual, token
  // t >= cache to the sinks and the last cache - sinks tokens at cache slots, and an absolute
  // method embeds token t at min(t, cache - 1). Throws std::invalid_argument for sinks < 0,
  // sinks >= cache, or a masked LM.
  void set_streaming(const StreamingCache& streaming);
  const StreamingCache& streaming() const { return streaming_; }
  const std::string& position_name() const { return position_name_; }

 private:
  ModelConfig config_;
  int64_t vocab_size_;
  AttentionBackend backend_;
  std::string position_name_;
  LayerPlan plan_;
  RopeScaling rope_scaling_;
  StreamingCache streaming_;
  torch::nn::Embedding embedding = nullptr;  // without adaptive bands
  AdaptiveVocabulary adaptive_ = nullptr;     // with them: the input embedding and the softmax
  torch::nn::Dropout embedding_dropout = nullptr;
  std::vector<std::shared_ptr<PositionMethod>> positions_;  // one per kind of layer (plan_.kinds)
  torch::nn::ModuleList blocks = nullptr;
  Norm embedding_norm = nullptr;  // only with model.embedding_norm
  Norm ln_final = nullptr;  // only with model.final_norm
  torch::nn::Linear head = nullptr;  // only when embeddings are not tied

  // The token embeddings, times sqrt(d_model) (B, T, D).
  torch::Tensor embed(const torch::Tensor& tokens);
  // The last block's output x + delta, through the final norm where the model has one.
  torch::Tensor final_hidden(const torch::Tensor& x, const torch::Tensor& delta, torch::ScalarType dtype);

  // hidden(), with the final LayerNorm's output in `dtype` where the fused LayerNorm takes it
  // (bfloat16 for forward() under bf16 autocast: the cast the output projection would make).
  torch::Tensor hidden_as(const torch::Tensor& tokens, int64_t offset, torch::ScalarType dtype);
};
TORCH_MODULE(TransformerLM);

// Builds the model for a config and corpus vocabulary size; the position methods' options
// are decoded (and checked) here.
TransformerLM build_model(const Config& config, int64_t vocab_size);

// What a model built from `config` tells its position method: layers, heads, sizes, mode.
PositionContext position_context(const ModelConfig& config);

// A one-line name for the config's position methods: the method's name, or with a layer
// pattern each kind's method and attention options over one period, e.g.
// "rotary (window 128) x3, none".
std::string position_label(const Config& config);

// True when some layer's position method takes evaluation-time RoPE scaling.
bool has_rotary_angles(const Config& config);

// Builds the config's position methods alone, so that an unknown name or a bad option fails
// before a corpus is read or a model built (ConfigError naming the key). A method that does
// not support the objective's attention mode is left to build_model (a sweep records it).
void check_position_method(const Config& config);

}  // namespace extrap
