#include "core/model/memory_estimate.h"

#include "core/model/adaptive.h"
#include "positions/position.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace extrap {

namespace {

// Saturating arithmetic: an absurd config gives kHuge (8 EiB), never a wrapped negative estimate.
constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (a <= 0 || b <= 0) return 0;
  return __builtin_mul_overflow(a, b, &r) ? kHuge : r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kHuge : r;
}

int64_t meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream parse(line.substr(field.size() + 1));
    int64_t kib = -1;
    parse >> kib;
    return kib >= 0 ? kib * 1024 : -1;
  }
  return -1;
}

int64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t process_virtual_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return 0;
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  if (bytes >= kHuge) return "more than 8 EiB";
  char text[32];
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024 * 1024 * 1024) std::snprintf(text, sizeof text, "%.1f PiB", b / (1024.0 * 1024 * 1024 * 1024 * 1024));
  else if (b >= 1024.0 * 1024 * 1024 * 1024) std::snprintf(text, sizeof text, "%.1f TiB", b / (1024.0 * 1024 * 1024 * 1024));
  else if (b >= 1024.0 * 1024 * 1024) std::snprintf(text, sizeof text, "%.1f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(text, sizeof text, "%.0f MiB", b / (1024.0 * 1024));
  return text;
}

int64_t MemoryEstimate::total() const {
  return add(add(parameters, gradients), add(optimizer, activations));
}

std::string MemoryEstimate::parts() const {
  return "weights " + format_bytes(parameters) + ", gradients " + format_bytes(gradients) +
         ", optimiser state " + format_bytes(optimizer) + ", activations " + format_bytes(activations);
}

int64_t parameter_count_estimate(const Config& c, int64_t vocab_size) {
  const ModelConfig& m = c.model;
  const int64_t d = m.d_model, f = m.ffn_width(), kv = mul(m.key_value_heads(), m.d_head());
  const int64_t q = mul(m.heads, m.d_head());  // d unless model.head_dim says otherwise
  const int64_t b = m.bias ? 1 : 0, ffn_matrices = m.gated_ffn() ? 3 : 2;
  const int64_t norms = m.block == BlockKind::parallel_shared      ? 1
                       : m.sublayer_norms == SublayerNorms::both ? 4  // before and after each sublayer
                                                                 : 2;
  // q, k, v and out; the feed-forward matrices; their biases; the norms (weight, and bias); qk_norm's.
  int64_t per_layer = add(mul(d, add(mul(2, q), mul(2, kv))), mul(mul(ffn_matrices, d), f));
  per_layer = add(per_layer, mul(b, add(add(add(q, mul(2, d)), mul(2, kv)), mul(ffn_matrices - 1, f))));  // q; out, ffn_out; k, v; ffn_in
  if (!m.bias && m.qkv_bias) per_layer = add(per_layer, add(q, mul(2, kv)));  // q, k and v's biases alone
  const int64_t each = m.norm_affine ? (m.norm_biased() ? 2 : 1) : 0;  // a norm's parameters per value
  per_layer = add(per_layer, mul(mul(norms, d), each));
  if (m.qk_norm)  // each head's d_head, or the projections' q and kv values
    per_layer = add(per_layer, mul(m.qk_norm_over == QkNormOver::head ? mul(2, m.d_head()) : add(q, kv), each));
  int64_t total = add(vocabulary_parameters(m, vocab_size), mul(m.layers, per_layer));
  if (m.embedding_norm) total = add(total, mul(d, each));
  const LayerPlan plan = layer_plan(c);
  for (int64_t kind : plan.layer_kind) {
    const AttentionConfig& a = plan.kinds[kind].attention;  // sink and SSMax (H,) each; the gate's projection
    if (a.sink) total = add(total, m.heads);
    if (a.ssmax) total = add(total, m.heads);
    if (a.gate != AttentionGate::none) total = add(total, mul(d, a.gate == AttentionGate::headwise ? m.heads : q));
  }
  if (!m.tie_embeddings) total = add(total, mul(vocab_size, d));
  if (m.final_norm) total = add(total, mul(d, each));
  return total;
}

double forward_flops(const ModelConfig& m, int64_t vocab_size, int64_t windows, int64_t length, int64_t scored) {
  const double d = double(m.d_model), tokens = double(windows) * double(length);
  const double kv = double(m.key_value_heads() * m.d_head()), q = double(m.heads * m.d_head());
  // q and out, k and v (grouped-query: kv_heads of them); the FFN's two or three
  const double projections = 2.0 * d * q + 2.0 * d * kv + (m.gated_ffn() ? 3.0 : 2.0) * d * double(m.ffn_width());
  const double pairs = double(windows) * double(length) * (double(length) + 1.0) / 2.0;
  return double(m.layers) * (2.0 * tokens * projections + 4.0 * pairs * q) + 2.0 * double(scored) * d * double(vocab_size);
}

int64_t vocabulary_parameters(const ModelConfig& m, int64_t vocab_size) {
  if (!m.adaptive()) return mul(vocab_size, m.d_model);
  // Each band's embedding and projection, and the clusters' logits (core/model/adaptive.h).
  int64_t total = mul(int64_t(m.adaptive_cutoffs.size()), m.d_model), begin = 0;
  for (size_t k = 0; k <= m.adaptive_cutoffs.size(); ++k) {
    const int64_t end = k < m.adaptive_cutoffs.size() ? m.adaptive_cutoffs[k] : vocab_size;
    const int64_t width = adaptive_band_width(m.d_model, std::max<int64_t>(m.adaptive_factor, 1), int64_t(k));
    total = add(total, mul(add(std::max<int64_t>(end - begin, 0), m.d_model), width));
    begin = end;
  }
  return total;
}

