// One attention call for every position method and every backend.
//
// A position method does not hand the attention a materialised (H, T, T) bias: it hands a
// *description* (AttentionBias) of what it wants added to the scaled q.k scores. Backends
// (the reference below, the memory-efficient CPU path, the fused CUDA kernel) each turn the
// description into scores their own way; the reference materialises it, the others never
// build a T x T tensor.
//
// Conventions: i = query position, j = key position, both counted from 0 at the start of the
// window. Scores are q.k / sqrt(d_head) + bias(i, j); a masked entry is -inf.
#pragma once

#include <torch/torch.h>

#include "core/base/yaml_options.h"

#include <functional>
#include <string>
#include <utility>

namespace extrap {

// What a position method adds to the attention scores.
struct AttentionBias {
  enum class Kind {
    None,        // nothing
    Dense,       // an arbitrary per-head bias, computed block by block on request
    Linear,      // ALiBi family: linear in |i - j| with per-head slopes and direction masks
    Cumulative,  // per batch and head: F[i] - F[j] from one vector F (forgetting gates)
    Contextual,  // CoPE: positions counted by sigmoid gates of the scores themselves
    ScoreMixing, // DAPE: a base bias plus a function of every head's scores and that bias
    StickBreaking,  // not a bias: stick-breaking weights replace the softmax (core/attention/stick_breaking.h)
    Householder,    // not a bias: PaTH's Householder products replace q.k (core/attention/householder.h)
  };

  // Kind::Dense: returns the (H, q_end - q_begin, k_end - k_begin) bias for the rows
  // [q_begin, q_end) and columns [k_begin, k_end). Backends may call it for the whole
  // T x T range (reference) or for one tile at a time (memory-efficient paths). The
  // result may require grad (learned tables).
  using DenseBlockFn =
      std::function<torch::Tensor(int64_t q_begin, int64_t q_end, int64_t k_begin, int64_t k_end)>;

  Kind kind = Kind::None;
  DenseBlockFn dense;
  // Kind::Dense, optional: set when the bias depends on the offset j - i alone (T5, KERPLE,
  // Sandwich; dense_by_offset()). by_offset(lo, hi) returns the (H, hi - lo) float bias at
  // offsets lo .. hi - 1, and every tile of `dense` is these values spread over it, bit for
  // bit. A backend may read a row's biases from it instead of asking for tiles (the fused CPU
  // kernel, whose backward hands the offsets' gradient back through it, and the attention
  // profile's softmax kernel do).
  using OffsetFn = std::function<torch::Tensor(int64_t lo, int64_t hi)>;
  OffsetFn by_offset;

  // Kind::Linear, per head h:
  //   j <= i: bias = -slopes_left[h]  * (i - j)   (masked instead if !look_left[h]; j == i never is)
  //   j >  i: bias = -slopes_right[h] * (j - i)   (masked instead if !look_right[h])
  // slopes_* are (H,) float tensors (positive; may require grad for learned slopes);
  // look_* are (H,) bool tensors on the CPU. A causal attention call masks j > i on top of
  // this whatever look_right says.
  torch::Tensor slopes_left;
  torch::Tensor slopes_right;
  torch::Tensor look_left;
  torch::Tensor look_right;
  // Kind::Linear only, optional: (T,) float positions of the window's tokens when they are not
  // 0..T-1 (training with sampled positions, PositionSampling); distances are then |positions[i] -
  // positions[j]|. Masks still go by index. Only the reference backend takes it.
  torch::Tensor positions;
  // Kind::Linear only: set by the method that made the bias where slopes_left are, value for
  // value, the paper's slopes for H heads (positions/alibi_slopes.h, float32), so a kernel that
  // computes those slopes itself (cuDNN's ALiBi, core/attention/gpu_routes.h) may take the call
  // without reading the tensor. Never set for slopes that require grad.
  bool paper_slopes = false;

  // Kind::Cumulative, causal attention only: (B, H, T) float F, and
  //   bias(b, h, i, j) = F[b, h, i] - F[b, h, j]   for j <= i.
  // With F[i] = sum_{l <= i} log f_l this is the sum of log forget gates over (j, i] (the
  // Forgetting Transformer); F[i] = -m_h * i is causal ALiBi. A fused kernel could take it
  // as two vectors per (batch, head). May require grad.
  torch::Tensor cumulative;

