#include "core/eval/attention_profile.h"

#include "core/attention/attention_observer.h"
#include "core/eval/evaluator.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace extrap {

namespace {

// Sums each layer's weights into distance bins as the forward pass calls attention.
class ProfileObserver : public AttentionObserver {
 public:
  ProfileObserver(int64_t layers, const std::vector<int64_t>& edges, int64_t query_block)
      : layers_(layers), edges_(edges), query_block_(query_block) {}

  void observe(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
               const AttentionOptions& options) override {
    TORCH_CHECK(layer_ < layers_, "attention profile: more attention calls than the model's ", layers_, " layers");
    const int64_t heads = q.size(1), tq = q.size(2), tk = k.size(2), bins = int64_t(edges_.size()) - 1;
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(q.device());
    if (mass_.empty())
      for (int64_t l = 0; l < layers_; ++l) {
        mass_.push_back(torch::zeros({heads, bins}, f64));
        entropy_.push_back(torch::zeros({heads, bins}, f64));
        sink_.push_back(torch::zeros({heads}, f64));
      }
    const auto index = torch::TensorOptions().dtype(torch::kLong).device(q.device());
    if (!inner_.defined() || inner_.device() != q.device())  // the edges bucketize searches
      inner_ = torch::tensor(std::vector<int64_t>(edges_.begin() + 1, edges_.end() - 1), index);
    const torch::Tensor& inner = inner_;
    const bool stick_breaking = bias.kind == AttentionBias::Kind::StickBreaking;
    torch::Tensor& mass = mass_[layer_];
    torch::Tensor& entropy = entropy_[layer_];
    torch::Tensor& sink = sink_[layer_];
    const auto qf = q.to(torch::kFloat32), kf = k.to(torch::kFloat32);
    // Rows whose weights are held at once: at most query_block, and few enough that a block's
    // float32 weights and their float64 copies (28 bytes a weight) stay near 256 MiB.
    const int64_t row_bytes = std::max<int64_t>(1, q.size(0) * heads * tk * 28);
    const int64_t rows = std::clamp<int64_t>((int64_t(256) << 20) / row_bytes, 1, query_block_);
    for_each_probability_block(qf, kf, bias, options, rows, [&](int64_t r, const torch::Tensor& p) {
      const int64_t n = p.size(2), keys = p.size(3);
      const auto i = torch::arange(tk - tq + r, tk - tq + r + n, index).view({-1, 1});
      auto distance = i - torch::arange(keys, index).view({1, -1});  // (n, keys)
      // Causal: a key after the query has weight 0; it is counted at distance 0, adding nothing.
      distance = options.causal ? distance.clamp_min(0) : distance.abs();
      const auto bin = torch::bucketize(distance, inner, /*out_int32=*/false, /*right=*/true).flatten();
      const auto weights = p.to(torch::kFloat64);  // (B, H, n, keys)
      mass.index_add_(1, bin, weights.sum(0).reshape({heads, n * keys}));
      entropy.index_add_(1, bin, torch::special_xlogy(weights, weights).neg().sum(0).reshape({heads, n * keys}));
      const auto rest = (1.0 - weights.sum(-1)).clamp_min(0.0);  // (B, H, n)
      if (stick_breaking) {  // the query's own value: distance 0
        mass.select(1, 0).add_(rest.sum({0, 2}));
        entropy.select(1, 0).add_(torch::special_xlogy(rest, rest).neg().sum({0, 2}));
      } else if (bias.sink.defined()) {
        sink.add_(rest.sum({0, 2}));
      }
    });
    ++layer_;
  }

  int64_t calls() const { return layer_; }
  void next_forward() { layer_ = 0; }
  std::vector<torch::Tensor> mass_, entropy_, sink_;  // per layer, on the device

 private:
  int64_t layers_;
  std::vector<int64_t> edges_;
  int64_t query_block_;
  torch::Tensor inner_;
  int64_t layer_ = 0;
};

}  // namespace

std::vector<int64_t> distance_bin_edges(int64_t length, int64_t split_at) {
  std::vector<int64_t> edges{0};
  for (int64_t e = 1; e < length; e *= 2) edges.push_back(e);
  if (split_at > 0 && split_at < length) edges.push_back(split_at);
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  edges.push_back(length);
  return edges;
}

AttentionProfile attention_profile(TransformerLM& model, const TokenStream& stream,
                                   const AttentionProfileSpec& spec, torch::Device device) {
  const auto start = std::chrono::steady_clock::now();
  const std::string what = "attention profile at length " + std::to_string(spec.length);
  if (spec.length < 1) throw EvalFailure(what + ": the length must be at least 1");
  if (spec.query_block < 1) throw EvalFailure(what + ": query block " + std::to_string(spec.query_block));
  if (model->streaming().active())
    throw EvalFailure(what + ": the model reads streams through a StreamingLLM cache; the profile reads whole windows");
  const int64_t available = spec.max_tokens > 0 ? std::min(stream.size(), spec.max_tokens) : stream.size();
  int64_t windows = available / spec.length;
  if (windows == 0)
    throw EvalFailure(what + ": " +
                      (available < stream.size()
                           ? "the first " + std::to_string(available) + " tokens of the stream's " +
                                 std::to_string(stream.size()) + " (max_tokens)"
                           : "the stream's " + std::to_string(available) + " tokens") +
                      " cannot fill one window (give a shorter length or more tokens)");
  if (spec.windows > 0) windows = std::min(windows, spec.windows);

  AttentionProfile out;
  out.length = spec.length;
  out.windows = windows;
  out.causal = model->config().causal();
  out.edges = distance_bin_edges(spec.length, spec.split_at);
  const int64_t layers = model->config().layers;
  ProfileObserver observer(layers, out.edges, spec.query_block);
  {
    EvaluationScope scope(model, RopeScaling());
    torch::NoGradGuard no_grad;
    ObservedAttention observed(observer);
    // A few windows a pass while they are short, one at a time when long.
    const int64_t per_pass = std::max<int64_t>(1, 16384 / spec.length);
    for (int64_t w = 0; w < windows; w += per_pass) {
      const int64_t count = std::min(per_pass, windows - w);
      check_window_memory(model->config(), count, spec.length);  // the forward pass itself
      const auto tokens = stream.slice(w * spec.length, count * spec.length)
                              .to(torch::kLong).view({count, spec.length}).to(device);
      observer.next_forward();
      model->hidden(tokens);
      if (observer.calls() != layers)
        throw EvalFailure(what + ": " + std::to_string(observer.calls()) + " attention calls for " +
                          std::to_string(layers) + " layers");
    }
  }
  const double queries = double(windows) * double(spec.length);
  out.mass = torch::stack(observer.mass_).cpu() / queries;
  out.entropy = torch::stack(observer.entropy_).cpu() / queries;
  out.sink = torch::stack(observer.sink_).cpu() / queries;
  if (!out.mass.isfinite().all().item<bool>() || !out.entropy.isfinite().all().item<bool>())
    throw EvalFailure(what + ": an attention weight is not finite");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace extrap
