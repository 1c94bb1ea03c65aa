#include "core/eval/evaluator.h"

#include "core/model/memory_estimate.h"
#include "core/runtime/distributed.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace extrap {

std::vector<EvalWindow> plan_windows(int64_t n, int64_t length, int64_t stride, bool causal) {
  TORCH_CHECK(length >= 1, "evaluation length must be at least 1, got ", length);
  std::vector<EvalWindow> windows;
  // Inputs available: causal windows stop one short of the end (the last token is only a target).
  const int64_t last = causal ? n - 1 : n;
  if (last <= 0) return windows;
  if (stride <= 0 || stride >= length) {
    for (int64_t b = 0; b < last; b += length) windows.push_back({b, std::min(length, last - b), 0});
    return windows;
  }
  int64_t end = std::min(length, last);
  windows.push_back({0, end, 0});
  while (end < last) {
    const int64_t next = std::min(end + stride, last);
    const int64_t begin = std::max<int64_t>(0, next - length);
    windows.push_back({begin, next - begin, end - begin});
    end = next;
  }
  return windows;
}

int64_t logit_chunk_rows(int64_t vocab_size) {
  const int64_t rows = kLogitChunkBytes / (int64_t(sizeof(float)) * std::max<int64_t>(vocab_size, 1));
  return std::clamp(rows, kLogitChunkMinRows, kLogitChunkRows);
}

namespace {
// SplitMix64: a small, well-mixed hash so the selection depends only on (seed, position).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double unit(uint64_t h) { return double(h >> 11) * (1.0 / 9007199254740992.0); }
}  // namespace

MaskDecision mask_decision(int64_t pos, int32_t token, double mask_prob, int64_t seed,
                           int32_t mask_token, int64_t vocab_size) {
  const uint64_t h = mix(uint64_t(seed) * 0x100000001b3ull ^ mix(uint64_t(pos)));
  MaskDecision d;
  d.input = token;
  if (unit(h) >= mask_prob) return d;
  d.selected = true;
  const uint64_t h2 = mix(h);
  const double u = unit(h2);
  if (u < 0.8) {
    d.input = mask_token;
  } else if (u < 0.9) {
    // Random real token (never the mask token itself).
    const int64_t real = mask_token >= 0 && mask_token < vocab_size ? vocab_size - 1 : vocab_size;
    int64_t r = int64_t(mix(h2) % uint64_t(real));
    if (mask_token >= 0 && r >= mask_token) ++r;
    d.input = int32_t(r);
  }
  return d;
}

RopeScaling rope_scaling_for(RopeScalingKind kind, double factor, int64_t train_length,
                             int64_t eval_length) {
  RopeScaling scaling;
  scaling.kind = kind;
  scaling.original_length = train_length;
  if (kind == RopeScalingKind::self_extend) {
    // Neighbour window W = L / 2; group size G given, or the least that keeps every distance
    // below L: floor((T - 1) / G) + W - floor(W / G) <= L - 1 (G = 1 up to L: the trained model).
    scaling.neighbor_window = std::max<int64_t>(1, train_length / 2);
    const int64_t W = scaling.neighbor_window, T = eval_length, L = train_length;
    int64_t G = 1;
    while (G < T && (T - 1) / G + W - W / G > L - 1) ++G;
    scaling.factor = factor > 0 ? factor : double(G);
  } else if (factor > 0) {
    scaling.factor = factor;
  } else if (kind != RopeScalingKind::dynamic && train_length > 0) {
    scaling.factor = std::max(1.0, double(eval_length) / double(train_length));
  }
  check_rope_scaling(scaling);
  return scaling;
}

std::string rope_variant_label(RopeScalingKind kind, double factor) {
  if (kind == RopeScalingKind::none) return "";
  std::string label = rope_scaling_name(kind);
  if (factor > 0) label += "_x" + number_text(factor);
  return label;
}

std::vector<int64_t> position_bin_edges(int64_t length) {
  std::vector<int64_t> edges{0};
  for (int j = 0; edges.back() < length; ++j) {
    const int64_t edge = std::llround(std::pow(2.0, double(j) / 4.0));
    if (edge > edges.back()) edges.push_back(std::min(edge, length));
  }
  return edges;
}

EvalSpec eval_spec_for(const Config& config, int64_t length, int64_t stride) {
  EvalSpec spec;
  spec.length = length;
  spec.stride = stride;
  spec.max_tokens = config.eval.max_tokens;
  spec.batch_tokens = config.eval.batch_tokens;
  spec.mask_prob = config.train.mask_prob;
  spec.mask_seed = config.eval.mask_seed;
  return spec;
}

