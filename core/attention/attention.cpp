// The attention dispatcher and the reference implementation.
#include "core/attention/attention.h"

#include "core/attention/attention_observer.h"
#include "core/attention/cuda_attention.h"
#include "core/attention/efficient_attention.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/attention/gpu_routes.h"
#include "core/attention/householder.h"
#include "core/attention/stick_breaking.h"
#include "core/base/environment.h"
#include "core/base/yaml_options.h"
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/precision.h"

#include <cmath>
#include <limits>
#include <optional>

namespace extrap {

namespace {
// The query-key pairs a dense bias's function is asked for at once (the memory-efficient
// path's 256 x 256 tile).
constexpr int64_t kDenseChunkPairs = 1 << 16;
}  // namespace

AttentionBias AttentionBias::dense_blocks(DenseBlockFn fn) {
  AttentionBias b;
  b.kind = Kind::Dense;
  b.dense = std::move(fn);
  return b;
}

AttentionBias AttentionBias::dense_by_offset(OffsetFn fn) {
  AttentionBias b;
  b.kind = Kind::Dense;
  b.dense = [fn](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    const int64_t lowest = k0 - (q1 - 1), highest = (k1 - 1) - q0;  // the tile's j - i
    const torch::Tensor per_offset = fn(lowest, highest + 1);       // (H, R)
    const auto options = torch::TensorOptions().device(per_offset.device()).dtype(torch::kLong);
    const auto i = torch::arange(q0, q1, options).view({-1, 1});
    const auto j = torch::arange(k0, k1, options).view({1, -1});
    return per_offset.index_select(1, (j - i - lowest).flatten()).view({per_offset.size(0), q1 - q0, k1 - k0});
  };
  b.by_offset = std::move(fn);
  return b;
}

AttentionBias AttentionBias::linear(torch::Tensor slopes_left, torch::Tensor slopes_right,
                                    torch::Tensor look_left, torch::Tensor look_right) {
  TORCH_CHECK(slopes_left.dim() == 1 && slopes_right.sizes() == slopes_left.sizes(),
              "linear bias: slopes must be (H,), got ", slopes_left.sizes(), " and ",
              slopes_right.sizes());
  TORCH_CHECK(look_left.sizes() == slopes_left.sizes() && look_right.sizes() == slopes_left.sizes(),
              "linear bias: direction masks must be (H,)");
  AttentionBias b;
  b.kind = Kind::Linear;
  b.slopes_left = std::move(slopes_left);
  b.slopes_right = std::move(slopes_right);
  b.look_left = look_left.to(torch::kCPU, torch::kBool);
  b.look_right = look_right.to(torch::kCPU, torch::kBool);
  return b;
}

AttentionBias AttentionBias::linear_causal(torch::Tensor slopes) {
  const auto h = slopes.size(0);
  return linear(slopes, slopes, torch::ones({h}, torch::kBool), torch::zeros({h}, torch::kBool));
}

AttentionBias AttentionBias::linear_symmetric(torch::Tensor slopes) {
  const auto h = slopes.size(0);
  return linear(slopes, slopes, torch::ones({h}, torch::kBool), torch::ones({h}, torch::kBool));
}

AttentionBias AttentionBias::cumulative_sum(torch::Tensor F) {
  TORCH_CHECK(F.dim() == 3, "cumulative bias: F must be (B, H, T), got ", F.sizes());
  AttentionBias b;
  b.kind = Kind::Cumulative;
  b.cumulative = std::move(F);
  return b;
}

AttentionBias AttentionBias::contextual(torch::Tensor E) {
  TORCH_CHECK(E.dim() == 3 && E.size(2) >= 2,
              "contextual bias: position embeddings must be (1 or H, d_head, npos >= 2), got ",
              E.sizes());
  AttentionBias b;
  b.kind = Kind::Contextual;
  b.position_embeddings = std::move(E);
  return b;
}

AttentionBias AttentionBias::score_mixing(DenseBlockFn base, ScoreMixFn mix) {
  AttentionBias b;
  b.kind = Kind::ScoreMixing;
  b.dense = std::move(base);
  b.score_mix = std::move(mix);
  return b;
}

AttentionBias AttentionBias::stick_breaking(bool diagonal) {
  AttentionBias b;
  b.kind = Kind::StickBreaking;
  b.stick_breaking_diagonal = diagonal;
  return b;
}

AttentionBias AttentionBias::householder(torch::Tensor w, torch::Tensor beta, torch::Tensor F) {
  TORCH_CHECK(w.dim() == 4 && beta.dim() == 3 && beta.sizes() == w.sizes().slice(0, 3),
              "householder bias: w must be (B, H, T, d) and beta (B, H, T), got ", w.sizes(), " and ", beta.sizes());
  TORCH_CHECK(!F.defined() || F.sizes() == beta.sizes(), "householder bias: F must be ", beta.sizes(), ", got ",
              F.sizes());
  AttentionBias b;
  b.kind = Kind::Householder;
  b.householder_w = std::move(w);
  b.householder_beta = std::move(beta);
  b.cumulative = std::move(F);
  return b;
}

AttentionBias AttentionBias::at_positions(const torch::Tensor& token_positions) const {
  if (!token_positions.defined()) return *this;
  TORCH_CHECK(kind == Kind::Linear, "only a linear bias can be evaluated at explicit positions, "
              "this one is ", describe());
  AttentionBias b = *this;
  b.positions = token_positions.to(torch::kFloat32);
  return b;
}

void AttentionBias::check_logit_scale(int64_t heads, int64_t queries, const char* who) const {
  TORCH_CHECK(!logit_scale.defined() ||
                  (logit_scale.dim() == 2 && logit_scale.size(0) == heads && logit_scale.size(1) == queries),
              who, ": logit_scale must be (", heads, ", ", queries, "), got ", logit_scale.sizes());
}

bool AttentionBias::masks_some(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
  if (q1 <= q0 || k1 <= k0) return false;
  // The largest |i - j| of the tile, and whether it spans a chunk boundary.
  const bool window_masks = window > 0 && std::max(q1 - 1 - k0, k1 - 1 - q0) >= window;
  const bool chunk_masks =
      chunk > 0 && (q0 / chunk != (q1 - 1) / chunk || k0 / chunk != (k1 - 1) / chunk || q0 / chunk != k0 / chunk);
  return window_masks || chunk_masks;
}

bool AttentionBias::masks_all(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
  if (q1 <= q0 || k1 <= k0) return true;
  // The smallest |i - j| of the tile (0 where the ranges overlap).
  const int64_t nearest = k1 - 1 < q0 ? q0 - (k1 - 1) : k0 > q1 - 1 ? k0 - (q1 - 1) : 0;
  const bool window_masks = window > 0 && nearest >= window;
  const bool chunk_masks = chunk > 0 && ((k1 - 1) / chunk < q0 / chunk || k0 / chunk > (q1 - 1) / chunk);
  return window_masks || chunk_masks;
}

torch::Tensor AttentionBias::option_mask(int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                                         torch::Device device) const {
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto i = torch::arange(q0, q1, longs).view({-1, 1}), j = torch::arange(k0, k1, longs).view({1, -1});
  auto masked = torch::zeros({q1 - q0, k1 - k0}, longs.dtype(torch::kBool));
  if (window > 0) masked = masked | ((i - j).abs() >= window);
  if (chunk > 0) masked = masked | (i.div(chunk, "floor") != j.div(chunk, "floor"));
  return masked;
}

std::pair<int64_t, int64_t> AttentionBias::option_span(int64_t i, int64_t tk, bool causal) const {
  int64_t first = 0, last = causal ? i : tk - 1;
  if (chunk > 0) first = i / chunk * chunk, last = std::min(last, first + chunk - 1);
  if (window > 0) first = std::max(first, i - (window - 1)), last = std::min(last, i + (window - 1));
  return {first, last};
}

torch::Tensor AttentionBias::visible_keys(int64_t num_heads, int64_t tq, int64_t tk, bool causal) const {
  // Row r (key index tk - tq + r) sees keys [first, last] around it: i - first to its left and
  // last - i to its right.
  auto left = torch::empty({1, tq}, torch::kFloat32), right = torch::empty({1, tq}, torch::kFloat32);
  float *l = left.data_ptr<float>(), *r = right.data_ptr<float>();
  for (int64_t row = 0; row < tq; ++row) {
    const int64_t i = tk - tq + row;
    const auto [first, last] = option_span(i, tk, causal);
    l[row] = float(i - first);
    r[row] = float(last - i);
  }
  if (kind == Kind::Linear) {  // heads that may not look one way see only the diagonal there
    TORCH_CHECK(look_left.size(0) == num_heads, "linear bias has ", look_left.size(0), " heads, not ", num_heads);
    left = left * look_left.to(torch::kFloat32).view({-1, 1});
    right = right * look_right.to(torch::kFloat32).view({-1, 1});
  }
  return (1 + left + right).expand({num_heads, tq}).contiguous();
}

std::string AttentionBias::describe() const {
  std::string options;
  if (sink.defined()) options += " + sink";
  if (far_queries.defined()) options += " + self-extend " + std::to_string(near_window);
  if (softcap > 0) options += " + softcap " + number_text(softcap);
  if (logit_scale.defined()) options += " + logit scale";
  if (window > 0) options += " + window " + std::to_string(window);
  if (chunk > 0) options += " + chunk " + std::to_string(chunk);
  switch (kind) {
    case Kind::None: return "none" + options;
    case Kind::Dense: return "dense" + options;
    case Kind::Linear: {
      const bool left = look_left.any().item<bool>(), right = look_right.any().item<bool>();
      return "linear (" + std::to_string(slopes_left.size(0)) + " heads, " +
             (left && right ? "left+right" : left ? "left" : "right") +
             (positions.defined() ? ", sampled positions" : "") + ")" + options;
    }
    case Kind::Cumulative: return "cumulative (F[i] - F[j] per batch and head)" + options;
    case Kind::Contextual:
      return "contextual (CoPE, " + std::to_string(position_embeddings.size(2)) + " positions)" + options;
    case Kind::ScoreMixing: return "score mixing (DAPE: a base bias and an MLP over every head's scores)" + options;
    case Kind::StickBreaking:
      return std::string("stick-breaking (no softmax") + (stick_breaking_diagonal ? ", diagonal" : "") + ")" + options;
    case Kind::Householder:
      return std::string("householder products (PaTH") + (cumulative.defined() ? ", with forget gates" : "") + ")" +
             options;
  }
  return "?";
}

namespace {

// Where a linear bias's direction masks hide a score: (1 or H, Tq, Tk) from `left` (j <= i) and
// `diagonal` (j == i). The masks are host tensors (backends plan on them without reading the
// device); where every head looks the same way the answer is built on the device alone, so that
// the common layouts copy nothing to a GPU (a copy a CUDA graph cannot capture,
// core/runtime/cuda_graph.h). Heads that differ copy their masks over.
torch::Tensor linear_bias_hidden(const AttentionBias& bias, const torch::Tensor& left, const torch::Tensor& diagonal) {
  const auto uniform = [](const torch::Tensor& look) -> std::optional<bool> {
    const bool all = look.all().item<bool>();
    if (all || !look.any().item<bool>()) return all;
    return std::nullopt;
  };
  const auto looks_left = uniform(bias.look_left), looks_right = uniform(bias.look_right);
  if (looks_left && looks_right) {
    const auto left_seen = *looks_left ? torch::ones_like(left) : diagonal;
    const auto right_seen = *looks_right ? torch::ones_like(left) : torch::zeros_like(left);
    return torch::where(left, left_seen, right_seen).logical_not();
  }
  const auto look_left = bias.look_left.to(left.device()).view({-1, 1, 1});
  const auto look_right = bias.look_right.to(left.device()).view({-1, 1, 1});
  return torch::where(left, look_left | diagonal, look_right).logical_not();  // (H, Tq, Tk)
}

}  // namespace

torch::Tensor materialize_bias_block(const AttentionBias& bias, int64_t num_heads, int64_t q0,
                                     int64_t q1, int64_t k0, int64_t k1, bool causal,
                                     torch::TensorOptions options) {
  if (!options.has_dtype()) options = options.dtype(torch::kFloat32);
  const auto inf = std::numeric_limits<float>::infinity();
  // Positions and distances in float32 at least (exact to 2^24), whatever the output type:
  // bfloat16 holds integers exactly only to 256, so a bf16 bias built from bf16 positions
  // would give tokens 257 and 258 apart the distance of 256 and 260. Rounded once at the end.
  const auto out_dtype = options.dtype_opt().value();
  options = options.dtype(out_dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
  auto i = torch::arange(q0, q1, options).view({1, -1, 1});  // (1, Tq, 1)
  auto j = torch::arange(k0, k1, options).view({1, 1, -1});  // (1, 1, Tk)
  auto left = (j <= i);                                       // (1, Tq, Tk)
  torch::Tensor out;                                          // (H, Tq, Tk) or (B, H, Tq, Tk)
  switch (bias.kind) {
    case AttentionBias::Kind::Contextual:
      TORCH_CHECK(false, "a contextual (CoPE) bias depends on q and k: use add_bias_()");
    case AttentionBias::Kind::ScoreMixing:
      TORCH_CHECK(false, "a score-mixing (DAPE) bias depends on q and k: use add_bias_()");
    case AttentionBias::Kind::StickBreaking:
      TORCH_CHECK(false, "stick-breaking attention adds no bias: its weights replace the softmax");
    case AttentionBias::Kind::Householder:
      TORCH_CHECK(false, "PaTH's Householder products replace q.k and add no bias: use add_bias_() on its scores");
    case AttentionBias::Kind::Cumulative: {  // causal only: materialize_bias() checks
      const auto& F = bias.cumulative;
      TORCH_CHECK(F.size(1) == num_heads && F.size(2) >= std::max(q1, k1), "cumulative bias: F ",
                  F.sizes(), " does not cover ", num_heads, " heads and positions up to ",
                  std::max(q1, k1));
      auto f = F.to(options.device(), options.dtype_opt().value());
      out = f.narrow(2, q0, q1 - q0).unsqueeze(-1) - f.narrow(2, k0, k1 - k0).unsqueeze(-2);
      break;
    }
    case AttentionBias::Kind::None:
      out = torch::zeros({num_heads, q1 - q0, k1 - k0}, options);
      break;
    case AttentionBias::Kind::Dense: {
      // A method's own function in chunks of keys of at most kDenseChunkPairs query-key pairs, so
      // that its intermediates stay in cache at long lengths (FIRE's MLP holds a hidden layer a
      // pair); a bias by offset is one gather.
      const auto block = [&](int64_t from, int64_t to) {
        auto part = bias.dense(q0, q1, from, to);
        TORCH_CHECK(part.dim() == 3 && part.size(0) == num_heads && part.size(1) == q1 - q0 &&
                        part.size(2) == to - from,
                    "dense bias: expected (", num_heads, ", ", q1 - q0, ", ", to - from, "), got ", part.sizes());
        return part;
      };
      const int64_t width = std::max<int64_t>(1, kDenseChunkPairs / std::max<int64_t>(1, q1 - q0));
      if (bias.by_offset || k1 - k0 <= width) {
        out = block(k0, k1);
      } else {
        std::vector<torch::Tensor> parts;
        for (int64_t from = k0; from < k1; from += width) parts.push_back(block(from, std::min(k1, from + width)));
        out = torch::cat(parts, 2);
      }
      out = out.to(options.device(), options.dtype_opt().value());
      break;
    }
    case AttentionBias::Kind::Linear: {
      TORCH_CHECK(bias.slopes_left.size(0) == num_heads, "linear bias has ",
                  bias.slopes_left.size(0), " slopes for ", num_heads, " heads");
      const auto dtype = i.scalar_type();
      auto sl = bias.slopes_left.to(options.device(), dtype).view({-1, 1, 1});   // (H, 1, 1)
      auto sr = bias.slopes_right.to(options.device(), dtype).view({-1, 1, 1});
      auto dist = (i - j).abs();  // (1, Tq, Tk)
      if (bias.positions.defined()) {  // sampled positions: distances between them
        TORCH_CHECK(bias.positions.dim() == 1 && bias.positions.size(0) >= std::max(q1, k1),
                    "linear bias: positions ", bias.positions.sizes(), " do not cover ",
                    std::max(q1, k1), " tokens");
        auto p = bias.positions.to(options.device(), dtype);
        dist = (p.narrow(0, q0, q1 - q0).view({1, -1, 1}) - p.narrow(0, k0, k1 - k0).view({1, 1, -1}))
                   .abs();
      }
      out = torch::where(left, -sl * dist, -sr * dist);
      out = out.masked_fill(linear_bias_hidden(bias, left, i == j), -inf);
      break;
    }
  }
  if (causal) out = out.masked_fill(left.logical_not(), -inf);
  if (bias.masks_some(q0, q1, k0, k1)) out = out.masked_fill(bias.option_mask(q0, q1, k0, k1, out.device()), -inf);
  return out.to(out_dtype);
}

torch::Tensor materialize_bias(const AttentionBias& bias, int64_t num_heads, int64_t tq,
                               int64_t tk, bool causal, torch::TensorOptions options) {
  TORCH_CHECK(causal || bias.kind != AttentionBias::Kind::Cumulative,
              "a cumulative (forgetting-gate) bias is defined for causal attention only");
  return materialize_bias_block(bias, num_heads, 0, tq, 0, tk, causal, options);
}

namespace {

// Kind::Contextual's bias from the scaled, masked scores (B, H, Tq, Tk) and unscaled q.
torch::Tensor contextual_bias(const torch::Tensor& masked_scores, const torch::Tensor& q,
                              const torch::Tensor& E) {
  const int64_t npos = E.size(2);
  TORCH_CHECK(E.size(0) == 1 || E.size(0) == q.size(1), "contextual bias: ", E.size(0),
              " embedding sets for ", q.size(1), " heads");
  TORCH_CHECK(E.size(1) == q.size(3), "contextual bias: embeddings of size ", E.size(1),
              " for heads of size ", q.size(3));
  auto gates = torch::sigmoid(masked_scores);                     // (B, H, Tq, Tk), 0 where masked
  auto p = gates.flip(-1).cumsum(-1).flip(-1).clamp_max(double(npos - 1));  // sum_{t >= j} g_it
  auto z = torch::matmul(q, E.to(q.scalar_type()));              // (B, H, Tq, npos)
  auto lower = p.floor();
  auto w = p - lower;
  auto lo = lower.to(torch::kLong), hi = p.ceil().to(torch::kLong);
  return z.gather(-1, lo) * (1 - w) + z.gather(-1, hi) * w;       // (B, H, Tq, Tk)
}

}  // namespace

namespace {

// add_bias_() for query rows at positions [row0, row0 + Tq) of the keys (add_bias_: the last Tq).
torch::Tensor add_bias_rows_(torch::Tensor& scores, const AttentionBias& bias, const torch::Tensor& q,
                             bool causal, int64_t row0) {
  const auto heads = scores.size(1), tq = scores.size(2), tk = scores.size(3);
  TORCH_CHECK(row0 >= 0 && row0 + tq <= tk, "attention: query rows ", row0, " to ", row0 + tq, " for ", tk, " keys");
  TORCH_CHECK(row0 == tk - tq || !(bias.kind == AttentionBias::Kind::Householder ||
                                   bias.kind == AttentionBias::Kind::ScoreMixing),
              "attention: a ", bias.describe(), " bias takes the last rows of the keys only");
  const bool mask_only = bias.kind == AttentionBias::Kind::None || bias.kind == AttentionBias::Kind::Contextual;
  if (mask_only) {
    const auto inf = std::numeric_limits<float>::infinity();
    if (causal) {  // query row r is key row0 + r
      auto mask = torch::ones({tq, tk}, torch::TensorOptions().dtype(torch::kBool).device(scores.device()))
                      .triu(1 + row0);
      scores.masked_fill_(mask, -inf);
    }
    if (bias.masks_some(row0, row0 + tq, 0, tk))  // before CoPE's gates, which count visible keys only
      scores.masked_fill_(bias.option_mask(row0, row0 + tq, 0, tk, scores.device()), -inf);
    if (bias.kind == AttentionBias::Kind::Contextual) {
      TORCH_CHECK(causal, "a contextual (CoPE) bias is defined for causal attention only");
      scores.add_(contextual_bias(scores, q, bias.position_embeddings));
    }
    return scores;
  }
  if (bias.kind == AttentionBias::Kind::Householder) {
    // The scores already hold the products: the masks, and the forget gates' F_i - F_j if any.
    TORCH_CHECK(causal, "PaTH's Householder products are defined for causal attention only");
    AttentionBias rest = bias;
    rest.kind = bias.cumulative.defined() ? AttentionBias::Kind::Cumulative : AttentionBias::Kind::None;
    return add_bias_rows_(scores, rest, q, causal, row0);
  }
  if (bias.kind == AttentionBias::Kind::ScoreMixing) {
    // A and B' before any mask; the base's own masks come back with B, the others after.
    const auto base = bias.dense(tk - tq, tk, 0, tk).to(scores.scalar_type());  // (H, Tq, Tk)
    TORCH_CHECK(base.dim() == 3 && base.size(0) == heads && base.size(1) == tq && base.size(2) == tk,
                "score-mixing bias: base expected (", heads, ", ", tq, ", ", tk, "), got ", base.sizes());
    const auto finite_base = base.masked_fill(base.isinf(), 0);
    auto mixed = bias.score_mix(scores, finite_base);
    TORCH_CHECK(mixed.sizes() == scores.sizes(), "score-mixing bias: mix returned ", mixed.sizes(), " for scores ",
                scores.sizes());
    AttentionBias masks = bias;  // none, with the window and chunk
    masks.kind = AttentionBias::Kind::None;
    scores = scores + base + mixed + materialize_bias_block(masks, heads, tk - tq, tk, 0, tk, causal, scores.options());
    return scores;
  }
  // (H, Tq, Tk) broadcast over B, or (B, H, Tq, Tk) for a cumulative bias: the last tq rows.
  TORCH_CHECK(causal || bias.kind != AttentionBias::Kind::Cumulative,
              "a cumulative (forgetting-gate) bias is defined for causal attention only");
  return scores.add_(
      materialize_bias_block(bias, heads, row0, row0 + tq, 0, tk, causal, scores.options()));
}

}  // namespace

torch::Tensor add_bias_(torch::Tensor& scores, const AttentionBias& bias, const torch::Tensor& q,
                        bool causal) {
  TORCH_CHECK(scores.size(2) <= scores.size(3), "attention: ", scores.size(2), " queries for ", scores.size(3),
              " keys (queries are the last keys)");
  return add_bias_rows_(scores, bias, q, causal, scores.size(3) - scores.size(2));
}

namespace {

// attention_probabilities() of query rows at positions [row0, row0 + Tq) of the keys.
torch::Tensor probabilities(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
                            const AttentionOptions& options, int64_t row0) {
  if (bias.kind == AttentionBias::Kind::StickBreaking) {
    TORCH_CHECK(row0 == k.size(2) - q.size(2), "stick-breaking weights: the queries are the last keys");
    TORCH_CHECK(options.causal, "stick-breaking attention is defined for causal attention only");
    return stick_breaking_weights(q, k, bias);
  }
  const auto d = q.size(3);
  // Scale q rather than the scores (a (B, H, T, D) pass instead of (B, H, T, T)), and add the
  // bias in place: matmul's backward needs only its inputs.
  const auto scaled = q * (1.0 / std::sqrt(double(d)));
  auto scores = bias.kind == AttentionBias::Kind::Householder  // PaTH: the products replace q.k
                    ? householder_scores(scaled, k, bias.householder_w, bias.householder_beta)
                    : torch::matmul(scaled, k.transpose(-2, -1));  // (B, H, Tq, Tk)
  if (bias.far_queries.defined()) {  // Self-Extend: keys at least near_window back, at grouped positions
    TORCH_CHECK(bias.kind == AttentionBias::Kind::None || bias.kind == AttentionBias::Kind::Linear ||
                    bias.kind == AttentionBias::Kind::Dense || bias.kind == AttentionBias::Kind::Cumulative,
                "attention: Self-Extend regroups positions of q and k; a ", bias.describe(), " bias does not take it");
    TORCH_CHECK(bias.near_window >= 1 && bias.far_queries.sizes() == q.sizes() && bias.far_keys.sizes() == k.sizes(),
                "attention: Self-Extend's far queries ", bias.far_queries.sizes(), " and keys ", bias.far_keys.sizes(),
                " for q ", q.sizes(), " and k ", k.sizes(), ", neighbour window ", bias.near_window);
    const int64_t tq = q.size(2), tk = k.size(2);
    const auto index = torch::TensorOptions().dtype(torch::kLong).device(q.device());
    const auto far = (torch::arange(row0, row0 + tq, index).view({-1, 1}) - torch::arange(0, tk, index).view({1, -1})) >=
                     bias.near_window;  // (Tq, Tk)
    scores = torch::where(far, torch::matmul(bias.far_queries.to(scaled.scalar_type()) * (1.0 / std::sqrt(double(d))),
                                             bias.far_keys.to(scaled.scalar_type()).transpose(-2, -1)),
                          scores);
  }
  if (bias.softcap > 0) scores = torch::tanh(scores * (1.0 / bias.softcap)) * bias.softcap;  // before bias and masks
  add_bias_rows_(scores, bias, q, options.causal, row0);
  if (!bias.logit_scale.defined() && !bias.sink.defined()) return torch::softmax(scores, -1);
  const auto heads = q.size(1), tq = q.size(2);
  if (bias.logit_scale.defined()) {
    bias.check_logit_scale(heads, tq, "attention");
    // Masked entries stay -inf whatever the factor's sign (SSMax's is 0 where n_i = 1), and give
    // the factor's gradient 0, not -inf x 0 (hence zeros in the product, not a where() after it).
    const auto inf = std::numeric_limits<float>::infinity();
    const auto masked = scores == -inf;
    scores = (scores.masked_fill(masked, 0) * bias.logit_scale.to(scores.scalar_type()).unsqueeze(-1))
                 .masked_fill(masked, -inf);
  }
  if (!bias.sink.defined()) return torch::softmax(scores, -1);
  TORCH_CHECK(bias.sink.dim() == 1 && bias.sink.size(0) == heads, "attention: sink must be (", heads, "), got ",
              bias.sink.sizes());
  // One more column per row with the head's sink logit; its probability weights no value.
  auto column = bias.sink.to(scores.scalar_type()).view({1, heads, 1, 1}).expand({scores.size(0), heads, tq, 1});
  return torch::softmax(torch::cat({scores, column}, -1), -1).narrow(-1, 0, scores.size(-1));
}

}  // namespace

torch::Tensor attention_probabilities(const torch::Tensor& q, const torch::Tensor& k,
                                      const AttentionBias& bias, const AttentionOptions& options) {
  return probabilities(q, k, bias, options, k.size(2) - q.size(2));
}

torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionBias& bias,
                                  const AttentionOptions& options) {
  if (bias.kind == AttentionBias::Kind::StickBreaking) return stick_breaking_attention(q, k, v, bias, options);
  auto probs = attention_probabilities(q, k, bias, options);
  if (options.training && options.dropout > 0) probs = torch::dropout(probs, options.dropout, true);
  return torch::matmul(probs, v);  // (B, H, Tq, D)
}

namespace {

// The bias of query rows [r, r + n) against keys [0, keys), the queries being the last Tq
// keys: the per-key tensors cut to the keys, the per-query ones to the rows.
AttentionBias row_block_bias(const AttentionBias& bias, int64_t r, int64_t n, int64_t keys) {
  const auto prefix = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(2, 0, keys) : t; };
  AttentionBias rows = bias;
  rows.householder_w = prefix(bias.householder_w);
  rows.householder_beta = prefix(bias.householder_beta);
  rows.cumulative = prefix(bias.cumulative);
  rows.far_keys = prefix(bias.far_keys);
  if (bias.far_queries.defined()) rows.far_queries = bias.far_queries.narrow(2, r, n);
  if (bias.logit_scale.defined()) rows.logit_scale = bias.logit_scale.narrow(1, r, n);
  return rows;
}

}  // namespace