  // Kind::Contextual (CoPE, Golovneva et al., 2024), causal attention only. With s = the
  // scaled, masked scores q_i . k_j / sqrt(d) of the same call:
  //   g_ij = sigmoid(s_ij) (0 where masked),  p_ij = min(sum_{t = j..i} g_it, npos - 1),
  //   bias(i, j) = (1 - w) * z_i[floor p_ij] + w * z_i[ceil p_ij],  w = p_ij - floor p_ij,
  // where z_i = q_i . E (unscaled q) and E = position_embeddings: (1 or H, d_head, npos).
  // The gates see the scores before this bias is added. May require grad.
  torch::Tensor position_embeddings;

  // Kind::ScoreMixing (DAPE, Zheng et al., NeurIPS 2024). With A = the scaled scores
  // q_i . k_j / sqrt(d) of all heads (B, H, Tq, Tk), before any mask, and B = the base bias
  // `dense` (H, Tq, Tk) for the same rows and columns:
  //   logits = A + B + mix(A, B'),  B' = B with its masked (-inf) entries 0,
  // then the masks (the base's own, causal, window, chunk). mix returns (B, H, Tq, Tk) and mixes
  // the heads at each (i, j); the whole score matrix is needed at once, so only the reference
  // path takes this kind. May require grad.
  using ScoreMixFn = std::function<torch::Tensor(const torch::Tensor& scores, const torch::Tensor& base)>;
  ScoreMixFn score_mix;

  // Kind::StickBreaking, causal only: whether query i may attend to its own key (j <= i) besides
  // the keys before it (j < i, the default of the authors' kernels).
  bool stick_breaking_diagonal = false;

  // Kind::Householder (PaTH, Yang et al. 2025), causal only: the logits are
  //   q_i^T (H_i H_{i-1} ... H_{j+1}) k_j / sqrt(d),   H_t = I - beta_t w_t w_t^T,
  // in place of q_i . k_j / sqrt(d) (householder_scores()), with householder_w (B, H, Tk, d) and
  // householder_beta (B, H, Tk) the reflections of the Tk key positions; `cumulative`, if defined,
  // adds F_i - F_j on top (PaTH with FoX's forget gate). Then the masks and the options below as for
  // any kind. May require grad.
  torch::Tensor householder_w;
  torch::Tensor householder_beta;

  // What every kind combines with (the attention options of 2024-26, REFERENCE.md "The 2024-26
  // wave"; the model sets them from the config's `attention` section). Defaults change nothing.
  //
  // Masks, on top of the kind's own and the causal one (a masked entry is -inf), by index:
  //   window W > 0: j is visible to i only if |i - j| < W (causal: i - W < j <= i);
  //   chunk C > 0:  j is visible to i only if floor(i / C) == floor(j / C).
  // The diagonal is never masked by either, so no row is left without a key.
  int64_t window = 0;
  int64_t chunk = 0;
  // softcap C > 0: each q.k / sqrt(d) becomes C tanh(q.k / (sqrt(d) C)) before the kind's bias and
  // the masks are added (attention logit soft-capping, Gemma 2: C 50; Grok-1: 30). 0: off.
  double softcap = 0;
  // logit_scale, optional: (H, Tq) factors c multiplying each row's logits, bias included:
  // the row's softmax runs over c[h, i] * (q_i . k_j / sqrt(d) + bias_ij) (SSMax: c = s_h ln n_i,
  // Nakanishi 2025). Rows are the call's queries (the last Tq keys). May require grad.
  torch::Tensor logit_scale;
  // sink, optional: (H,) logits s_h of one extra column per row that weights no value (a learned
  // attention sink, gpt-oss): o_i = sum_j e^{z_ij} v_j / (e^{s_h} + sum_j e^{z_ij}), z the scaled
  // logits. Not scaled by logit_scale. May require grad.
  torch::Tensor sink;
  // Self-Extend (Jin et al., ICML 2024), evaluation only: entries with i - j >= near_window take
  // their q.k from far_queries (B, H, Tq, D) and far_keys (B, H, Tk, D) instead of q and k (the
  // same tokens rotated at grouped positions, TokenPositions::grouped); the kind's bias and the
  // masks apply as usual. Undefined: off.
  torch::Tensor far_queries;
  torch::Tensor far_keys;
  int64_t near_window = 0;