void check_eval_length(const EvalSpec& spec, int64_t available, int64_t split_tokens, bool causal) {
  if (spec.length < 1)
    throw EvalFailure("evaluation length must be at least 1, got " + std::to_string(spec.length));
  if (spec.stride < 0)
    throw EvalFailure("stride must be positive (or 0: non-overlapping), got " + std::to_string(spec.stride));
  if (spec.streaming.active()) {
    if (spec.stride > 0 && spec.stride < spec.length)
      throw EvalFailure("StreamingLLM reads each window as one stream: a sliding stride (" +
                        std::to_string(spec.stride) + ") has no meaning with it");
    if (spec.rope_scaling.active())
      throw EvalFailure("StreamingLLM keeps positions below its cache of " +
                        std::to_string(spec.streaming.cache) + " tokens: a RoPE scaling (" +
                        rope_scaling_name(spec.rope_scaling.kind) + ") has no meaning with it");
    if (spec.streaming.sinks < 0 || spec.streaming.sinks >= spec.streaming.cache)
      throw EvalFailure("StreamingLLM: " + std::to_string(spec.streaming.sinks) + " sinks in a cache of " +
                        std::to_string(spec.streaming.cache) +
                        " tokens (sinks must be at least 0 and fewer than the cache)");
  }
  const int64_t needed = window_tokens(spec.length, causal);
  if (available < needed) {
    std::string what = std::to_string(available) + " tokens";
    if (available < split_tokens) what += " (the first " + spec.max_tokens_source + " of " + std::to_string(split_tokens) + ")";
    throw EvalFailure("evaluation length " + std::to_string(spec.length) + " needs at least " +
                      std::to_string(needed) + " tokens; the split has " + what);
  }
}

void check_window_memory(const TransformerLM& model, int64_t windows_per_batch, int64_t length,
                         int64_t attention_length) {
  const ModelConfig& m = model->config();
  const AttentionBackend backend = model->attention_backend();  // what evaluation forced, if it did
  // The reference attention path materialises (windows, heads, T, T) scores, probabilities and
  // bias per layer; refuse a batch that cannot fit rather than attempt the allocation.
  const int64_t span = attention_length > 0 ? std::min(attention_length, length) : length;
  const bool reference =
      backend == AttentionBackend::Reference ||
      (backend == AttentionBackend::Auto && span * span <= m.efficient_threshold);
  const double values =
      double(windows_per_batch) * double(length) * 8.0 * double(m.d_model) +
      (reference ? 3.0 * double(windows_per_batch) * double(m.heads) * double(span) * double(span)
                 : 0.0);
  const double bytes = std::min(values * 4.0, 9.0e18);
  check_memory(int64_t(bytes), "evaluating at length " + std::to_string(length),
               "lower eval.batch_tokens (--batch-tokens) or use the efficient attention path");
}

EvaluationScope::EvaluationScope(TransformerLM& model, const RopeScaling& scaling,
                                 const StreamingCache& streaming)
    : model_(model), scaling_(model->rope_scaling()), streaming_(model->streaming()),
      training_(model->is_training()) {
  model->eval();
  model->set_rope_scaling(scaling);
  try {
    model->set_streaming(streaming);
  } catch (const std::invalid_argument& e) {
    model->set_rope_scaling(scaling_);
    if (training_) model->train();
    throw EvalFailure(e.what());
  }
}

EvaluationScope::~EvaluationScope() {
  try {
    model_->set_rope_scaling(scaling_);
    model_->set_streaming(streaming_);
  } catch (...) {
  }
  if (training_) model_->train();
}