torch::Tensor attention_reference_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const AttentionBias& bias, const AttentionOptions& options,
                                          int64_t query_block) {
  TORCH_CHECK(query_block > 0, "attention in row blocks: query block ", query_block);
  TORCH_CHECK(options.causal, "attention in row blocks: causal attention only (each block sees the keys before it)");
  const auto needs_grad = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  TORCH_CHECK(!torch::GradMode::is_enabled() ||
                  !(needs_grad(q) || needs_grad(k) || needs_grad(v) || needs_grad(bias.householder_w) ||
                    needs_grad(bias.householder_beta) || needs_grad(bias.far_queries) || needs_grad(bias.far_keys)),
              "attention in row blocks is inference only: an input requires grad (the reference backend trains)");
  TORCH_CHECK(!(options.training && options.dropout > 0), "attention in row blocks has no dropout");
  const int64_t tq = q.size(2), tk = k.size(2);
  std::vector<torch::Tensor> parts;
  for (int64_t r = 0; r < tq; r += query_block) {
    const int64_t n = std::min(query_block, tq - r), keys = tk - tq + r + n;  // keys the rows can see
    parts.push_back(attention_reference(q.narrow(2, r, n), k.narrow(2, 0, keys), v.narrow(2, 0, keys),
                                        row_block_bias(bias, r, n, keys), options));
  }
  return torch::cat(parts, 2);
}