  static AttentionBias none() { return {}; }
  static AttentionBias dense_blocks(DenseBlockFn fn);
  // A Dense bias that depends on j - i alone: `dense`'s tile [q0, q1) x [k0, k1) is
  // fn(k0 - q1 + 1, k1 - q0) spread over it, and by_offset is fn.
  static AttentionBias dense_by_offset(OffsetFn fn);
  // Causal ALiBi: slopes only to the left; the right side is never reached.
  static AttentionBias linear_causal(torch::Tensor slopes);
  // Symmetric: the same slope both sides, both directions visible.
  static AttentionBias linear_symmetric(torch::Tensor slopes);
  // General form.
  static AttentionBias linear(torch::Tensor slopes_left, torch::Tensor slopes_right,
                              torch::Tensor look_left, torch::Tensor look_right);
  // F: (B, H, T).
  static AttentionBias cumulative_sum(torch::Tensor F);
  // E: (1 or H, d_head, npos).
  static AttentionBias contextual(torch::Tensor E);
  // base: the base bias's blocks (as dense_blocks); mix: as score_mix above.
  static AttentionBias score_mixing(DenseBlockFn base, ScoreMixFn mix);
  static AttentionBias stick_breaking(bool diagonal);
  // w: (B, H, Tk, d), beta: (B, H, Tk); F: (B, H, Tk) or undefined.
  static AttentionBias householder(torch::Tensor w, torch::Tensor beta, torch::Tensor F = {});

  // A Linear bias evaluated at explicit token positions (T,); unchanged when undefined.
  AttentionBias at_positions(const torch::Tensor& positions) const;

