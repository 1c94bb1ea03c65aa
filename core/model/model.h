// The transformer language model: pre-LayerNorm decoder (causal LM) or encoder (masked LM).
//
//   x = embed(tokens) * sqrt(d_model); x = position.embed(x)
//   for each block:  x = x + Attn(LN(x));  x = x + FFN(LN(x))
//   logits = LN(x) @ W_out   (W_out = the input embedding when tied)
//
// Attention goes through extrap::attention() with the position method's bias description;
// the position method is a registered submodule, so its parameters train and checkpoint
// with the model.
#pragma once

#include "core/attention/attention.h"
#include "core/model/adaptive.h"
#include "core/model/config.h"
#include "positions/position.h"

#include <torch/torch.h>

namespace extrap {

struct SelfAttentionOptions {
  SelfAttentionOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(double, dropout) = 0.0;            // on the output projection
  TORCH_ARG(double, attention_dropout) = 0.0;  // on attention probabilities
  TORCH_ARG(int64_t, layer_index) = 0;
  TORCH_ARG(AttentionConfig, extras);  // sink, SSMax, temperature, gate, window, chunk
};

// The keys and values a causal model has computed, layer by layer, for generation. A forward
// pass with a cache attends to the cached tokens and its own, then appends its own: decoding a
// sequence block by block gives the logits of one forward pass over the whole sequence.
struct KVCache {
  struct Layer {
    torch::Tensor keys, values;  // (B, H, cached, d_head), rotated where the method rotates
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
  torch::nn::Linear qkv = nullptr;  // D -> 3D
  torch::nn::Linear out = nullptr;  // D -> D
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

struct BlockOptions {
  BlockOptions(int64_t d_model, int64_t heads, int64_t d_ffn)
      : d_model_(d_model), heads_(heads), d_ffn_(d_ffn) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(int64_t, d_ffn);
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(double, attention_dropout) = 0.0;
  TORCH_ARG(double, activation_dropout) = 0.0;  // on the FFN's hidden activations
  TORCH_ARG(Activation, activation) = Activation::gelu;
  TORCH_ARG(int64_t, layer_index) = 0;
  TORCH_ARG(AttentionConfig, extras);
};

class BlockImpl : public torch::nn::Cloneable<BlockImpl> {
 public:
  explicit BlockImpl(BlockOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x, PositionMethod& position,
                        const TokenPositions& positions, const AttentionOptions& attention_options,
                        KVCache::Layer* cache = nullptr);
  // forward() of base + delta (delta undefined: base), with that residual add fused into the
  // first LayerNorm (core/kernels/residual_norm.h), returning the block's residual stream and its
  // feed-forward output unsummed, {h, f}, for the next LayerNorm to add: forward() is h + f.
  std::pair<torch::Tensor, torch::Tensor> forward_residual(const torch::Tensor& base, const torch::Tensor& delta,
                                                           PositionMethod& position, const TokenPositions& positions,
                                                           const AttentionOptions& attention_options,
                                                           KVCache::Layer* cache = nullptr);

  BlockOptions options;
  torch::nn::LayerNorm ln_attention = nullptr;
  SelfAttention attention = nullptr;
  torch::nn::LayerNorm ln_ffn = nullptr;
  torch::nn::Linear ffn_in = nullptr;
  torch::nn::Linear ffn_out = nullptr;
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
  torch::nn::LayerNorm ln_final = nullptr;  // only with model.final_norm
  torch::nn::Linear head = nullptr;  // only when embeddings are not tied

  // The token embeddings, times sqrt(d_model) (B, T, D).
  torch::Tensor embed(const torch::Tensor& tokens);
  // The last block's output x + delta, through the final LayerNorm where the model has one.
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