void for_each_probability_block(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
                                const AttentionOptions& options, int64_t query_block,
                                const std::function<void(int64_t r, const torch::Tensor& probs)>& visit) {
  TORCH_CHECK(query_block > 0, "attention probabilities in row blocks: query block ", query_block);
  if (bias.kind == AttentionBias::Kind::ScoreMixing) {  // DAPE: every head's whole score matrix
    visit(0, attention_probabilities(q, k, bias, options));
    return;
  }
  const int64_t tq = q.size(2), tk = k.size(2);
  for (int64_t r = 0; r < tq; r += query_block) {
    const int64_t n = std::min(query_block, tq - r), keys = options.causal ? tk - tq + r + n : tk;
    visit(r, probabilities(q.narrow(2, r, n), k.narrow(2, 0, keys), row_block_bias(bias, r, n, keys), options,
                           tk - tq + r));
  }
}

namespace {

thread_local AttentionObserver* observer = nullptr;

}  // namespace

ObservedAttention::ObservedAttention(AttentionObserver& o) {
  TORCH_CHECK(observer == nullptr, "attention is already observed on this thread (one observer at a time)");
  observer = &o;
}

ObservedAttention::~ObservedAttention() { observer = nullptr; }

namespace {

// Whether the call goes to the fused CPU kernel: the Fused backend on the CPU (which refuses by
// name what it does not take), or Auto training from fused_cpu_min_length queries where the
// kernel takes the call.
bool fused_cpu_takes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const AttentionBias& bias, const AttentionOptions& options) {
  if (!q.device().is_cpu() || q.size(2) != k.size(2)) return false;
  if (options.backend == AttentionBackend::Fused) return true;
  const bool inference = !options.training && !torch::GradMode::is_enabled();
  const int64_t min_length = q.scalar_type() == torch::kBFloat16 && bf16_gemm::available()
                                 ? options.fused_cpu_bf16_min_length
                                 : options.fused_cpu_min_length;
  return options.backend == AttentionBackend::Auto && !inference && q.size(2) >= min_length &&
         fused_cpu_attention_unsupported_reason(q, k, v, bias, options).empty();
}

}  // namespace

