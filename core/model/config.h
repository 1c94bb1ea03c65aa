// The experiment configuration: what a YAML file (plus --set overrides) resolves to.
//
// Every key is declared once, in config.cpp, with its default and help text; `extrap keys`
// prints them all. Unknown keys and wrong types are errors naming the file, line and key.
#pragma once

#include "core/attention/attention.h"
#include "core/base/yaml_options.h"
#include "core/data/corpus.h"
#include "core/data/retrieval_task.h"
#include "core/kernels/precision.h"

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace extrap {

// model.activation: the mlp's. gelu: GELU with erf (exact); gelu_tanh: GELU's tanh approximation,
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2's gelu_new, BLOOM); relu.
enum class Activation { gelu, relu, gelu_tanh };
// model.norm: the normalisation of every norm of the model (the blocks', the final one, and
// embedding_norm's and qk_norm's where asked): LayerNorm, or RMSNorm (Zhang and Sennrich, 2019;
// Llama: x / sqrt(mean(x^2) + eps) times a weight, no mean subtracted).
enum class NormKind { layernorm, rmsnorm };
// model.ffn: the feed-forward part. mlp: W2 act(W1 x + b1) + b2 with model.activation; swiglu
// and geglu (Shazeer, 2020; Llama, PaLM): W2 (act(W_g x) o (W_u x)) with SiLU or GELU on the
// gate (geglu: model.activation's GELU, erf or tanh as Gemma's), W_g and W_u one product of 2
// d_ffn outputs, the gate's first.
enum class FfnKind { mlp, swiglu, geglu };
// model.block: the residual pattern. sequential: x + attn(n1(x)), then + ffn(n2(.)) (GPT-2,
// Llama); parallel: x + attn(n1(x)) + ffn(n2(x)) (GPT-NeoX, Pythia); parallel_shared: one norm
// for both, x + attn(n(x)) + ffn(n(x)) (GPT-J, PaLM, Falcon).
enum class BlockKind { sequential, parallel, parallel_shared };
// model.sublayer_norms: where a sequential block's norms sit around each sublayer f (attention,
// feed-forward). input: x + f(n(x)) (pre-norm: GPT-2, Llama); output: x + n(f(x)) (OLMo 2: the
// sublayer reads the residual stream itself); both: x + n_out(f(n(x))) (Gemma 2 and 3).
enum class SublayerNorms { input, output, both };
// model.qk_norm_over: what qk_norm normalises. head: each head's d_head values, one norm shared
// by the heads (Qwen3, Gemma 3); projection: all the query heads' values together (heads x
// d_head) and all the key heads' (kv_heads x d_head), before they split into heads (OLMo 2).
enum class QkNormOver { head, projection };
// model.init: LibTorch's Linear initialisation everywhere, or fairseq's for the attention
// projections (q, k, v Xavier-uniform with gain 1/sqrt(2), the output Xavier-uniform with a zero
// bias; fairseq's MultiheadAttention.reset_parameters), the rest as LibTorch's.
enum class InitKind { torch, fairseq };
enum class Objective { causal_lm, masked_lm };
// cosine_restarts: fairseq's `cosine` scheduler (the ALiBi paper's), core/train/trainer.h.
enum class Schedule { cosine, inverse_sqrt, constant, cosine_restarts };
enum class OptimizerKind { adamw, nag };
enum class Device { cpu, cuda };
template <>
struct EnumNames<Activation> {
  static constexpr std::array<std::pair<const char*, Activation>, 3> table{
      {{"gelu", Activation::gelu}, {"relu", Activation::relu}, {"gelu_tanh", Activation::gelu_tanh}}};
};
template <>
struct EnumNames<NormKind> {
  static constexpr std::array<std::pair<const char*, NormKind>, 2> table{
      {{"layernorm", NormKind::layernorm}, {"rmsnorm", NormKind::rmsnorm}}};
};
template <>
struct EnumNames<FfnKind> {
  static constexpr std::array<std::pair<const char*, FfnKind>, 3> table{
      {{"mlp", FfnKind::mlp}, {"swiglu", FfnKind::swiglu}, {"geglu", FfnKind::geglu}}};
};
template <>
struct EnumNames<BlockKind> {
  static constexpr std::array<std::pair<const char*, BlockKind>, 3> table{
      {{"sequential", BlockKind::sequential}, {"parallel", BlockKind::parallel},
       {"parallel_shared", BlockKind::parallel_shared}}};
};
template <>
struct EnumNames<SublayerNorms> {
  static constexpr std::array<std::pair<const char*, SublayerNorms>, 3> table{
      {{"input", SublayerNorms::input}, {"output", SublayerNorms::output}, {"both", SublayerNorms::both}}};
};
template <>
struct EnumNames<QkNormOver> {
  static constexpr std::array<std::pair<const char*, QkNormOver>, 2> table{
      {{"head", QkNormOver::head}, {"projection", QkNormOver::projection}}};
};
template <>
struct EnumNames<InitKind> {
  static constexpr std::array<std::pair<const char*, InitKind>, 2> table{
      {{"torch", InitKind::torch}, {"fairseq", InitKind::fairseq}}};
};
template <>
struct EnumNames<Objective> {
  static constexpr std::array<std::pair<const char*, Objective>, 2> table{
      {{"causal_lm", Objective::causal_lm}, {"masked_lm", Objective::masked_lm}}};
};
template <>
struct EnumNames<Schedule> {
  static constexpr std::array<std::pair<const char*, Schedule>, 4> table{
      {{"cosine", Schedule::cosine},
       {"inverse_sqrt", Schedule::inverse_sqrt},
       {"constant", Schedule::constant},
       {"cosine_restarts", Schedule::cosine_restarts}}};
};
template <>
struct EnumNames<OptimizerKind> {
  static constexpr std::array<std::pair<const char*, OptimizerKind>, 2> table{
      {{"adamw", OptimizerKind::adamw}, {"nag", OptimizerKind::nag}}};
};
template <>
struct EnumNames<Device> {
  static constexpr std::array<std::pair<const char*, Device>, 2> table{
      {{"cpu", Device::cpu}, {"cuda", Device::cuda}}};
};
// train.cuda_graph: whether a GPU training step is captured once as a CUDA graph and replayed
// (core/train/graphed_step.h). auto: where it can be (one process on a GPU), else eagerly;
// on: an error where it cannot be; off: never.
enum class CudaGraphMode { automatic, on, off };
template <>
struct EnumNames<CudaGraphMode> {
  static constexpr std::array<std::pair<const char*, CudaGraphMode>, 3> table{
      {{"auto", CudaGraphMode::automatic}, {"on", CudaGraphMode::on}, {"off", CudaGraphMode::off}}};
};
inline torch::Device torch_device(Device device) {
  return device == Device::cuda ? torch::kCUDA : torch::kCPU;
}

// How each head's attention output is gated before the output projection (Qiu et al. 2025):
// times sigmoid(x W_g) of the layer's normalised input x, one gate per head or per channel.
enum class AttentionGate { none, headwise, elementwise };
template <>
struct EnumNames<AttentionGate> {
  static constexpr std::array<std::pair<const char*, AttentionGate>, 3> table{
      {{"none", AttentionGate::none}, {"headwise", AttentionGate::headwise}, {"elementwise", AttentionGate::elementwise}}};
};

// The config's `attention` section: options that combine with every position method
// (REFERENCE.md, "The 2024-26 wave"). The defaults are plain softmax attention.
struct AttentionConfig {
  bool sink = false;        // a learned sink logit per head and layer (gpt-oss)
  bool ssmax = false;       // SSMax: logits times s_h ln n_i, s learned per head and layer
  double ssmax_init = 0;    // s's initial value; 0: 1 / ln(train.seq_len), plain softmax at n = L
  double temperature = 0;   // Llama 4: q at position p times 1 + a ln(floor((p + 1) / F) + 1); a, 0: off
  int64_t temperature_floor = 8192;  // F
  AttentionGate gate = AttentionGate::none;
  int64_t window = 0;       // sliding window of W tokens (0: full attention)
  int64_t chunk = 0;        // chunked attention, C tokens a chunk (0: off)
  double softcap = 0;       // attention logit soft-capping: q.k / sqrt(d) -> C tanh(q.k / (sqrt(d) C)) (Gemma 2; 0: off)
  double scale_dim = 0;     // scores q.k / sqrt(s) instead of / sqrt(d_head) (Gemma 2 and 3's query_pre_attn_scalar; 0: d_head)
  bool active() const {
    return sink || ssmax || temperature > 0 || gate != AttentionGate::none || window > 0 || chunk > 0 || softcap > 0 ||
           scale_dim > 0;
  }
  std::string describe() const;  // "sink, window 64" ("" when none is set)
};

// One kind of layer of a layer pattern (the `layers` section): the position method and the
// attention options its layers take. Without a pattern every layer is one kind, named "",
// made of the `position` and `attention` sections.
struct LayerKind {
  std::string name;            // its name in layers.pattern ("": no pattern)
  std::string position_name;
  YAML::Node position;         // the method's options ({name: ..., ...}), as written
  std::string position_key;    // where they were read: "position" or "layers.kinds.NAME.position"
  AttentionConfig attention;   // the `attention` section with the kind's own keys over it
};

// Each layer's kind. Kinds are listed in the order the pattern first uses them; a layer of a
// kind is that kind's layer number layer_index[l] (0, 1, ... in depth order), so that a method
// with per-layer parameters keeps one set per layer of its kind.
struct LayerPlan {
  std::vector<LayerKind> kinds;
  std::vector<int64_t> layer_kind;   // model.layers entries: an index into kinds
  std::vector<int64_t> layer_index;  // the layer's number among the layers of its kind
  bool patterned() const { return !kinds.empty() && !kinds.front().name.empty(); }
  int64_t layers_of(int64_t kind) const;
};

struct ModelConfig {
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t heads = 8;
  int64_t kv_heads = 0;             // grouped-query attention: K and V heads (0: heads; 1: multi-query)
  int64_t head_dim = 0;             // each head's width (0: d_model / heads; Qwen3-0.6B, Mistral-Nemo, Gemma differ)
  int64_t d_ffn = 1024;             // 0: by rule (ffn_width)
  int64_t ffn_multiple = 256;       // d_ffn 0 with a GLU: Llama's width rounded up to a multiple of this
  double dropout = 0.1;
  double attention_dropout = 0.0;
  double activation_dropout = 0.0;  // on the FFN's hidden activations
  Activation activation = Activation::gelu;  // the mlp's
  FfnKind ffn = FfnKind::mlp;
  NormKind norm = NormKind::layernorm;
  double norm_eps = 1e-5;
  bool bias = true;                 // false: no bias in any linear layer or norm (Llama, MPT)
  std::optional<bool> norm_bias;    // the norms' biases where they differ from `bias` (Falcon: none in
                                    // the linear layers, LayerNorms with them); unset: `bias`
  bool qkv_bias = false;            // with bias false: biases on the q, k and v projections alone (Qwen2)
  bool norm_affine = true;          // false: every norm without weight or bias, x normalised alone (OLMo's LayerNorm)
  double clip_qkv = 0;              // q, k and v clamped to [-C, C] after their projection (OLMo's, MPT's clip_qkv; 0: off)
  bool scale_embedding = true;      // the token embedding times sqrt(d_model) (fairseq; false: GPT-2, Llama)
  BlockKind block = BlockKind::sequential;
  SublayerNorms sublayer_norms = SublayerNorms::input;  // the norms before (input), after (output) or around each sublayer
  bool qk_norm = false;             // a norm of q and k before the position method
  QkNormOver qk_norm_over = QkNormOver::head;  // each head's (d_head wide) or the whole projection's
  bool embedding_norm = false;      // a norm right after the token embedding (BLOOM)
  bool tie_embeddings = true;
  bool final_norm = true;           // a norm before the output projection
  double logit_softcap = 0;         // the output logits l -> C tanh(l / C) (Gemma 2's final softcapping, C 30; 0: off)
  InitKind init = InitKind::torch;
  // Adaptive input and softmax (core/model/adaptive.h): the band ends below V (empty: a plain
  // embedding and softmax), each band D / factor^k wide, the softmax's dropout.
  std::vector<int64_t> adaptive_cutoffs;
  int64_t adaptive_factor = 4;
  double adaptive_dropout = 0.0;
  Objective objective = Objective::causal_lm;
  AttentionBackend attention = AttentionBackend::Auto;
  int64_t efficient_threshold = 256 * 256;  // Tq*Tk above which inference takes the efficient path (biases the fused kernel lacks)
  AttentionConfig attention_options;      // the `attention` section (every layer)
  bool causal() const { return objective == Objective::causal_lm; }
  bool adaptive() const { return !adaptive_cutoffs.empty(); }
  int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t d_head() const { return head_dim > 0 ? head_dim : d_model / heads; }
  bool gated_ffn() const { return ffn != FfnKind::mlp; }
  // whether the norms have biases (none without their weights)
  bool norm_biased() const { return norm_affine && norm_bias.value_or(bias); }
  // The feed-forward hidden width: d_ffn, or with d_ffn 0 by rule: 4 d_model for the mlp; for a GLU
  // Llama's, 2/3 of 4 d_model (truncated) rounded up to a multiple of ffn_multiple (the same number of
  // parameters as the mlp's 4 d_model in three matrices instead of two, to the rounding).
  int64_t ffn_width() const;
};

struct TrainConfig {
  int64_t seq_len = 256;
  int64_t batch_tokens = 8192;     // tokens per optimiser step (all accumulation steps)
  int64_t accumulation = 1;        // micro-batches per optimiser step
  int64_t steps = 1000;
  double lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup = 100;
  Schedule schedule = Schedule::cosine;
  // cosine_restarts: warm-up from warmup_init_lr; periods of `period` updates (0: steps -
  // warmup), each t_mult times the last; lr and min_lr times lr_shrink^i in period i.
  double warmup_init_lr = 0.0;
  int64_t period = 0;
  double t_mult = 1.0;
  double lr_shrink = 1.0;
  OptimizerKind optimizer = OptimizerKind::adamw;
  double momentum = 0.99;          // nag
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.98;
  double eps = 1e-8;
  double clip = 1.0;               // max gradient norm; 0 disables
  int64_t seed = 1;
  int64_t validate_every = 250;
  int64_t validate_tokens = 65536; // validation tokens per check (0: the whole split)
  int64_t checkpoint_every = 500;
  int64_t log_every = 10;
  std::string out_dir = "runs/default";
  int64_t threads = 0;             // 0: all available cores
  Device device = Device::cpu;
  Precision precision = Precision::fp32;  // training's matrix products (evaluation is fp32)
  double mask_prob = 0.15;         // masked_lm: fraction of tokens selected
  CudaGraphMode cuda_graph = CudaGraphMode::automatic;  // GPU steps as one CUDA graph
};

struct EvalConfig {
  std::vector<int64_t> lengths = {256, 512, 1024};
  std::vector<int64_t> strides = {};  // sliding-window strides; empty: non-overlapping only
  Split split = Split::valid;
  int64_t batch_tokens = 16384;       // tokens per evaluation forward pass
  int64_t max_tokens = 0;             // evaluate on the first N tokens of the split (0: all)
  int64_t mask_seed = 1234;           // masked_lm: fixed selection seed
};

struct Config {
  CorpusOptions data;
  RetrievalTask task = RetrievalTask::none;  // data.task: retrieval instances mixed into training
  double task_fraction = 0;                  // data.task_fraction: the share of sequences
  ModelConfig model;
  YAML::Node position = YAML::Node(YAML::NodeType::Map);  // {name: ..., method options}
  std::string position_name = "alibi";
  TrainConfig train;
  EvalConfig eval;
  // The `layers` section: layers.pattern, kind names repeated over depth (empty: every layer
  // is `position` with `attention`), and the document's `layers` node (layers.kinds as written,
  // with its line numbers).
  std::vector<std::string> layer_pattern;
  YAML::Node layers = YAML::Node(YAML::NodeType::Map);
  std::vector<std::string> plugins;
  std::string source = "(defaults)";  // where it was read from

  // The resolved config as YAML (round-trips through from_yaml).
  YAML::Node to_yaml() const;
  // The keys whose values change the trained model (Affects::model), plus the position
  // section: a run directory's identity, compared on resume, training and evaluation.
  YAML::Node model_keys() const;
  // model_keys() plus the keys that change recorded numbers (Affects::evaluation).
  YAML::Node result_keys() const;
};

// Decodes a config document. `source` names it in errors. Position options are checked
// when the method is built (they belong to the method's own file).
Config config_from_yaml(const YAML::Node& root, const std::string& source);

// The layers of config's model, each with its position method and attention options: the
// `layers` section resolved over `position` and `attention`. Refuses (ConfigError naming the
// file, line and key) a pattern that does not divide model.layers, a kind that the pattern does
// not use, and unknown keys in a kind. The position methods themselves are checked when built
// (check_position_method, core/model/model.h).
LayerPlan layer_plan(const Config& config);

// Loads `path` (may be empty: defaults), applies --set overrides, decodes.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

// `position: NAME` -> `position: {name: NAME}` in a config's YAML, so that position.KEY can be
// set by --set or a sweep's grid.
void position_as_map(YAML::Node root);

// Every config key with default and help (the position method's own keys excluded).
std::vector<OptionDoc> config_documentation();

// The one rule for an evaluation plan's window lengths, multiples of train.seq_len and
// sliding-window strides, wherever they are given (eval.* in a config or a sweep file,
// eval.retrieval's instance lengths, extrap eval's --length and --stride): each at least 1 and
// none listed twice. `refuse` reports the first value that breaks it, at the caller's own name
// for the list; it must throw.
enum class EvalLengthList { lengths, length_multiples, strides };
enum class EvalLengthProblem { below_one, listed_twice };
using EvalLengthRefusal =
    std::function<void(EvalLengthList list, int64_t value, EvalLengthProblem problem)>;
void check_eval_lengths(const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& length_multiples,
                        const std::vector<int64_t>& strides, const EvalLengthRefusal& refuse);
// The same in a config section: fails at the section's key "lengths", "length_multiples" or
// "strides" ("must be at least 1, got 0"; "64 is listed twice").
void check_eval_lengths(const OptionReader& section, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& length_multiples,
                        const std::vector<int64_t>& strides);

}  // namespace extrap
