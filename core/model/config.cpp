#include "core/model/config.h"

#include "core/base/float_range.h"
#include "core/model/adaptive.h"

#include "positions/position.h"

#include <cmath>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <set>

namespace extrap {

namespace {

// A soft cap C (and the clip of q, k and v) is computed in float32: 0 is off, and any other value
// must be a normal float (normal_float32), since a smaller one is 0 there (the cap dropped) and a
// larger one infinite (NaN scores).
bool off_or_normal_float32(double value) { return value <= 0 || normal_float32(value); }
const std::string kFloat32Range = "must be 0 (off) or within float32's normal range (1.2e-38 to 3.4e38), got ";

// The data section: the corpus and the retrieval task mixed into it.
void read_data_section(const OptionReader& root, Config& c) {
  auto r = root.section("data", "the corpus");
  r.read("path", c.data.path, "corpus directory (train/valid/test files) or a single text file");
  r.read("tokenizer", c.data.tokenizer, "tokenisation");
  r.read("cache_dir", c.data.cache_dir, "where tokenised splits are cached", Affects::nothing);
  r.read("split_fractions", c.data.split_fractions,
         "train/valid/test fractions when data.path is a single file");
  r.read("vocab_size", c.data.vocab_size,
         "tokenizer ids: the vocabulary size (every id in the splits is below it; required); tokenizer hf: the "
         "model's embedding rows (0: the tokenizer's ids)");
  r.read("ids_dtype", c.data.ids_dtype,
         "tokenizer ids: the element type of {train,valid,test}.bin (.npy files say their own)");
  r.read("token_bytes", c.data.token_bytes,
         "tokenizer ids: a .npy of each id's length in bytes of text (vocab_size counts): bits per "
         "byte, exact", Affects::evaluation);
  r.read("tokenizer_model", c.data.tokenizer_model,
         "tokenizer sentencepiece: the SentencePiece .model file (required; extrap tokenizer train "
         "makes one); tokenizer hf: the Hugging Face tokenizer.json (required)");
  r.read("task", c.task,
         "synthetic retrieval task mixed into the training data (core/data/retrieval_task.h)");
  r.read("task_fraction", c.task_fraction,
         "share of training sequences that are task instances (1: the task alone)");
  r.finish();
  if (root.decoding()) {
    if (c.data.tokenizer == Tokenizer::ids && c.data.vocab_size < 1)
      r.fail("vocab_size", "is required with tokenizer ids: give the vocabulary size of the ids "
                           "(e.g. 50257 for GPT-2's BPE)");
    // (Written configs hold the defaults: only a value other than the default is refused.)
    const bool hf = c.data.tokenizer == Tokenizer::hf;  // data.vocab_size: the model's rows
    if (c.data.tokenizer != Tokenizer::ids &&
        ((c.data.vocab_size != 0 && !hf) || c.data.ids_dtype != IdsType::uint16 || !c.data.token_bytes.empty()))
      r.fail(c.data.vocab_size != 0 && !hf ? "vocab_size" : c.data.ids_dtype != IdsType::uint16 ? "ids_dtype" : "token_bytes",
             "is an option of tokenizer ids (pre-tokenised splits); tokenizer " +
                 enum_name(c.data.tokenizer) + " has its own vocabulary");
    const bool pieces = c.data.tokenizer == Tokenizer::sentencepiece;
    if (pieces && c.data.tokenizer_model.empty())
      r.fail("tokenizer_model", "is required with tokenizer sentencepiece: give the .model file "
                                "(extrap tokenizer train --data " +
                                    (c.data.path.empty() ? std::string("DIR") : c.data.path) +
                                    " --vocab-size N --out FILE.model makes one)");
    if (hf && c.data.tokenizer_model.empty())
      r.fail("tokenizer_model", "is required with tokenizer hf: give the tokenizer.json file");
    if (!pieces && !hf && !c.data.tokenizer_model.empty())
      r.fail("tokenizer_model", "is an option of tokenizers sentencepiece and hf; tokenizer " +
                                    enum_name(c.data.tokenizer) + " has its own vocabulary");
    r.at_least("vocab_size", c.data.vocab_size, 0);
    if (c.data.vocab_size > (int64_t(1) << 31) - 2)
      r.fail("vocab_size", "must be below 2^31 - 1 (ids are int32), got " +
                               std::to_string(c.data.vocab_size));
    r.in_range("task_fraction", c.task_fraction, 0, 1, "[]");
    if (c.task != RetrievalTask::none && c.task_fraction == 0)
      r.fail("task_fraction", "is 0 while data.task is " + enum_name(c.task) +
                                  ": give the share of task sequences (1: the task alone)");
    if (c.task == RetrievalTask::none && c.task_fraction > 0)
      r.fail("task_fraction", "is " + number_text(c.task_fraction) +
                                  " but data.task is none: name the task");
  }
}

// The adaptive input and softmax's keys: bands that fit the width, tied weights.
void check_adaptive_keys(const OptionReader& r, const ModelConfig& m) {
  if (!m.adaptive()) {  // (a resolved config writes every key: only a value other than the default is refused)
    const ModelConfig defaults;
    if (m.adaptive_factor != defaults.adaptive_factor)
      r.fail("adaptive_factor", "is set but model.adaptive_cutoffs is empty (no adaptive bands)");
    if (m.adaptive_dropout != defaults.adaptive_dropout)
      r.fail("adaptive_dropout", "is set but model.adaptive_cutoffs is empty (no adaptive bands)");
    return;
  }
  int64_t previous = 0;
  for (const int64_t c : m.adaptive_cutoffs) {
    if (c <= previous)
      r.fail("adaptive_cutoffs", previous == 0 ? "must be above 0, got " + std::to_string(c)
                                               : "must increase, got " + std::to_string(c) + " after " +
                                                     std::to_string(previous));
    previous = c;
  }
  r.at_least("adaptive_factor", m.adaptive_factor, 1);
  if (adaptive_band_width(m.d_model, m.adaptive_factor, int64_t(m.adaptive_cutoffs.size())) < 1)
    r.fail("adaptive_cutoffs", std::to_string(m.adaptive_cutoffs.size() + 1) + " bands of d_model " +
                                   std::to_string(m.d_model) + " / " + std::to_string(m.adaptive_factor) +
                                   "^k: the last would be 0 wide (fewer cutoffs or a smaller adaptive_factor)");
  r.in_range("adaptive_dropout", m.adaptive_dropout, 0, 1);
  if (!m.tie_embeddings)
    r.fail("tie_embeddings", "is false with model.adaptive_cutoffs: the adaptive softmax shares the adaptive "
                             "input's embeddings and projections (fairseq's --tie-adaptive-weights --tie-adaptive-proj); "
                             "untied adaptive weights are not built");
}

// The model section: the transformer's shape, objective and attention implementation.
void read_model_section(const OptionReader& root, Config& c) {
  auto r = root.section("model", "the transformer");
  auto& m = c.model;
  r.read("layers", m.layers, "number of transformer blocks");
  r.read("d_model", m.d_model, "model width");
  r.read("heads", m.heads, "attention heads (d_model must divide evenly unless head_dim is set)");
  r.read("head_dim", m.head_dim,
         "each head's width: q, k and v are heads x head_dim wide, the output projection maps that back to d_model "
         "(0: d_model / heads; Qwen3-0.6B, Mistral-Nemo and Gemma have heads of their own width)");
  r.read("kv_heads", m.kv_heads,
         "key and value heads, grouped-query attention: each shared by heads / kv_heads query heads (0: heads; "
         "1: multi-query)");
  r.read("d_ffn", m.d_ffn,
         "feed-forward hidden width (0: by rule: 4 d_model for the mlp; for swiglu and geglu Llama's, 2/3 of 4 "
         "d_model rounded up to a multiple of ffn_multiple)");
  r.read("ffn_multiple", m.ffn_multiple, "d_ffn 0 with swiglu or geglu: the multiple Llama's width is rounded up to");
  r.read("ffn", m.ffn,
         "feed-forward part: mlp (model.activation), or gated: swiglu (SiLU gate) or geglu (GELU gate, "
         "model.activation's: erf or tanh), W2 (act(W_g x) o W_u x)");
  r.read("norm", m.norm, "every norm of the model: layernorm, or rmsnorm (no mean subtracted)");
  r.read("norm_eps", m.norm_eps, "the norms' epsilon");
  r.read("bias", m.bias, "biases in every linear layer and norm (false: none, as Llama and MPT)");
  bool norm_bias = m.norm_biased();  // absent: model.bias's
  r.read("norm_bias", norm_bias,
         "the norms' biases (LayerNorm's beta), where they differ from model.bias: Falcon-7B and 40B have "
         "LayerNorms with biases beside linear layers without (default: model.bias)");
  if (r.decoding() && r.has("norm_bias")) m.norm_bias = norm_bias;
  r.read("norm_affine", m.norm_affine,
         "the norms' learned weight (and bias, as model.norm_bias says); false: every norm without parameters, "
         "x normalised alone (OLMo's LayerNorm)");
  r.read("qkv_bias", m.qkv_bias, "with bias false: biases on the q, k and v projections alone (Qwen2)");
  r.read("scale_embedding", m.scale_embedding,
         "the token embedding times sqrt(d_model) (fairseq's; false: unscaled, as GPT-2, Llama and the Hugging Face "
         "families)");
  r.read("block", m.block,
         "residual pattern: sequential; parallel (x + attn(n1 x) + ffn(n2 x), GPT-NeoX); parallel_shared (one "
         "norm for both, GPT-J, PaLM, Falcon)");
  r.read("sublayer_norms", m.sublayer_norms,
         "where a sequential block's norms sit: input (x + f(n(x)), pre-norm), output (x + n(f(x)), OLMo 2) or "
         "both (x + n_out(f(n(x))), Gemma 2 and 3)");
  r.read("qk_norm", m.qk_norm, "a norm of q and k before the position method (OLMo 2, Qwen3, Gemma 3)");
  r.read("qk_norm_over", m.qk_norm_over,
         "what qk_norm normalises: head (each head's d_head values, Qwen3, Gemma 3) or projection (all heads' "
         "values of q, and of k, together, OLMo 2)");
  r.read("clip_qkv", m.clip_qkv,
         "q, k and v each clamped to [-C, C] right after their projection, before qk_norm and the position method "
         "(OLMo's and MPT's clip_qkv; 0: off)");
  r.read("embedding_norm", m.embedding_norm, "a norm right after the token embedding (BLOOM)");
  r.read("dropout", m.dropout, "dropout on embeddings, residual branches and the FFN");
  r.read("attention_dropout", m.attention_dropout, "dropout on attention probabilities");
  r.read("activation_dropout", m.activation_dropout, "dropout on the FFN's hidden activations");
  r.read("activation", m.activation,
         "the mlp's activation: gelu (erf), gelu_tanh (the tanh approximation: GPT-2, BLOOM) or relu; geglu's "
         "gate: gelu or gelu_tanh (Gemma); swiglu has its own");
  r.read("tie_embeddings", m.tie_embeddings, "share input and output embedding matrices");
  r.read("init", m.init,
         "initialisation: LibTorch's Linear everywhere, or fairseq's attention projections (q, k, v Xavier "
         "gain 1/sqrt(2); output Xavier, zero bias)");
  r.read("final_norm", m.final_norm, "a LayerNorm on the last block's output (fairseq's transformer_lm_wiki103 has none)");
  r.read("logit_softcap", m.logit_softcap,
         "the output logits l become C tanh(l / C) before the softmax (Gemma 2's final_logit_softcapping, C 30; 0: off)");
  r.read("adaptive_cutoffs", m.adaptive_cutoffs,
         "adaptive input and softmax, tied: the vocabulary's band ends below V, ids sorted by count (empty: a "
         "plain embedding and softmax; the ALiBi paper's WikiText-103 model: [20000, 60000])");
  r.read("adaptive_factor", m.adaptive_factor, "adaptive bands: band k is d_model / factor^k wide");
  r.read("adaptive_dropout", m.adaptive_dropout, "adaptive softmax: dropout on its input and on each tail's projection");
  r.read("objective", m.objective, "causal LM, or bidirectional masked LM");
  r.read("attention", m.attention, "attention implementation (the same maths on every path)",
         Affects::nothing);
  r.read("efficient_threshold", m.efficient_threshold,
         "auto: evaluation on the CPU takes the fused kernel's forward from 128 queries where it computes the bias "
         "(none, the ALiBi family, biases of j - i alone); other biases take the memory-efficient path where T*T "
         "is above this",
         Affects::nothing);
  r.finish();
  if (root.decoding()) {
    r.at_least("layers", m.layers, 1);
    r.at_least("d_model", m.d_model, 1);
    r.at_least("heads", m.heads, 1);
    r.at_least("kv_heads", m.kv_heads, 0);
    if (m.kv_heads > 0 && m.heads % m.kv_heads != 0)
      r.fail("kv_heads", std::to_string(m.kv_heads) + " does not divide heads " + std::to_string(m.heads) +
                             ": each key and value head serves heads / kv_heads query heads");
    r.at_least("d_ffn", m.d_ffn, 0);
    r.at_least("ffn_multiple", m.ffn_multiple, 1);
    if (m.ffn_multiple != ModelConfig().ffn_multiple && !(m.d_ffn == 0 && m.gated_ffn()))
      r.fail("ffn_multiple", "is set but d_ffn is not 0 with a gated ffn (swiglu, geglu): nothing is rounded to it");
    if (m.ffn == FfnKind::swiglu && m.activation != ModelConfig().activation)
      r.fail("activation", "is the mlp's or geglu's; ffn swiglu gates with SiLU (leave activation out)");
    if (m.ffn == FfnKind::geglu && m.activation == Activation::relu)
      r.fail("activation", "relu with ffn geglu, which gates with GELU: gelu (erf) or gelu_tanh");
    if (!(m.norm_eps > 0) || !std::isfinite(m.norm_eps))
      r.fail("norm_eps", "must be a finite number above 0, got " + number_text(m.norm_eps));
    if (m.sublayer_norms != SublayerNorms::input && m.block != BlockKind::sequential)
      r.fail("sublayer_norms", enum_name(m.sublayer_norms) + " with block " + enum_name(m.block) +
                                   ": only the sequential block has norms after its sublayers");
    if (m.qk_norm_over != QkNormOver::head && !m.qk_norm)
      r.fail("qk_norm_over", enum_name(m.qk_norm_over) + " without qk_norm: there is no q and k norm");
    if (!(m.logit_softcap >= 0) || !std::isfinite(m.logit_softcap))
      r.fail("logit_softcap", "must be a finite number at least 0, got " + number_text(m.logit_softcap));
    if (!off_or_normal_float32(m.logit_softcap))
      r.fail("logit_softcap", kFloat32Range + number_text(m.logit_softcap));
    if (m.logit_softcap > 0 && !m.adaptive_cutoffs.empty())
      r.fail("logit_softcap", "with adaptive_cutoffs: the adaptive softmax's bands have no one row of logits to cap");
    if (!(m.clip_qkv >= 0) || !std::isfinite(m.clip_qkv))
      r.fail("clip_qkv", "must be a finite number at least 0, got " + number_text(m.clip_qkv));
    if (!off_or_normal_float32(m.clip_qkv)) r.fail("clip_qkv", kFloat32Range + number_text(m.clip_qkv));
    if (!m.norm_affine && m.norm_bias.value_or(false))
      r.fail("norm_bias", "is true with norm_affine false: a norm without parameters has no bias");
    if (m.qkv_bias && m.bias)
      r.fail("qkv_bias", "is true with model.bias true, which gives every projection a bias already");
    if (!m.bias && m.init == InitKind::fairseq)
      r.fail("init", "fairseq zeroes the output projection's bias; with model.bias false there is none (use torch)");
    r.at_least("efficient_threshold", m.efficient_threshold, 1);
    r.in_range("attention_dropout", m.attention_dropout, 0, 1);
    r.at_least("head_dim", m.head_dim, 0);
    if (m.head_dim == 0 && m.d_model % m.heads != 0)
      r.fail("heads", "d_model (" + std::to_string(m.d_model) + ") must be a multiple of heads (" +
                          std::to_string(m.heads) + "), or model.head_dim set");
    r.in_range("dropout", m.dropout, 0, 1);
    r.in_range("activation_dropout", m.activation_dropout, 0, 1);
    check_adaptive_keys(r, m);
  }
}

// The attention options' keys, in the `attention` section and in a layer kind's `attention`
// (layers.kinds.NAME.attention), which starts from the section's values.
void read_attention_keys(const OptionReader& r, AttentionConfig& a) {
  r.read("sink", a.sink, "a learned sink logit per head and layer: one more softmax column that weights no value");
  r.read("ssmax", a.ssmax, "SSMax: each row's logits times s_h ln n_i (n_i keys seen), s learned per head and layer");
  r.read("ssmax_init", a.ssmax_init, "SSMax: the initial s (0: 1 / ln(train.seq_len), plain softmax at n = L)");
  r.read("temperature", a.temperature,
         "Llama 4 attention temperature a: q at position p times 1 + a ln(floor((p + 1) / F) + 1) (0: off)");
  r.read("temperature_floor", a.temperature_floor, "Llama 4 attention temperature: the floor scale F");
  r.read("gate", a.gate, "gate on each head's output, sigmoid(x W_g) of the layer's input: per head or per channel");
  r.read("window", a.window, "sliding window: query i sees keys j with |i - j| < W (0: full attention)");
  r.read("chunk", a.chunk, "chunked attention: i and j in the same chunk of C tokens (0: off)");
  r.read("softcap", a.softcap,
         "attention logit soft-capping: each q.k / sqrt(d) becomes C tanh(q.k / (sqrt(d) C)) before the position "
         "bias and the masks (Gemma 2: 50; 0: off)");
  r.read("scale_dim", a.scale_dim,
         "the scores are q.k / sqrt(s) for this s instead of sqrt(d_head) (Gemma 2 and 3's query_pre_attn_scalar; "
         "0: d_head)");
  r.finish();
  if (!r.decoding()) return;
  r.at_least("window", a.window, 0);
  r.at_least("chunk", a.chunk, 0);
  r.at_least("temperature_floor", a.temperature_floor, 1);
  if (!(a.temperature >= 0) || !std::isfinite(a.temperature))
    r.fail("temperature", "must be a finite number at least 0, got " + number_text(a.temperature));
  if (!(a.softcap >= 0) || !std::isfinite(a.softcap))
    r.fail("softcap", "must be a finite number at least 0, got " + number_text(a.softcap));
  if (!off_or_normal_float32(a.softcap)) r.fail("softcap", kFloat32Range + number_text(a.softcap));
  if (!(a.scale_dim >= 0) || !std::isfinite(a.scale_dim))
    r.fail("scale_dim", "must be a finite number at least 0 (0: d_head), got " + number_text(a.scale_dim));
  if (!(a.ssmax_init >= 0) || !std::isfinite(a.ssmax_init))
    r.fail("ssmax_init", "must be a finite number at least 0, got " + number_text(a.ssmax_init));
  // (A kind that turns SSMax or the temperature off keeps the section's ssmax_init or floor
  // unused: only a key given here is refused.)
  if (r.has("ssmax_init") && a.ssmax_init > 0 && !a.ssmax) r.fail("ssmax_init", "is set but ssmax is false");
  if (r.has("temperature_floor") && a.temperature_floor != AttentionConfig().temperature_floor && a.temperature == 0)
    r.fail("temperature_floor", "is set but the temperature is 0 (off)");
  if (!a.ssmax) a.ssmax_init = AttentionConfig().ssmax_init;
  if (a.temperature == 0) a.temperature_floor = AttentionConfig().temperature_floor;
}

// The attention section: options on top of the position method, in every layer (a layer
// kind may change them).
void read_attention_section(const OptionReader& root, Config& c) {
  read_attention_keys(root.section("attention", "attention options that combine with every position method (2024-26)"),
                      c.model.attention_options);
}

// The layers section: a pattern of layer kinds, each its own position method and attention
// options (resolved by layer_plan).
void read_layers_section(const OptionReader& root, Config& c) {
  auto r = root.section("layers", "a pattern of layer kinds repeated over depth, each its own position method and "
                                  "attention options (iRoPE, SWAN, RNoPE-SWA)");
  r.read("pattern", c.layer_pattern,
         "kind names, repeated over model.layers (which it must divide); a name that is not a kind is a position "
         "method with the attention section as it is (empty: every layer is position + attention)");
  r.accept("kinds", "NAME: {position: METHOD or {name: METHOD, ...options}, attention: {KEY: VALUE, ...}}; each "
                    "omitted part is the top-level section's");
  r.finish();
  if (root.decoding() && root.has("layers")) c.layers.reset(root.node()["layers"]);
}

// The position section is decoded by the method itself; only `name` is read here.
void read_position_section(const OptionReader& root, Config& c) {
  root.accept("position", "the position method: {name: NAME, ...its options} (see `extrap positions`)");
  if (root.decoding() && root.has("position")) {
    const YAML::Node p = root.node()["position"];
    if (p.IsScalar()) {
      c.position_name = p.as<std::string>();
      c.position = YAML::Node(YAML::NodeType::Map);
    } else if (p.IsMap()) {
      // The document's own node (not a YAML::Clone, which drops line numbers): the method
      // reads its options from it and errors name their lines. `name` stays in it.
      c.position = p;
      if (p["name"] && !p["name"].IsScalar())
        root.fail("position", "'name' must be one method's name, got '" + yaml_to_string(p["name"]) + "'");
      if (p["name"]) c.position_name = p["name"].Scalar();
    } else {
      root.fail("position", "expected a method name or a map with 'name'");
    }
  }
}

// The keys of one optimiser or schedule: refused where the config's optimiser or schedule
// does not read them.
void check_schedule_keys(const OptionReader& r, const TrainConfig& t) {
  // (A resolved config writes every key: only a value other than the default is refused.)
  const TrainConfig defaults;
  if (t.schedule != Schedule::cosine_restarts) {
    const std::string why = "is read by schedule cosine_restarts only; the schedule is " + enum_name(t.schedule);
    if (t.warmup_init_lr != defaults.warmup_init_lr) r.fail("warmup_init_lr", why);
    if (t.period != defaults.period) r.fail("period", why);
    if (t.t_mult != defaults.t_mult) r.fail("t_mult", why);
    if (t.lr_shrink != defaults.lr_shrink) r.fail("lr_shrink", why);
  }
  if (!(t.warmup_init_lr >= 0 && t.warmup_init_lr <= t.lr))
    r.fail("warmup_init_lr", "must be in [0, lr], got " + number_text(t.warmup_init_lr));
  r.at_least("period", t.period, 0, " (0: steps - warmup)");
  if (!(t.t_mult >= 1) || !std::isfinite(t.t_mult)) r.fail("t_mult", "must be a finite number at least 1, got " + number_text(t.t_mult));
  if (!(t.lr_shrink > 0 && t.lr_shrink <= 1)) r.fail("lr_shrink", "must be in (0, 1], got " + number_text(t.lr_shrink));
  if (t.optimizer == OptimizerKind::nag) {
    const std::string why = "is AdamW's; train.optimizer is nag";
    if (t.beta1 != defaults.beta1) r.fail("beta1", why);
    if (t.beta2 != defaults.beta2) r.fail("beta2", why);
    if (t.eps != defaults.eps) r.fail("eps", why);
    r.in_range("momentum", t.momentum, 0, 1);
  } else if (t.momentum != defaults.momentum) {
    r.fail("momentum", "is nag's; train.optimizer is adamw");
  }
}

// The train section: optimiser, schedule, checkpoints and where training runs.
void read_train_section(const OptionReader& root, Config& c) {
  auto r = root.section("train", "training");
  auto& t = c.train;
  r.read("seq_len", t.seq_len, "training sequence length L");
  r.read("batch_tokens", t.batch_tokens, "tokens per optimiser step");
  r.read("accumulation", t.accumulation, "micro-batches per optimiser step (gradient accumulation)");
  r.read("steps", t.steps, "optimiser steps");
  r.read("lr", t.lr, "peak learning rate");
  r.read("min_lr", t.min_lr, "final learning rate of the cosine schedule");
  r.read("warmup", t.warmup, "linear warm-up steps");
  r.read("schedule", t.schedule,
         "decay after warm-up (cosine_restarts: fairseq's cosine scheduler, update n at its rate for n - 1)");
  r.read("warmup_init_lr", t.warmup_init_lr, "cosine_restarts: the learning rate warm-up starts from");
  r.read("period", t.period, "cosine_restarts: updates in the first cosine period (0: steps - warmup)");
  r.read("t_mult", t.t_mult, "cosine_restarts: each period this many times the last");
  r.read("lr_shrink", t.lr_shrink, "cosine_restarts: lr and min_lr shrink by this factor each period");
  r.read("optimizer", t.optimizer, "adamw, or nag (fairseq's Nesterov momentum, the ALiBi paper's)");
  r.read("momentum", t.momentum, "nag: the momentum");
  r.read("weight_decay", t.weight_decay,
         "weight decay: AdamW's on matrices only; nag's on every parameter, p *= 1 - lr * wd (fairseq's)");
  r.read("beta1", t.beta1, "AdamW beta1");
  r.read("beta2", t.beta2, "AdamW beta2");
  r.read("eps", t.eps, "AdamW epsilon");
  r.read("clip", t.clip, "maximum gradient norm (0: no clipping)");
  r.read("seed", t.seed, "random seed (initialisation, data order, dropout)");
  r.read("validate_every", t.validate_every, "steps between validations (0: only at the end)",
         Affects::evaluation);
  r.read("validate_tokens", t.validate_tokens, "validation tokens per check (0: whole split)",
         Affects::evaluation);
  r.read("checkpoint_every", t.checkpoint_every, "steps between checkpoints (0: only at the end)",
         Affects::nothing);
  r.read("log_every", t.log_every, "steps between log lines when not on a terminal",
         Affects::nothing);
  r.read("out_dir", t.out_dir, "run directory (checkpoints, logs)", Affects::nothing);
  r.read("threads", t.threads, "CPU threads (0: all available cores)", Affects::nothing);
  r.read("device", t.device, "where to train");
  r.read("precision", t.precision,
         "training's matrix products: fp32, or bf16 (fp32 weights, optimiser, attention and "
         "loss; evaluation is always fp32)");
  r.read("mask_prob", t.mask_prob, "masked_lm: fraction of tokens selected for prediction");
  r.read("cuda_graph", t.cuda_graph,
         "GPU training: auto (capture each step once as a CUDA graph and replay it, where the run "
         "allows), on (an error where it does not), off (eager steps)",
         Affects::nothing);
  r.finish();
  if (root.decoding()) {
    r.at_least("seq_len", t.seq_len, 1);
    r.at_least("accumulation", t.accumulation, 1);
    if (t.batch_tokens < t.seq_len * t.accumulation)
      r.fail("batch_tokens", "must be at least seq_len * accumulation (" +
                                 std::to_string(t.seq_len * t.accumulation) + ")");
    r.at_least("steps", t.steps, 0);
    if (!(t.lr > 0) || !std::isfinite(t.lr)) r.fail("lr", "must be a positive number, got " + number_text(t.lr));
    if (!(t.min_lr >= 0 && t.min_lr <= t.lr))
      r.fail("min_lr", "must be in [0, lr], got " + number_text(t.min_lr));
    r.at_least("warmup", t.warmup, 0);
    if (!(t.weight_decay >= 0) || !std::isfinite(t.weight_decay))
      r.fail("weight_decay", "must not be negative, got " + number_text(t.weight_decay));
    r.in_range("beta1", t.beta1, 0, 1);
    r.in_range("beta2", t.beta2, 0, 1);
    if (!(t.eps > 0) || !std::isfinite(t.eps)) r.fail("eps", "must be a positive number, got " + number_text(t.eps));
    check_schedule_keys(r, t);
    if (!(t.clip >= 0) || !std::isfinite(t.clip))
      r.fail("clip", "must not be negative (0: no clipping), got " + number_text(t.clip));
    r.at_least("validate_every", t.validate_every, 0);
    r.at_least("validate_tokens", t.validate_tokens, 0);
    r.at_least("checkpoint_every", t.checkpoint_every, 0);
    r.at_least("log_every", t.log_every, 1);
    r.at_least("threads", t.threads, 0, " (0: all cores)");
    r.in_range("mask_prob", t.mask_prob, 0, 1, "()");
    if (t.out_dir.empty()) r.fail("out_dir", "must not be empty");
  }
}

// The eval section: window lengths, strides and the evaluation split.
void read_eval_section(const OptionReader& root, Config& c) {
  auto r = root.section("eval", "evaluation");
  auto& e = c.eval;
  r.read("lengths", e.lengths, "evaluation window lengths", Affects::evaluation);
  r.read("strides", e.strides, "sliding-window strides (non-overlapping is always evaluated)",
         Affects::evaluation);
  r.read("split", e.split, "evaluation split", Affects::evaluation);
  r.read("batch_tokens", e.batch_tokens, "tokens per evaluation forward pass", Affects::nothing);
  r.read("max_tokens", e.max_tokens, "evaluate on the first N tokens only (0: all)",
         Affects::evaluation);
  r.read("mask_seed", e.mask_seed, "masked_lm: seed of the fixed token selection",
         Affects::evaluation);
  r.finish();
  if (root.decoding()) {
    check_eval_lengths(r, e.lengths, {}, e.strides);
    r.at_least("batch_tokens", e.batch_tokens, 1);
    r.at_least("max_tokens", e.max_tokens, 0, " (0: all)");
  }
}

// One place that lists every key: used to decode and to document.
void read_config(const OptionReader& root, Config& c) {
  read_data_section(root, c);
  read_model_section(root, c);
  read_attention_section(root, c);
  read_position_section(root, c);
  read_layers_section(root, c);
  read_train_section(root, c);
  read_eval_section(root, c);
  root.read("plugins", c.plugins,
            "position-method plugin libraries (.so) to load (the method's name and options are "
            "what identify a run)",
            Affects::nothing);
  root.finish();
}

}  // namespace

Config config_from_yaml(const YAML::Node& root, const std::string& source) {
  Config c;
  c.source = source;
  read_config(OptionReader(root, source), c);
  // position.randomize_max and pose_target are decoded (and type-checked) by the position
  // registry; here only their relation to the training length.
  const OptionReader position(c.position, source, "position");
  for (const char* key : kSampledPositionKeys) {
    const YAML::Node n = c.position.IsMap() ? c.position[key] : YAML::Node();
    int64_t range = 0;
    if (n && n.IsScalar() && YAML::convert<int64_t>::decode(n, range) && range > 0 && range < c.train.seq_len)
      position.fail(key, "is " + std::to_string(range) + ", below train.seq_len " + std::to_string(c.train.seq_len) +
                             ": a training window needs that many distinct positions");
  }
  if (const YAML::Node n = c.position.IsMap() ? c.position["pose_chunks"] : YAML::Node()) {
    int64_t chunks = 0;
    if (n.IsScalar() && YAML::convert<int64_t>::decode(n, chunks) && chunks > c.train.seq_len)
      position.fail("pose_chunks", "is " + std::to_string(chunks) + ", above train.seq_len " +
                                       std::to_string(c.train.seq_len) + ": each chunk needs a token");
  }
  layer_plan(c);  // the layers section's own checks (its methods are checked when built)
  if (c.task != RetrievalTask::none && !c.model.causal())
    OptionReader(root, source).fail("data", "data.task " + enum_name(c.task) +
                                                " needs model.objective causal_lm: retrieval is "
                                                "scored by generating the answer");
  return c;
}

void position_as_map(YAML::Node root) {
  if (root.IsMap() && root["position"] && root["position"].IsScalar()) {
    const std::string name = root["position"].Scalar();
    root["position"] = YAML::Node(YAML::NodeType::Map);
    root["position"]["name"] = name;
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node root = path.empty() ? YAML::Node(YAML::NodeType::Map) : load_yaml_file(path);
  position_as_map(root);  // so that --set position.name=... works on `position: alibi`
  for (const auto& o : overrides) apply_override(root, o);
  return config_from_yaml(root, path.empty() ? "(command line)" : path);
}

void check_eval_lengths(const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& length_multiples,
                        const std::vector<int64_t>& strides, const EvalLengthRefusal& refuse) {
  const auto check = [&](EvalLengthList list, const std::vector<int64_t>& values) {
    std::set<int64_t> seen;
    for (int64_t value : values) {
      if (value < 1) refuse(list, value, EvalLengthProblem::below_one);
      if (!seen.insert(value).second) refuse(list, value, EvalLengthProblem::listed_twice);
    }
  };
  check(EvalLengthList::lengths, lengths);
  check(EvalLengthList::length_multiples, length_multiples);
  check(EvalLengthList::strides, strides);
}

void check_eval_lengths(const OptionReader& section, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& length_multiples,
                        const std::vector<int64_t>& strides) {
  if (!section.decoding()) return;
  check_eval_lengths(lengths, length_multiples, strides,
                     [&](EvalLengthList list, int64_t value, EvalLengthProblem problem) {
                       const char* key = list == EvalLengthList::lengths ? "lengths"
                                         : list == EvalLengthList::strides
                                             ? "strides"
                                             : "length_multiples";
                       if (problem == EvalLengthProblem::listed_twice)
                         section.fail(key, std::to_string(value) + " is listed twice");
                       section.at_least(key, value, 1);
                     });
}

std::vector<OptionDoc> config_documentation() {
  Config c;
  auto doc = OptionReader::documenter();
  read_config(doc, c);
  return doc.docs();
}

namespace {
// to_yaml() without the keys whose mark is not in `kept`. Keys added after extrap 0.3 are left
// out while they hold their default, so that the runs and results files of earlier versions
// keep their identity.
YAML::Node keys_affecting(const Config& config, std::initializer_list<Affects> kept) {
  YAML::Node out = config.to_yaml();
  for (const auto& doc : config_documentation()) {
    if (doc.section) continue;
    bool keep = false;
    for (Affects a : kept) keep = keep || doc.affects == a;
    if (!keep) remove_key(out, doc.key);
  }
  if (config.train.precision == Precision::fp32) remove_key(out, "train.precision");
  if (config.task == RetrievalTask::none) {
    remove_key(out, "data.task");
    remove_key(out, "data.task_fraction");
  }
  if (config.data.tokenizer != Tokenizer::ids) {  // keys added in 0.12
    remove_key(out, "data.vocab_size");
    remove_key(out, "data.ids_dtype");
  }
  if (config.data.token_bytes.empty()) remove_key(out, "data.token_bytes");
  if (config.data.tokenizer_model.empty()) remove_key(out, "data.tokenizer_model");  // 0.12
  // The attention section (0.13): only the keys that differ from plain attention.
  const AttentionConfig& a = config.model.attention_options, plain;
  if (a.sink == plain.sink) remove_key(out, "attention.sink");
  if (a.ssmax == plain.ssmax) remove_key(out, "attention.ssmax");
  if (a.ssmax_init == plain.ssmax_init) remove_key(out, "attention.ssmax_init");
  if (a.temperature == plain.temperature) remove_key(out, "attention.temperature");
  if (a.temperature == plain.temperature || a.temperature_floor == plain.temperature_floor)
    remove_key(out, "attention.temperature_floor");
  if (a.gate == plain.gate) remove_key(out, "attention.gate");
  if (a.window == plain.window) remove_key(out, "attention.window");
  if (a.chunk == plain.chunk) remove_key(out, "attention.chunk");
  if (a.softcap == plain.softcap) remove_key(out, "attention.softcap");
  if (a.scale_dim == plain.scale_dim) remove_key(out, "attention.scale_dim");
  if (out["attention"] && out["attention"].size() == 0) out.remove("attention");
  if (config.layer_pattern.empty()) out.remove("layers");  // the section came in 0.13
  // The paper's model and optimiser (issue 67): only the keys that differ from their defaults, so
  // that an older run keeps its fingerprint.
  const ModelConfig m;
  const TrainConfig t;
  if (config.model.activation_dropout == m.activation_dropout) remove_key(out, "model.activation_dropout");
  // The architectures of issue 77: only the keys that differ from GPT-2's block.
  if (config.model.kv_heads == m.kv_heads) remove_key(out, "model.kv_heads");
  if (config.model.head_dim * config.model.heads == config.model.d_model || config.model.head_dim == 0)
    remove_key(out, "model.head_dim");  // d_model / heads, written or not
  if (config.model.ffn_multiple == m.ffn_multiple) remove_key(out, "model.ffn_multiple");
  if (config.model.ffn == m.ffn) remove_key(out, "model.ffn");
  if (config.model.norm == m.norm) remove_key(out, "model.norm");
  if (config.model.norm_eps == m.norm_eps) remove_key(out, "model.norm_eps");
  if (config.model.bias == m.bias) remove_key(out, "model.bias");
  if (config.model.norm_biased() == config.model.bias) remove_key(out, "model.norm_bias");  // its default
  if (config.model.norm_affine == m.norm_affine) remove_key(out, "model.norm_affine");
  if (config.model.clip_qkv == m.clip_qkv) remove_key(out, "model.clip_qkv");
  // Released checkpoints' keys (issue 78): likewise.
  if (config.model.qkv_bias == m.qkv_bias) remove_key(out, "model.qkv_bias");
  if (config.model.scale_embedding == m.scale_embedding) remove_key(out, "model.scale_embedding");
  if (config.model.block == m.block) remove_key(out, "model.block");
  if (config.model.qk_norm == m.qk_norm) remove_key(out, "model.qk_norm");
  if (config.model.sublayer_norms == m.sublayer_norms) remove_key(out, "model.sublayer_norms");
  if (config.model.qk_norm_over == m.qk_norm_over) remove_key(out, "model.qk_norm_over");
  if (config.model.embedding_norm == m.embedding_norm) remove_key(out, "model.embedding_norm");
  if (config.model.final_norm == m.final_norm) remove_key(out, "model.final_norm");
  if (config.model.logit_softcap == m.logit_softcap) remove_key(out, "model.logit_softcap");
  if (config.model.init == m.init) remove_key(out, "model.init");
  if (!config.model.adaptive()) {
    remove_key(out, "model.adaptive_cutoffs");
    remove_key(out, "model.adaptive_factor");
    remove_key(out, "model.adaptive_dropout");
  }
  if (config.train.optimizer == t.optimizer) remove_key(out, "train.optimizer");
  if (config.train.optimizer != OptimizerKind::nag) remove_key(out, "train.momentum");
  if (config.train.schedule != Schedule::cosine_restarts)
    for (const char* key : {"train.warmup_init_lr", "train.period", "train.t_mult", "train.lr_shrink"}) remove_key(out, key);
  return out;
}
}  // namespace

std::string AttentionConfig::describe() const {
  std::string out;
  const auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (sink) add("sink");
  if (ssmax) add("ssmax");
  if (temperature > 0) add("temperature " + number_text(temperature) + " / " + std::to_string(temperature_floor));
  if (gate != AttentionGate::none) add(enum_name(gate) + " gate");
  if (window > 0) add("window " + std::to_string(window));
  if (chunk > 0) add("chunk " + std::to_string(chunk));
  if (softcap > 0) add("softcap " + number_text(softcap));
  if (scale_dim > 0) add("scale_dim " + number_text(scale_dim));
  return out;
}

YAML::Node Config::model_keys() const { return keys_affecting(*this, {Affects::model}); }

YAML::Node Config::result_keys() const {
  return keys_affecting(*this, {Affects::model, Affects::evaluation});
}

YAML::Node Config::to_yaml() const {
  YAML::Node out(YAML::NodeType::Map);
  Config copy = *this;
  read_config(OptionReader::writer(out), copy);
  YAML::Node p(YAML::NodeType::Map);
  p["name"] = position_name;  // first, whether or not the document's node has it
  if (position.IsMap())
    for (const auto& entry : position)
      if (entry.first.Scalar() != "name") p[entry.first.Scalar()] = YAML::Clone(entry.second);
  out["position"] = p;
  if (layers.IsMap() && layers["kinds"]) out["layers"]["kinds"] = YAML::Clone(layers["kinds"]);
  return out;
}

int64_t ModelConfig::ffn_width() const {
  if (d_ffn > 0) return d_ffn;
  if (!gated_ffn()) return 4 * d_model;
  const int64_t width = 2 * (4 * d_model) / 3;
  return (width + ffn_multiple - 1) / ffn_multiple * ffn_multiple;
}

int64_t LayerPlan::layers_of(int64_t kind) const {
  return std::count(layer_kind.begin(), layer_kind.end(), kind);
}

namespace {
// A kind's name becomes part of its parameters' names (position_NAME.*).
bool valid_kind_name(const std::string& name) {
  if (name.empty()) return false;
  for (char ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return false;
  return true;
}
// A pattern whose every kind names its own method takes nothing from the top-level
// `position`: one that says something no layer does would be ignored, and every point of a sweep
// over position.name would train the same model. Refused, naming the key, unless it is the
// default (alibi without options) or names, without options, a method that the pattern names.
void refuse_untaken_position(const Config& c, const LayerPlan& plan) {
  for (const LayerKind& kind : plan.kinds)
    if (kind.position_key == "position") return;
  std::string key, value = "set";
  if (c.position.IsMap())
    for (const auto& entry : c.position)
      if (entry.first.Scalar() != "name") {
        key = entry.first.Scalar();
        break;
      }
  if (key.empty()) {
    if (c.position_name == Config().position_name) return;
    for (const LayerKind& kind : plan.kinds)
      if (kind.position_name == c.position_name) return;
    key = "name";
    value = "'" + c.position_name + "'";
  }
  OptionReader(c.position, c.source, "position")
      .fail(key, "is " + value + ", but no layer takes the position section: every kind of layers.pattern " +
                     flow_text(c.layers["pattern"]) +
                     " names its own method (a pattern entry that names a method takes it with its defaults); "
                     "give the method to a kind (layers.kinds.NAME.position) or remove it");
}
}  // namespace

LayerPlan layer_plan(const Config& c) {
  LayerPlan plan;
  const int64_t depth = c.model.layers;
  if (c.layer_pattern.empty()) {
    const YAML::Node kinds = c.layers.IsMap() ? c.layers["kinds"] : YAML::Node();
    if (kinds && !(kinds.IsMap() && kinds.size() == 0))
      OptionReader(c.layers, c.source, "layers").fail("kinds", "is given but layers.pattern is empty: name the kinds in the order of the layers");
    plan.kinds.push_back({"", c.position_name, c.position, "position", c.model.attention_options});
    plan.layer_kind.assign(depth, 0);
    for (int64_t l = 0; l < depth; ++l) plan.layer_index.push_back(l);
    return plan;
  }
  const OptionReader layers(c.layers, c.source, "layers");
  const int64_t period = int64_t(c.layer_pattern.size());
  if (depth % period != 0)
    layers.fail("pattern", "has " + std::to_string(period) + " entries and model.layers is " + std::to_string(depth) +
                               ": the pattern repeats over depth, so the number of layers must be a multiple of it");
  const YAML::Node kinds = c.layers["kinds"];
  if (kinds && !kinds.IsNull() && !kinds.IsMap())
    layers.fail("kinds", "expected a map of NAME: {position: ..., attention: {...}}, got '" + yaml_to_string(kinds) + "'");
  const OptionReader kinds_reader(kinds && kinds.IsMap() ? kinds : YAML::Node(YAML::NodeType::Map), c.source, "layers.kinds");
  std::vector<int64_t> pattern_kind;
  for (const std::string& name : c.layer_pattern) {
    if (!valid_kind_name(name))
      layers.fail("pattern", "'" + name + "' is not a kind name (letters, digits and '_')");
    int64_t k = 0;
    while (k < int64_t(plan.kinds.size()) && plan.kinds[k].name != name) ++k;
    pattern_kind.push_back(k);
    if (k < int64_t(plan.kinds.size())) continue;
    // (Each YAML::Node below is rebound with reset(): assigning to a node that shares the
    // document's would overwrite the document's position section.)
    LayerKind kind{name, c.position_name, c.position, "position", c.model.attention_options};
    if (kinds_reader.has(name)) {
      const std::string where = "layers.kinds." + name;
      const YAML::Node node = kinds[name];
      if (!node.IsMap())
        kinds_reader.fail(name, "expected a map {position: ..., attention: {...}}, got '" + yaml_to_string(node) + "'");
      const OptionReader r(node, c.source, where);
      r.accept("position", "");
      r.accept("attention", "");
      r.finish();
      if (r.has("position")) {
        const YAML::Node p = node["position"];
        kind.position_key = where + ".position";
        if (p.IsScalar()) {
          kind.position_name = p.Scalar();
          kind.position.reset(YAML::Node(YAML::NodeType::Map));
        } else if (p.IsMap() && p["name"] && p["name"].IsScalar()) {
          kind.position_name = p["name"].Scalar();
          kind.position.reset(p);
        } else {
          r.fail("position", "expected a method name or a map with 'name'");
        }
      }
      if (r.has("attention")) {
        if (!node["attention"].IsMap())
          r.fail("attention", "expected a map of key: value, got '" + yaml_to_string(node["attention"]) + "'");
        read_attention_keys(OptionReader(node["attention"], c.source, where + ".attention"), kind.attention);
      }
    } else {  // a position method's name: that method, with the attention section
      kind.position_name = name;
      kind.position.reset(YAML::Node(YAML::NodeType::Map));
      kind.position_key = "layers.pattern";
    }
    plan.kinds.push_back(kind);
  }
  if (kinds && kinds.IsMap())
    for (const auto& entry : kinds)
      if (std::find(c.layer_pattern.begin(), c.layer_pattern.end(), entry.first.Scalar()) == c.layer_pattern.end())
        kinds_reader.fail(entry.first.Scalar(), "is not used by layers.pattern (" + flow_text(c.layers["pattern"]) +
                                                    "): use it or remove it");
  refuse_untaken_position(c, plan);
  std::vector<int64_t> seen(plan.kinds.size(), 0);
  for (int64_t l = 0; l < depth; ++l) {
    const int64_t k = pattern_kind[l % period];
    plan.layer_kind.push_back(k);
    plan.layer_index.push_back(seen[k]++);
  }
  return plan;
}

}  // namespace extrap