namespace {
// Whether the fused CUDA kernels take this call: q on a GPU with extrap's CUDA half loaded, no
// attention dropout while training, and inputs and a bias the kernels support.
bool fused_cuda_takes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                      const AttentionBias& bias, const AttentionOptions& options) {
  return q.is_cuda() && cuda_attention() && !(options.training && options.dropout > 0) && !bias.has_options() &&
         (bias.kind != AttentionBias::Kind::Dense || gpu_new_routes_on()) &&
         cuda_attention()->unsupported_reason(q, k, v, bias, options.causal).empty();
}
}  // namespace

namespace {

// Runs a GPU route other than the reference (core/attention/gpu_routes.h).
torch::Tensor run_gpu_route(GpuRoute route, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const AttentionBias& bias, const AttentionOptions& options) {
  switch (route) {
    case GpuRoute::Sdpa:
      return at::scaled_dot_product_attention(q, k, v, {}, options.training ? options.dropout : 0.0, options.causal);
    case GpuRoute::Cudnn:
      return cuda_attention()->cudnn(q, k, v, bias.kind == AttentionBias::Kind::Linear, bias.window);
    case GpuRoute::ExtrapFused:
      return cuda_attention()->attention(q, k, v, bias, options.causal);
    case GpuRoute::Reference:
      break;
  }
  return attention_reference(q, k, v, bias, options);
}

// Whether the fused CPU kernel takes this call (dispatch's own choice of it): training from
// fused_cpu_min_length queries (fused_cpu_takes), and evaluation's forward from as many queries
// where it takes the bias (no T x T tensor, and faster from there). The kernel takes
// grouped-query attention as it comes, one key and value head for a group of query heads.
bool fused_cpu_route(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const AttentionBias& bias, const AttentionOptions& options) {
  if (!q.device().is_cpu() || q.size(2) != k.size(2)) return false;
  if (options.backend == AttentionBackend::Fused) return true;  // (refused with its reason where it does not take it)
  if (options.backend != AttentionBackend::Auto) return false;
  if (bias.kind == AttentionBias::Kind::StickBreaking || bias.kind == AttentionBias::Kind::ScoreMixing) return false;
  if (fused_cpu_takes(q, k, v, bias, options)) return true;
  const bool inference = !options.training && !torch::GradMode::is_enabled();
  return inference && q.size(2) >= options.fused_cpu_min_length && q.scalar_type() == torch::kFloat32 &&
         fused_cpu_attention_unsupported_reason(q, k, v, bias, options).empty();
}

// Grouped-query attention on the paths that take one key head per query head: k and v (and
// Self-Extend's far keys) repeated for the query heads of their group (query head h reads key
// head h / group, as Hugging Face's repeat_kv).
struct FullHeads {
  torch::Tensor k, v;
  AttentionBias bias;
};
FullHeads full_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const AttentionBias& bias) {
  const int64_t group = q.size(1) / k.size(1);
  FullHeads out{k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), bias};
  if (bias.far_keys.defined() && bias.far_keys.size(1) != q.size(1))
    out.bias.far_keys = bias.far_keys.repeat_interleave(group, 1);
  return out;
}