  // No bias and none of the options above: plain (causal) attention.
  bool is_none() const { return kind == Kind::None && !has_options(); }
  // Whether any of window, chunk, softcap, logit_scale, sink or the far queries and keys is set.
  bool has_options() const { return window > 0 || has_options_besides_window(); }
  // The same but the window (the one option cuDNN's band computes, core/attention/gpu_routes.h).
  bool has_options_besides_window() const {
    return chunk > 0 || softcap > 0 || logit_scale.defined() || sink.defined() || far_queries.defined();
  }
  // Refuses, naming `who`, a logit_scale that is set but not (heads, queries).
  void check_logit_scale(int64_t heads, int64_t queries, const char* who) const;
  // Whether window or chunk masks entries of rows [q0, q1) x columns [k0, k1) (a tile wholly
  // visible needs no mask), and whether they mask every entry (a tile no query sees).
  bool masks_some(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const;
  bool masks_all(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const;
  // (q1 - q0, k1 - k0) bool, true where window or chunk masks the entry.
  torch::Tensor option_mask(int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                            torch::Device device = torch::kCPU) const;
  // n_i, the number of keys that query rows [tk - tq, tk) see under the masks (the kind's
  // direction masks, causal, window, chunk): (H, Tq) float32. What SSMax's ln n_i counts.
  torch::Tensor visible_keys(int64_t num_heads, int64_t tq, int64_t tk, bool causal) const;
  // The keys [first, last] (indices) that window, chunk and the causal mask leave to the query at
  // key index i of tk keys, before the kind's own direction masks: what visible_keys() counts
  // and the attention profile's kernels scan.
  std::pair<int64_t, int64_t> option_span(int64_t i, int64_t tk, bool causal) const;
  // Kinds that depend on the batch or on q and k, not on positions alone.
  bool depends_on_input() const {
    return kind == Kind::Cumulative || kind == Kind::Contextual || kind == Kind::ScoreMixing ||
           kind == Kind::StickBreaking || kind == Kind::Householder;
  }
  std::string describe() const;  // e.g. "linear (8 heads, left+right)", "none + sink + window 64"
};

// Which implementation an attention call uses.
enum class AttentionBackend {
  Auto,       // on a GPU the route table of core/attention/gpu_routes.h (SDPA, cuDNN, extrap's
              // kernels); on the CPU the fused kernel where it takes the call, memory-efficient
              // for long inference windows, the reference otherwise
  Reference,  // materialise scores and bias (exact reference, supports everything)
  Efficient,  // blockwise online-softmax CPU path (inference only)
  Fused,      // the device's fused kernel: CUDA (core/attention/cuda), or the CPU training kernel
              // (core/attention/fused_cpu_attention.h); slope-described biases only
};
template <>
struct EnumNames<AttentionBackend> {
  static constexpr std::array<std::pair<const char*, AttentionBackend>, 4> table{
      {{"auto", AttentionBackend::Auto},
       {"reference", AttentionBackend::Reference},
       {"efficient", AttentionBackend::Efficient},
       {"fused", AttentionBackend::Fused}}};
};
inline std::string to_string(AttentionBackend backend) { return enum_name(backend); }

struct AttentionOptions {
  bool causal = true;
  double dropout = 0.0;   // attention-probability dropout (training only)
  bool training = false;
  AttentionBackend backend = AttentionBackend::Auto;
  // Auto evaluates on the CPU with the fused kernel's forward from fused_cpu_min_length queries
  // where it takes the bias, and with the memory-efficient path when T_q * T_k exceeds this for the
  // biases it does not take: both crossings measured by benchmarks/compare_attention_paths.sh
  // (benchmarks/RESULTS.md, 2026-11-28: the reference is ahead of the efficient path up to 256
  // and behind from 384, natively and under the AVX2 cap).
  int64_t efficient_threshold = 256 * 256;
  // Auto trains with the fused CPU kernel from this many queries on: below it the per-head
  // products are too small for a BLAS call each and the reference's batched ones win; from here
  // on the kernel is level or ahead (the crossover is in benchmarks/RESULTS.md).
  int64_t fused_cpu_min_length = 128;
  // The same for bfloat16 inputs (train.precision bf16) on a CPU with AVX512_BF16, where the
  // kernel's products run in bfloat16 (core/kernels/bf16_gemm.h) and pay off at shorter lengths
  // than the float32 BLAS calls (benchmarks/RESULTS.md).
  int64_t fused_cpu_bf16_min_length = 64;
};

// q: (B, H, Tq, D), k and v: (B, Hkv, Tk, D) with Tq <= Tk. Returns (B, H, Tq, D).
// With Tq < Tk (decoding with a KV cache) the queries are the last Tq keys: query row r is
// position Tk - Tq + r of the bias and of the causal mask. Only the reference path takes
// Tq < Tk (Auto picks it; Efficient and Fused refuse).
// Grouped-query attention (model.kv_heads): Hkv divides H, and query head h reads key and value
// head h / (H / Hkv). The fused CPU kernel takes them as they are (each key head read once for its
// group); every other path gets k and v repeated for the query heads of their group. A bias (and
// every option) is per query head.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionBias& bias, const AttentionOptions& options);

// The reference: materialises the (H, Tq, Tk) bias and the (B, H, Tq, Tk) scores.
torch::Tensor attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionBias& bias,
                                  const AttentionOptions& options);

// attention_reference() a block of `query_block` query rows at a time, each against the keys it
// can see (causal attention; the queries are the last Tq keys): memory (B, H, query_block, Tk)
// instead of (B, H, Tq, Tk). Inference only (refuses grad mode with an input that requires
// grad). What long evaluations use for the kinds the memory-efficient tiles do not take
// (Householder) and for Self-Extend's far queries and keys.
torch::Tensor attention_reference_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const AttentionBias& bias, const AttentionOptions& options,
                                          int64_t query_block = 256);

// Adds the bias (masks included) to scores = q.k / sqrt(d): (B, H, Tq, Tk), in place, the
// queries being the last Tq keys; returns scores. Every kind; the reference path's own step, and what tests compare the others with.
// q is the unscaled query (Kind::Contextual needs it).
torch::Tensor add_bias_(torch::Tensor& scores, const AttentionBias& bias, const torch::Tensor& q,
                        bool causal);

// The full (H, Tq, Tk) additive bias, masks included (-inf where attention is masked, window and
// chunk too; the sink and the logit scale are not additive and are left out); for
// Kind::Cumulative (B, H, Tq, Tk). Kind::Contextual and Kind::ScoreMixing depend on q and k: use
// add_bias_().
// What `extrap inspect bias` prints; used by tests.
torch::Tensor materialize_bias(const AttentionBias& bias, int64_t num_heads, int64_t tq,
                               int64_t tk, bool causal, torch::TensorOptions options = {});

// The bias for a block of rows [q0, q1) and columns [k0, k1), masks included. Kinds None,
// Dense, Linear: (H, q1 - q0, k1 - k0); Cumulative: (B, H, q1 - q0, k1 - k0).
torch::Tensor materialize_bias_block(const AttentionBias& bias, int64_t num_heads, int64_t q0,
                                     int64_t q1, int64_t k0, int64_t k1, bool causal,
                                     torch::TensorOptions options = {});

}  // namespace extrap
