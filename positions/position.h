// The position-method plugin interface and its registry.
//
// A position method can act at three points of the transformer and overrides only those it
// needs:
//   1. embed():     add to the (already scaled) token embeddings       (sinusoidal, learned)
//   2. rotate_qk(): transform q and k in every layer                    (rotary, xpos)
//   3. bias():      describe what is added to the attention scores      (ALiBi, T5, KERPLE,
//                   FIRE, Sandwich; from the layer input: fox; from q.k: cope)
// A method is a torch::nn::Module so that learned parameters are registered, trained and
// checkpointed with the model. The bias stays a description (core/attention/attention.h): a method
// says *what* is added, each attention backend decides how to compute it.
//
// Adding a method: one new file in positions/ (or a plugin .so) that defines the class, its
// options (decoded from YAML in that same file) and one EXTRAP_REGISTER_POSITION line.
#pragma once

#include "core/attention/attention.h"
#include "core/base/yaml_options.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace extrap {

// How training windows take their positions (training only; evaluation always uses
// offset .. offset + T - 1). Set from the options every randomizable method accepts:
//   position.randomize_max: N   a sorted random sample of T distinct positions from [0, N)
//                               (Ruoss et al., 2023);
//   position.pose_target: N     PoSE (Zhu et al., ICLR 2024): the window is cut at random into
//                               pose_chunks chunks of consecutive positions; chunk 0 starts at 0,
//                               chunk c > 0 after a random skip, skips non-decreasing, so that
//                               every position stays below N.
// One draw per forward pass, shared by the batch's rows and every layer, from LibTorch's
// default generator (train.seed makes it reproducible).
struct PositionSampling {
  enum class Kind { contiguous, random, pose };
  Kind kind = Kind::contiguous;
  int64_t range = 0;   // every drawn position is below it (0 when contiguous)
  int64_t chunks = 2;  // pose: the number of chunks

  bool active() const { return kind != Kind::contiguous; }
  // The config key that set it ("position.randomize_max", "position.pose_target"), for messages.
  std::string key() const;
  // (length,) int64 on the CPU, strictly increasing, below `range`. Refuses (c10::Error) a
  // window longer than the range or, for pose, shorter than its chunks.
  torch::Tensor draw(int64_t length) const;
};

// What the model tells a method when it is built.
struct PositionContext {
  int64_t num_layers = 1;
  int64_t num_heads = 1;
  int64_t d_model = 1;
  int64_t d_head = 1;
  bool causal = true;  // false: bidirectional (masked-LM) attention
  // How training windows take their positions; methods that keep tables check that
  // sampling.range fits.
  PositionSampling sampling;
};

// Where the tokens of a window sit: offset, offset + 1, ..., offset + T - 1, or, in training
// with sampled positions (PositionSampling), an explicit strictly increasing sample.
struct TokenPositions {
  int64_t offset = 0;
  int64_t length = 0;
  torch::Tensor sampled;  // (T,) int64 on the CPU, strictly increasing (grouped(): non-decreasing); undefined: contiguous
  // Where position-dependent scales (xpos) are measured from when the window is one block of
  // a longer sequence run block by block with a KV cache: one position for the whole sequence,
  // so that cached keys and new queries agree. -1: the window's own middle.
  int64_t centre = -1;

  // Self-Extend at evaluation (RopeScaling::neighbor_window, factor): keys at least this far from a
  // query are seen at grouped positions (grouped()); 0: off. Set by the model, not by methods.
  int64_t neighbor_window = 0;
  int64_t group_size = 0;
  // StreamingLLM at evaluation (TransformerLMImpl::set_streaming): each query sees the first
  // `stream_sinks` tokens and the last stream_cache - stream_sinks, at cache slots; 0: off. Set
  // by the model, not by methods: the attention layer runs each query's cache as a window of
  // stream_cache tokens at positions 0 .. stream_cache - 1, so methods never see more.
  int64_t stream_sinks = 0;
  int64_t stream_cache = 0;

  static TokenPositions window(int64_t length, int64_t offset = 0) { return {offset, length, {}}; }
  // Self-Extend's grouped positions of the same tokens: for the queries floor(p / G) + W -
  // floor(W / G), for the keys floor(p / G) (p each token's position, W the neighbour window, G
  // the group size). Explicit (`sampled`), non-decreasing rather than strictly increasing; both
  // sets share one `centre` (xpos).
  TokenPositions grouped(bool queries) const;
  bool is_sampled() const { return sampled.defined(); }
  // The T positions as a tensor of `options`' dtype and device.
  torch::Tensor values(torch::TensorOptions options = {}) const;
};