namespace {
int64_t saturating(double value) {
  return value >= 9.0e18 ? std::numeric_limits<int64_t>::max() : int64_t(value);
}
}  // namespace

MemoryEstimate estimate_training_memory(const Config& c, int64_t vocab_size) {
  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  MemoryEstimate e;
  const int64_t params = parameter_count_estimate(c, vocab_size);
  e.parameters = mul(params, 4);
  e.gradients = e.parameters;
  e.optimizer = t.optimizer == OptimizerKind::nag ? e.parameters : mul(e.parameters, 2);  // momentum; AdamW's moments
  const int64_t sequences = std::max<int64_t>(t.accumulation, t.batch_tokens / std::max<int64_t>(t.seq_len, 1));
  const int64_t micro = std::max<int64_t>(1, sequences / t.accumulation);
  const int64_t tokens = mul(micro, t.seq_len);
  const int64_t pairs = mul(t.seq_len, t.seq_len);
  const int64_t scores = mul(mul(micro, m.heads), pairs);
  const int64_t common = add(mul(tokens, add(mul(10, m.d_model), mul(m.gated_ffn() ? 4 : 2, m.ffn_width()))), mul(scores, 2));
  int64_t layers = 0;
  const LayerPlan plan = layer_plan(c);
  for (int64_t kind : plan.layer_kind) {
    // A position method's own share (CoPE's gates, FIRE's MLP): PositionInfo's measured factors.
    const LayerKind& k = plan.kinds[kind];
    double method_scores = 0, method_pairs = 0;
    if (PositionRegistry::instance().contains(k.position_name)) {
      const PositionInfo& info = PositionRegistry::instance().get(k.position_name);
      method_scores = info.training_scores;
      method_pairs = info.training_pairs;
    }
    // The reference path's own copies of the scores for the attention options (core/attention/attention.cpp):
    // the sink's extra column (the widened scores and their softmax) and SSMax's scaled scores
    // (the masked copy, the product, the refilled result and the mask).
    if (k.attention.sink) method_scores += 2;
    if (k.attention.ssmax) method_scores += 3.25;
    if (k.attention.softcap > 0) method_scores += 2;  // the capped copy and tanh's output, kept for its gradient
    layers = add(layers, add(common, add(saturating(double(scores) * method_scores), saturating(double(pairs) * method_pairs))));
  }
  // The logits and their gradient: every word's, or with adaptive bands the head's for every
  // token and a tail's for a tenth of them (the estimate errs low).
  int64_t outputs = vocab_size;
  if (m.adaptive())
    outputs = add(m.adaptive_cutoffs.front() + int64_t(m.adaptive_cutoffs.size()),
                  (vocab_size - m.adaptive_cutoffs.front()) / 10);
  // (The final softcap's: tanh's output, kept for its gradient, and the capped logits.)
  const int64_t logit_copies = m.logit_softcap > 0 ? 4 : 2;
  const int64_t values = add(layers, add(mul(tokens, mul(3, m.d_model)), mul(mul(tokens, outputs), logit_copies)));
  e.activations = mul(values, 4);
  return e;
}

int64_t available_memory_bytes() {
  int64_t best = meminfo_bytes("MemAvailable");
  const auto consider = [&](int64_t bytes) {
    if (bytes >= 0) best = best < 0 ? bytes : std::min(best, bytes);
  };
  const int64_t limit = read_number("/sys/fs/cgroup/memory.max");
  const int64_t used = read_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) consider(std::max<int64_t>(0, limit - used));
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    consider(std::max<int64_t>(0, int64_t(as.rlim_cur) - process_virtual_bytes()));
  return best;
}

void check_memory(int64_t bytes, const std::string& what, const std::string& advice) {
  const int64_t available = available_memory_bytes();
  if (available < 0 || bytes <= available) return;
  throw ConfigError(what + " needs " + (bytes >= kHuge ? "" : "about ") + format_bytes(bytes) + " of memory, and " +
                    format_bytes(available) + " is available; " + advice);
}

void check_training_memory(const Config& c, int64_t vocab_size) {
  if (c.train.device != Device::cpu) return;  // GPU memory is not estimated here
  const MemoryEstimate e = estimate_training_memory(c, vocab_size);
  const int64_t state = add(add(e.parameters, e.gradients), e.optimizer);
  const std::string n = std::to_string(c.model.d_model), f = std::to_string(c.model.ffn_width()),
                    l = std::to_string(c.model.layers), b = std::to_string(c.train.batch_tokens);
  // Name the keys behind the larger part, with their values.
  const std::string advice =
      state >= e.activations
          ? "lower model.d_model (" + n + "), model.d_ffn (" + f + ") or model.layers (" + l + ")"
          : "lower train.batch_tokens (" + b + ") or train.seq_len, or raise train.accumulation";
  check_memory(e.total(), c.source + ": training this config (" + e.parts() + ")", advice);
}

}  // namespace extrap