// Whether Auto takes the memory-efficient path on the CPU: evaluation past efficient_threshold,
// for the biases the fused kernel does not take (benchmarks/compare_attention_paths.sh measured
// both crossings); DAPE's score-mixing bias takes the reference only.
bool auto_takes_efficient(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias,
                          const AttentionOptions& options) {
  const bool inference = !options.training && !torch::GradMode::is_enabled();
  return inference && q.device().is_cpu() && bias.kind != AttentionBias::Kind::ScoreMixing &&
         q.size(2) * k.size(2) > options.efficient_threshold;
}

torch::Tensor dispatch(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const AttentionBias& bias, const AttentionOptions& options) {
  // Under train.precision bf16 (autocast) attention stays float32: the scores carry the bias.
  // The fused CPU kernel widens bfloat16 inputs itself and computes in float32 (no float32
  // copies of q, k, v and the output); every other path gets float32 copies.
  if (Float32Region fp32(q.device().type()); fp32.was_autocast()) {
    if (q.scalar_type() == torch::kBFloat16 && fused_cpu_takes(q, k, v, bias, options))
      return fused_cpu_attention(q, k, v, bias, options);
    // On a GPU every route but the reference takes bfloat16 q, k and v and computes the scores,
    // the bias and the softmax in float32 (as FlashAttention and SDPA do under autocast).
    if (q.is_cuda() && q.size(2) == k.size(2) &&
        (options.backend == AttentionBackend::Auto || options.backend == AttentionBackend::Fused)) {
      if (k.size(1) != q.size(1)) {  // the GPU routes take one key head per query head
        const FullHeads full = full_heads(q, k, v, bias);
        return dispatch(q, full.k, full.v, full.bias, options);
      }
      const auto qb = q.to(torch::kBFloat16), kb = k.to(torch::kBFloat16), vb = v.to(torch::kBFloat16);
      if (options.backend == AttentionBackend::Auto) {
        const GpuRoute route = choose_gpu_route(qb, kb, vb, bias, options, gpu_kernels_present()).route;
        if (route != GpuRoute::Reference) return run_gpu_route(route, qb, kb, vb, bias, options);
      } else if (fused_cuda_takes(qb, kb, vb, bias, options)) {
        return cuda_attention()->attention(qb, kb, vb, bias, options.causal);
      }
    }
    return dispatch(q.to(torch::kFloat32), k.to(torch::kFloat32), v.to(torch::kFloat32), bias, options);
  }
  // The fused CPU kernel, where it takes the call (grouped-query attention as it comes), and the
  // memory-efficient path (grouped too); every other path below takes one key and value head
  // per query head.
  if (fused_cpu_route(q, k, v, bias, options)) return fused_cpu_attention(q, k, v, bias, options);
  if (k.size(1) != q.size(1)) {
    // The memory-efficient path where it would be taken with full heads, for the biases it computes
    // in tiles: each tile takes a key head's group of queries at once.
    const bool efficient = options.backend == AttentionBackend::Efficient ||
                           (options.backend == AttentionBackend::Auto && auto_takes_efficient(q, k, bias, options));
    if (efficient && q.device().is_cpu() && q.size(2) == k.size(2) && efficient_tiles_take(bias))
      return attention_efficient(q, k, v, bias, options);
    const FullHeads full = full_heads(q, k, v, bias);
    return dispatch(q, full.k, full.v, full.bias, options);
  }
  // Fewer queries than keys (decoding with a KV cache): the queries are the last keys. Only
  // the reference path takes that, and it is what Auto picks.
  if (q.size(2) != k.size(2)) {
    TORCH_CHECK(options.backend == AttentionBackend::Auto ||
                    options.backend == AttentionBackend::Reference,
                "attention: the ", enum_name(options.backend), " backend needs as many queries as "
                "keys (got ", q.size(2), " and ", k.size(2), "); decoding with a KV cache uses the "
                "reference path");
    return attention_reference(q, k, v, bias, options);
  }
  switch (options.backend) {
    case AttentionBackend::Reference:
      return attention_reference(q, k, v, bias, options);
    case AttentionBackend::Efficient:
      return attention_efficient(q, k, v, bias, options);
    case AttentionBackend::Fused:
      TORCH_CHECK(q.is_cuda(),
                  "attention: the fused CPU kernel does not take this call (see fused_cpu_takes in "
                  "core/attention/fused_cpu_attention.h); the reference and efficient backends do");
      TORCH_CHECK(cuda_attention(), "attention: the fused CUDA backend is not loaded (libextrap_cuda.so, "
                  "core/runtime/cuda_support.h)");
      TORCH_CHECK(!(options.training && options.dropout > 0),
                  "attention: the fused CUDA backend has no attention dropout (dropout ",
                  options.dropout, ")");
      TORCH_CHECK(!bias.has_options(), "attention: the fused CUDA backend takes no sink, logit scale, softcap, "
                  "window or chunk yet (", bias.describe(), "); the reference backend does");
      TORCH_CHECK(bias.kind != AttentionBias::Kind::Dense || gpu_new_routes_on(),
                  "attention: the fused CUDA kernels' offsets mode (", bias.describe(), ") has not yet run on a "
                  "GPU; EXTRAP_GPU_NEW_ROUTES=1 takes it, the reference backend is the proven one");
      return cuda_attention()->attention(q, k, v, bias, options.causal);
    case AttentionBackend::Auto: {
      // Stick-breaking a block of query rows at a time with its own backward (no score-sized
      // tensors kept for backward); the reference path where it has attention dropout.
      if (bias.kind == AttentionBias::Kind::StickBreaking && !(options.training && options.dropout > 0))
        return stick_breaking_attention_blocked(q, k, v, bias, options);
      // On a GPU: the table of core/attention/gpu_routes.h.
      if (q.is_cuda()) {
        const GpuRoute route = choose_gpu_route(q, k, v, bias, options, gpu_kernels_present()).route;
        if (route != GpuRoute::Reference) return run_gpu_route(route, q, k, v, bias, options);
      }
      // On the CPU the fused kernel took what it takes (fused_cpu_route).
      if (auto_takes_efficient(q, k, bias, options)) return attention_efficient(q, k, v, bias, options);
      return attention_reference(q, k, v, bias, options);
    }
  }
  return attention_reference(q, k, v, bias, options);
}

}  // namespace

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionBias& bias, const AttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention expects (B, H, T, D) tensors, got q ", q.sizes());
  TORCH_CHECK(q.size(2) <= k.size(2) && k.size(2) == v.size(2), "attention: ", q.size(2),
              " queries for ", k.size(2), " keys and ", v.size(2), " values");
  TORCH_CHECK(k.size(1) == v.size(1) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0, "attention: ", q.size(1),
              " query heads for ", k.size(1), " key and ", v.size(1), " value heads (grouped-query attention: the key "
              "heads divide the query heads)");
  if (observer) {
    // An observer sees one key and value head per query head.
    const FullHeads full = k.size(1) == q.size(1) ? FullHeads{k, v, bias} : full_heads(q, k, v, bias);
    auto observed = observer->observe(q, full.k, full.v, full.bias, options);
    if (observed.defined()) return observed;
  }
  return dispatch(q, k, v, bias, options);
}

}  // namespace extrap