// What one layer's attention tells a method when it asks for a rotation or a bias.
struct LayerInput {
  int64_t layer = 0;
  TokenPositions positions;  // of the queries (the last of the keys)
  // (B, T, d_model): the normalised input that q, k and v are projected from. Undefined where
  // the caller has no model (e.g. `extrap inspect bias` without a checkpoint); a method that
  // needs it then describes its bias at a zero input.
  torch::Tensor input;
  // Decoding with a KV cache (core/model/model.h): the queries are the last T of `keys` keys, which
  // start at position positions.offset + T - keys; the bias then covers rows keys - T .. keys
  // - 1 of the keys x keys window (AttentionBias rows and columns count from its first key).
  // 0: the queries are the keys.
  int64_t keys = 0;
  // Decoding with a KV cache: a tensor the method may keep for this layer between the blocks
  // of one sequence (undefined at the first block), e.g. the forgetting gates' running sum.
  // Null without a cache.
  torch::Tensor* state = nullptr;

  int64_t length() const { return positions.length; }
  int64_t key_length() const { return keys > 0 ? keys : positions.length; }
};

// Evaluation-time scaling of rotary frequencies: a model trained with rotary angles at length
// L evaluated at longer lengths without retraining (the formulas: positions/rotation.h).
enum class RopeScalingKind { none, linear, ntk, dynamic, yarn, yarn_paper, llama3, longrope, self_extend };

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;          // s >= 1
  int64_t original_length = 0;  // L, the training length (yarn, dynamic, llama3)
  double beta_slow = 1.0;       // yarn, yarn_paper: components with L / wavelength below this interpolate
  double beta_fast = 32.0;      // yarn, yarn_paper: ... above this keep their frequency
  double low_freq_factor = 1.0;   // llama3: wavelengths above L / low_freq_factor interpolate
  double high_freq_factor = 4.0;  // llama3: ... below L / high_freq_factor keep their frequency
  // self_extend (Jin et al., ICML 2024): frequencies unchanged; keys within `neighbor_window` of a
  // query keep their positions, farther ones are seen at grouped positions (TokenPositions::
  // grouped), group size `factor` (a whole number).
  int64_t neighbor_window = 0;
  // longrope (LongRoPE, Ding et al. 2024, as Phi-3 uses it): pair k's frequency divided by
  // short_factor[k] while the window ends at or before L, by long_factor[k] past it (one factor a
  // rotated pair: the lists come from a checkpoint's rope_scaling); cos and sin times
  // attention_factor (0: sqrt(1 + ln s / ln L) for s > 1, else 1).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 0;

  bool active() const { return kind != RopeScalingKind::none; }
};

// "none", "linear", "ntk", "dynamic", "yarn", "yarn_paper", "llama3", "longrope", "self_extend"; parse_rope_scaling refuses any other
// name, naming `where` (a flag or key) and the known names.
std::string rope_scaling_name(RopeScalingKind kind);
RopeScalingKind parse_rope_scaling(const std::string& name, const std::string& where);
// Several variants by name, in the order given; a name listed twice is refused too
// ("WHERE: yarn is listed twice").
std::vector<RopeScalingKind> parse_rope_variants(const std::vector<std::string>& names,
                                                 const std::string& where);

// Refuses (ConfigError) a scaling that cannot be applied: a factor below 1 or not finite, no
// training length where the kind needs one, llama3's high_freq_factor not above
// low_freq_factor, yarn's beta_fast not above beta_slow.
void check_rope_scaling(const RopeScaling& scaling);

// Layer `layer` of a window of `length` tokens at `offset`, without a layer input.
inline LayerInput layer_window(int64_t layer, int64_t length, int64_t offset = 0) {
  return {layer, TokenPositions::window(length, offset), {}};
}

class PositionMethod : public torch::nn::Module {
 public:
  // x: (B, T, d_model) scaled token embeddings of the tokens at `positions`.
  virtual torch::Tensor embed(const torch::Tensor& x, const TokenPositions& /*positions*/) {
    return x;
  }

  // q, k: (B, H, T, d_head) of the tokens at at.positions, in layer at.layer.
  virtual void rotate_qk(torch::Tensor& /*q*/, torch::Tensor& /*k*/, const LayerInput& /*at*/) {}

  // What layer at.layer adds to its (T, T) attention scores.
  virtual AttentionBias bias(const LayerInput& /*at*/) { return AttentionBias::none(); }

  // Evaluation-time frequency scaling (RopeScaling). A method with rotary angles applies it
  // to every later forward pass and returns true; the rest return false (the model then
  // refuses, naming the method). A scaling that is not active restores the trained angles.
  virtual bool set_rope_scaling(const RopeScaling& /*scaling*/) { return false; }

  // Values worth logging during training (e.g. learned slopes): name -> value.
  virtual std::vector<std::pair<std::string, double>> log_values() const { return {}; }

  // How the config it was built from samples training positions; set by the registry.
  const PositionSampling& sampling() const { return sampling_; }

 private:
  friend class PositionRegistry;
  PositionSampling sampling_;
};