namespace {
// One batch's windows as model inputs and their targets.
struct EvalBatch {
  torch::Tensor inputs;        // (b, T)
  torch::Tensor targets;       // (b, T), -1 where not scored
  torch::Tensor target_bytes;  // (b, T), the bytes of text behind each scored target, else 0
  torch::Tensor target_at;     // (b, T), the stream position of each scored target, else -1
};

// Each scored target's NLL and window position by its stream position (keep_token_nll).
struct TokenSums {
  torch::Tensor nll;       // (n,) float64
  torch::Tensor position;  // (n,) int64, the window position + 1 (0: not scored), so that
                           // ranks' tensors add up
};

// Inputs and targets of windows [first, first + count) of a group, each of `size` tokens.
EvalBatch batch_inputs(const std::vector<EvalWindow>& group, size_t first, int64_t count,
                       int64_t size, const TokenStream& stream, bool causal, const EvalSpec& spec,
                       const Corpus& corpus) {
  const int32_t* data = stream.data();
  auto inputs = torch::empty({count, size}, torch::kLong);
  auto targets = torch::full({count, size}, int64_t(-1), torch::kLong);  // -1: not scored
  auto target_bytes = torch::zeros({count, size}, torch::kLong);
  auto target_stream = torch::full({count, size}, int64_t(-1), torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto at = target_stream.accessor<int64_t, 2>();
  auto tg = targets.accessor<int64_t, 2>();
  auto by = target_bytes.accessor<int64_t, 2>();
  const bool counts_bytes = corpus.counts_bytes();
  for (int64_t b = 0; b < count; ++b) {
    const EvalWindow& w = group[first + b];
    for (int64_t p = 0; p < size; ++p) {
      const int64_t pos = w.begin + p;
      int64_t target_at = -1;  // the stream position of the scored target, if any
      if (causal) {
        in[b][p] = data[pos];
        if (p >= w.score_from) target_at = pos + 1;
      } else {
        const auto d = mask_decision(pos, data[pos], spec.mask_prob, spec.mask_seed,
                                     corpus.mask_token, corpus.vocab_size);
        in[b][p] = d.input;
        if (p >= w.score_from && d.selected) target_at = pos;
      }
      if (target_at < 0) continue;
      tg[b][p] = data[target_at];
      at[b][p] = target_at;
      if (counts_bytes) by[b][p] = corpus.bytes_at(stream, target_at);
    }
  }
  return {inputs, targets, target_bytes, target_stream};
}

// Adds the NLL of a batch's scored targets, and the bytes of text behind them, to the sums by
// window position, in logit chunks.
void score_batch(TransformerLM& model, const EvalBatch& batch, int64_t size, torch::Device device,
                 torch::Tensor& position_nll, torch::Tensor& position_tokens,
                 torch::Tensor& position_bytes, TokenSums* tokens) {
  auto hidden = model->hidden(batch.inputs.to(device));      // (b, T, D)
  auto flat_targets = batch.targets.view({-1}).to(device);  // (b*T,)
  auto flat_bytes = batch.target_bytes.view({-1});          // (b*T,), on the CPU
  auto scored = flat_targets.ge(0).nonzero().squeeze(1);    // indices of scored positions
  if (scored.numel() == 0) return;
  auto h = hidden.reshape({-1, hidden.size(-1)}).index_select(0, scored);  // (S, D)
  const int64_t chunk = logit_chunk_rows(model->vocab_size());
  for (int64_t c = 0; c < h.size(0); c += chunk) {
    const int64_t len = std::min(chunk, h.size(0) - c);
    auto t = flat_targets.index_select(0, scored.narrow(0, c, len));  // (len,)
    auto nll = model->nll(h.narrow(0, c, len), t);                      // (len,) float32
    const auto rows = scored.narrow(0, c, len).cpu();
    auto where = rows.remainder(size);  // window positions
    position_nll.index_add_(0, where, nll.to(torch::kFloat64).cpu());
    position_tokens.index_add_(0, where, torch::ones_like(where));
    position_bytes.index_add_(0, where, flat_bytes.index_select(0, rows));
    if (tokens) {
      const auto stream_at = batch.target_at.view({-1}).index_select(0, rows);
      tokens->nll.index_put_({stream_at}, nll.to(torch::kFloat64).cpu());
      tokens->position.index_put_({stream_at}, where + 1);
    }
  }
}

// Totals, bins and perplexity from the per-position sums, refused if empty or not finite.
void summarise_positions(const torch::Tensor& position_nll, const torch::Tensor& position_tokens,
                         const torch::Tensor& position_bytes, const EvalSpec& spec, int64_t n,
                         bool causal, const Corpus& corpus, EvalResult& result) {
  result.scored_tokens = position_tokens.sum().item<int64_t>();
  // The totals and the bins come from the same per-token values.
  result.nll_sum = position_nll.sum().item<double>();
  const auto edges = position_bin_edges(spec.length);
  for (size_t b = 0; b + 1 < edges.size(); ++b) {
    PositionBin bin{edges[b], edges[b + 1], 0.0, 0};
    bin.nll_sum = position_nll.slice(0, bin.begin, bin.end).sum().item<double>();
    bin.scored_tokens = position_tokens.slice(0, bin.begin, bin.end).sum().item<int64_t>();
    if (bin.scored_tokens > 0) result.by_position.push_back(bin);
  }
  if (result.scored_tokens == 0)
    throw EvalFailure("scored no tokens (" + std::to_string(n) + " tokens in the split" +
                      (causal ? "" : ", none selected for masking") + ")");
  if (!std::isfinite(result.nll_sum))
    throw EvalFailure("the summed NLL is not finite (" + std::to_string(result.nll_sum) + " over " +
                      std::to_string(result.scored_tokens) + " tokens): the model produced " +
                      "non-finite logits");
  result.perplexity = std::exp(result.nll_sum / double(result.scored_tokens));
  if (corpus.counts_bytes()) {
    result.scored_bytes = position_bytes.sum().item<int64_t>();
    if (result.scored_bytes > 0)
      result.bits_per_byte = result.nll_sum / (std::log(2.0) * double(result.scored_bytes));
  }
}
}  // namespace

EvalResult evaluate(TransformerLM& model, const Corpus& corpus, const TokenStream& stream,
                    const EvalSpec& spec, torch::Device device) {
  torch::NoGradGuard no_grad;
  const bool causal = model->config().causal();
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = spec.max_tokens > 0 ? std::min(spec.max_tokens, stream.size()) : stream.size();
  check_eval_length(spec, n, stream.size(), causal);

  EvaluationScope scope(model, spec.rope_scaling, spec.streaming);

  EvalResult result;
  result.length = spec.length;
  result.streaming = spec.streaming;
  result.stride = (spec.stride <= 0 || spec.stride >= spec.length) ? spec.length : spec.stride;
  auto windows = plan_windows(n, spec.length, spec.stride, causal);
  result.windows = int64_t(windows.size());

  check_window_memory(model,
                      std::min<int64_t>(std::max<int64_t>(1, spec.batch_tokens / spec.length),
                                        int64_t(windows.size())),
                      spec.length, spec.streaming.active() ? spec.streaming.cache : -1);
  // Batch windows of equal size together.
  // Longest first: a length the model cannot take (learned positions, memory) fails at once and
  // names the full window, not the short last one.
  std::map<int64_t, std::vector<EvalWindow>, std::greater<int64_t>> by_size;
  for (const auto& w : windows) by_size[w.size].push_back(w);
  // Summed NLL and scored tokens by position in the window, in float64.
  auto position_nll = torch::zeros({spec.length}, torch::kFloat64);
  auto position_tokens = torch::zeros({spec.length}, torch::kLong);
  auto position_bytes = torch::zeros({spec.length}, torch::kLong);  // where the corpus counts bytes
  TokenSums token_sums;
  if (spec.keep_token_nll)
    token_sums = {torch::zeros({n}, torch::kFloat64), torch::zeros({n}, torch::kLong)};

  // Data parallel: batch k (in this order) is rank k % world's; the sums are reduced below.
  ProcessGroup* ranks = ProcessGroup::get(device);
  if (ranks) device = ranks->device();
  // This process's batches: `count` windows of `size` tokens from `first` in their group.
  struct OwnBatch {
    const std::vector<EvalWindow>* group;
    size_t first;
    int64_t count, size;
  };
  std::vector<OwnBatch> own;
  int64_t own_windows = 0;
  int64_t batch_number = -1;
  for (const auto& [size, group] : by_size) {
    const int64_t per_batch = std::max<int64_t>(1, spec.batch_tokens / size);
    for (size_t first = 0; first < group.size(); first += per_batch) {
      if (ranks && ++batch_number % ranks->size() != ranks->rank()) continue;
      own.push_back({&group, first, std::min<int64_t>(per_batch, int64_t(group.size() - first)), size});
      own_windows += own.back().count;
    }
  }
  // With ranks, an error in one rank's batches (a length a method refuses, say) is agreed on
  // by all of them below, so that they fail alike instead of waiting for each other.
  const std::string local_failure = run_or_capture(ranks, [&] {
    int64_t done_windows = 0;
    for (const OwnBatch& b : own) {
      const EvalBatch batch = batch_inputs(*b.group, b.first, b.count, b.size, stream, causal, spec, corpus);
      score_batch(model, batch, b.size, device, position_nll, position_tokens, position_bytes,
                  spec.keep_token_nll ? &token_sums : nullptr);
      done_windows += b.count;
      if (spec.on_progress) spec.on_progress(done_windows, own_windows);
    }
  });
  if (ranks) {
    std::vector<torch::Tensor> sums{position_nll, position_tokens, position_bytes};
    if (spec.keep_token_nll) {
      sums.push_back(token_sums.nll);
      sums.push_back(token_sums.position);
    }
    const std::string failure = ranks->all_reduce_agreeing(
        sums, local_failure, "the evaluation at length " + std::to_string(spec.length));
    if (!failure.empty()) throw EvalFailure(failure);
  }
  summarise_positions(position_nll, position_tokens, position_bytes, spec, n, causal, corpus, result);
  if (spec.keep_token_nll) {
    const auto scored = token_sums.position.gt(0);
    result.token_nll = token_sums.nll.masked_fill(scored.logical_not(), NAN);
    result.token_position = token_sums.position - 1;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace extrap