// Reads the options every method accepts, position.randomize_max, pose_target and
// pose_chunks, with their documentation; refuses bad values and both kinds at once.
PositionSampling read_sampling(const OptionReader& options);
// The keys that turn sampling on, each a range of positions (for checks made outside a method).
inline constexpr const char* kSampledPositionKeys[] = {"randomize_max", "pose_target"};

using PositionFactory = std::function<std::shared_ptr<PositionMethod>(
    const PositionContext& context, const OptionReader& options)>;

// Which hooks a method overrides (shown by `extrap positions`).
enum Hook : unsigned { kEmbed = 1u, kRotateQK = 2u, kBias = 4u };

// Which attention modes a method supports.
enum Mode : unsigned { kCausal = 1u, kBidirectional = 2u };

struct PositionInfo {
  std::string name;
  std::string description;
  unsigned hooks = 0;                     // Hook bits
  unsigned modes = kCausal;               // Mode bits
  std::vector<OptionDoc> options;         // every key its YAML options accept
  // Honours sampled positions (TokenPositions::sampled) in its hooks, so that
  // position.randomize_max and position.pose_target may be used with it.
  bool randomizable = false;
  // Accepts evaluation-time RoPE scaling (PositionMethod::set_rope_scaling): rotary, xpos.
  bool rope_scaling = false;
  // Why only the reference attention path takes the method's bias (the memory-efficient and
  // fused paths refuse it by name); "" when every path does.
  std::string reference_only;
  // For the training-memory estimate (core/model/memory_estimate.cpp): what each layer's reference
  // attention keeps for backward beyond the scores and probabilities, in float tensors of
  // the scores' size (B x H x T x T) and of T x T floats. Measured, not derived: see the
  // methods that set them.
  double training_scores = 0;
  double training_pairs = 0;
  // The method's parameters and buffers as an exported model holds them (`extrap export`):
  // each tensor's name under "position.", its shape, and how the model uses it (e.g. "slope =
  // softplus(raw)"). Empty for a method without tensors.
  std::string tensors;
  // For an unsupported mode: the method to use instead ("" if none), for the error message.
  std::string causal_alternative;
  std::string bidirectional_alternative;
  std::string mode_reason;  // why the other mode is not supported, for the same message
  PositionFactory factory;
  std::string origin = "built-in";        // or the plugin path
};

class PositionRegistry {
 public:
  static PositionRegistry& instance();

  // Throws if the name is already registered (naming both origins).
  void add(PositionInfo info);
  bool contains(const std::string& name) const;
  // Throws for an unknown name, listing the known ones.
  const PositionInfo& get(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  std::string randomizable_names() const;  // "learned, rotary, ..." for messages

  // Builds a method: checks the mode is supported (else suggests the alternative) and
  // decodes its options (unknown keys are errors naming `options.where()`).
  std::shared_ptr<PositionMethod> create(const std::string& name, const PositionContext& context,
                                         const OptionReader& options) const;

  // Loads a plugin .so: registers everything it declares with EXTRAP_REGISTER_POSITION.
  // Errors (missing file, not an extrap plugin, name clash) name the path.
  void load_plugin(const std::string& path);

 private:
  PositionRegistry() = default;
  void drain_pending(const std::string& origin);
  std::vector<PositionInfo> methods_;
};

// The documentation of an options struct with a `void read(const OptionReader&)` member.
template <class Options>
std::vector<OptionDoc> document_options() {
  auto documenter = OptionReader::documenter();
  Options().read(documenter);
  return documenter.docs();
}

// A factory for a method constructed as Method(context, options).
template <class Method, class Options>
PositionFactory factory_for() {
  return [](const PositionContext& context, const OptionReader& reader) {
    Options options;
    options.read(reader);
    return std::make_shared<Method>(context, options);
  };
}

namespace detail {
// Static registrations land here first; the registry takes them on first use (built-ins) or
// right after dlopen (plugins), so a name clash becomes an ordinary, catchable error.
std::vector<PositionInfo>& pending_registrations();
struct PositionRegistration {
  explicit PositionRegistration(PositionInfo (*make)()) {
    pending_registrations().push_back(make());
  }
};
}  // namespace detail

}  // namespace extrap

// One line per method, at namespace scope in the method's file:
//   EXTRAP_REGISTER_POSITION(alibi, make_alibi_info)
// where make_alibi_info() returns the method's PositionInfo.
#define EXTRAP_REGISTER_POSITION(id, make_info)                                   \
  static ::extrap::detail::PositionRegistration extrap_position_registration_##id( \
      &make_info)

// A plugin .so adds this once, so that the loader can tell it is an extrap plugin.
#define EXTRAP_PLUGIN()                                                \
  extern "C" __attribute__((visibility("default"))) int extrap_plugin_abi() { \
    return 1;                                                          \
  }
