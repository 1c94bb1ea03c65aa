// Memory-efficient attention on the CPU (inference): blockwise over queries and keys with an
// online softmax, as in FlashAttention, written with ATen tile operations.
//
// Invariants:
//   * Never holds a T x T tensor. Per worker thread the largest temporaries are one
//     (B*H, query_block, max(query_block, key_block)) score tile and one bias tile of the
//     same size without the batch; a (H, query_block, query_block) diagonal bias is shared.
//   * Gives the same numbers as attention_reference() up to fp32 rounding: diagonal tiles take
//     their bias from materialize_bias() / materialize_bias_block() (the reference's own code),
//     the other tiles compute the same slope x distance products, and probabilities below
//     e^-64 of a row's maximum are dropped (see kNegligibleShift).
//   * Key tiles that no head can see (above the diagonal when causal, or on a side that no
//     head of a linear bias looks at) are never computed.
#include "core/attention/efficient_attention.h"
#include "core/attention/stick_breaking.h"

#include <ATen/Parallel.h>

#ifndef _OPENMP
// at::parallel_for is a header template: it runs in parallel only where the file that uses it
// is compiled with OpenMP, as LibTorch itself is. Without it the query blocks below run
// one at a time and every tile operation forks LibTorch's threads instead, which costs far
// more than it gains, most of all on a shared machine.
#warning "core/attention/efficient_attention.cpp is compiled without OpenMP; link extrap with OpenMP::OpenMP_CXX"
#endif

#include <atomic>
#include <cmath>
#include <limits>

namespace extrap {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();
constexpr double kNegligibleShift = -64.0;  // see the online softmax in attend_query_block()

// Everything a worker needs, shared read-only between threads.
struct TiledProblem {
  // q (G, T, D) fp32, G = B * H; k and v (B * kv_heads, T, D): with grouped-query attention the
  // group of query heads h = kvh * group .. (kvh + 1) * group - 1 shares key and value head kvh,
  // and a tile's products take the group's rows as one (group * bq, D) matrix against that head.
  torch::Tensor q, k, v;
  int64_t batch = 0, heads = 0, kv_heads = 0, tq = 0, tk = 0, d = 0;
  double scale = 1.0;  // 1 / sqrt(D), applied to each query tile
  double softcap = 0;  // the bias's: each tile's q.k capped before its bias is added
  bool causal = true;
  const AttentionBias* bias = nullptr;
  EfficientAttentionBlocks blocks;
  bool any_left = true, any_right = true;  // does any head see keys on that side?
  // Kind::Linear and Kind::None: the (H, bq, bq) bias of a diagonal tile, masks included. It
  // depends only on i - j, so every query block's diagonal tile uses (a corner of) this one.
  // Undefined when there is nothing to add.
  torch::Tensor diagonal_bias;
  // Kind::Linear off the diagonal. (bq, bk): ii - jj, so that a tile's i - j is this plus
  // q0 - k0. (H, 1, 1) coefficients of i - j: -slope_left on the left side, +slope_right on
  // the right side, or -inf / +inf for a head that may not look that way (i - j is never 0
  // off the diagonal, so the product is then -inf: masked).
  torch::Tensor tile_offsets;
  torch::Tensor left_coefficient, right_coefficient;
  // Kind::Contextual: the (1 or H, D, npos) position embeddings, fp32.
  torch::Tensor position_embeddings;
  // The bias's options (attention.h): sink (H,) and logit_scale (H, Tq), fp32, or undefined.
  // The window and chunk masks are the bias's own (masks_all, masks_some, option_mask).
  torch::Tensor sink, logit_scale;
};

enum class Side { Left, Diagonal, Right };

// Adds the bias (masks included) of rows [q0, q1) and columns [k0, k1) to scores.
// scores: (B, H, q1 - q0, k1 - k0). A Left tile has every j < i, a Right tile every j > i; the
// Diagonal tile starts at k0 == q0.
void add_tile_bias(const TiledProblem& p, torch::Tensor& scores, Side side, int64_t q0, int64_t q1,
                   int64_t k0, int64_t k1) {
  const int64_t rows = q1 - q0, cols = k1 - k0;
  if (p.bias->kind == AttentionBias::Kind::Dense ||
      p.bias->kind == AttentionBias::Kind::Cumulative) {  // (H, ...) or (B, H, ...) tiles
    const bool causal = p.causal && side == Side::Diagonal;
    scores.add_(materialize_bias_block(*p.bias, p.heads, q0, q1, k0, k1, causal));
  } else if (side == Side::Diagonal) {  // None, Linear, Contextual (its mask only)
    if (p.diagonal_bias.defined())
      scores.add_(p.diagonal_bias.narrow(1, 0, rows).narrow(2, 0, cols));
  } else if (p.bias->kind == AttentionBias::Kind::Linear) {
    auto distance = p.tile_offsets.narrow(0, 0, rows).narrow(1, 0, cols) + double(q0 - k0);
    scores.addcmul_(distance, side == Side::Left ? p.left_coefficient : p.right_coefficient);
  }
}

// Attention for the query rows [q0, q1) of every (batch, head), written into out (G, Tq, D).
// The keys are visited as the diagonal square [q0, q1), then tiles of at most key_block
// leftwards from q0 and rightwards from q1, so that only the diagonal tile mixes sides.
// score_buffer: at least G * query_block * max(query_block, key_block) floats, reused.
void attend_query_block(const TiledProblem& p, int64_t q0, int64_t q1, torch::Tensor& score_buffer,
                        torch::Tensor& out) {
  const int64_t groups = p.q.size(0), rows = q1 - q0;
  const int64_t kv_groups = p.batch * p.kv_heads, group_rows = p.heads / p.kv_heads * rows;
  auto q_tile = p.q.narrow(1, q0, rows) * p.scale;                              // (G, bq, D), contiguous
  auto running_max = torch::full({groups, rows, 1}, -kInfinity, q_tile.options());  // (G, bq, 1)
  auto running_sum = torch::zeros({groups, rows, 1}, q_tile.options());        // (G, bq, 1)
  auto accumulator = torch::zeros({groups, rows, p.d}, q_tile.options());      // (G, bq, D)
  if (p.sink.defined()) {  // the sink's column first: a logit s_h, e^0 = 1 in the sum, no value
    running_max = p.sink.view({1, p.heads, 1, 1}).expand({p.batch, p.heads, rows, 1}).reshape({groups, rows, 1});
    running_sum.fill_(1.0);
  }
  torch::Tensor row_scale;  // (G, bq, 1): the rows' logit scale
  if (p.logit_scale.defined())
    row_scale = p.logit_scale.narrow(1, q0, rows).view({1, p.heads, rows, 1}).expand({p.batch, p.heads, rows, 1})
                    .reshape({groups, rows, 1});
  // Kind::Contextual: z = q . E per query row (G, bq, npos), and each row's sum of the gates of
  // the keys visited so far. Keys are visited from the diagonal leftwards, so that sum is
  // what a tile's positions start from: p_ij = (gates of this tile at t >= j) + carry.
  const bool contextual = p.bias->kind == AttentionBias::Kind::Contextual;
  torch::Tensor z, gate_carry;
  if (contextual) {
    const int64_t npos = p.position_embeddings.size(2);
    z = torch::matmul(p.q.narrow(1, q0, rows).view({p.batch, p.heads, rows, p.d}),
                      p.position_embeddings)
            .view({groups, rows, npos});
    gate_carry = torch::zeros({groups, rows, 1}, q_tile.options());
  }

  auto visit = [&](Side side, int64_t k0, int64_t k1) {
    if (p.bias->masks_all(q0, q1, k0, k1)) return;  // outside every row's window or chunk
    const int64_t cols = k1 - k0;
    auto scores = score_buffer.narrow(0, 0, groups * rows * cols).view({groups, rows, cols});
    auto group_scores = scores.view({kv_groups, group_rows, cols});  // (G, bq, bk), a key head's group at once
    at::bmm_out(group_scores, q_tile.view({kv_groups, group_rows, p.d}), p.k.narrow(1, k0, cols).transpose(1, 2));
    if (p.softcap > 0) scores.mul_(1.0 / p.softcap).tanh_().mul_(p.softcap);  // as the reference: before the bias
    auto scores_bh = scores.view({p.batch, p.heads, rows, cols});
    add_tile_bias(p, scores_bh, side, q0, q1, k0, k1);
    // Dense and cumulative tiles come from materialize_bias_block(), window and chunk included.
    const bool own_masks = p.bias->kind != AttentionBias::Kind::Dense && p.bias->kind != AttentionBias::Kind::Cumulative;
    if (own_masks && p.bias->masks_some(q0, q1, k0, k1))
      scores.masked_fill_(p.bias->option_mask(q0, q1, k0, k1), -kInfinity);
    if (contextual) {  // the gates see the masked scores before the contextual bias
      auto gates = torch::sigmoid(scores);  // (G, bq, bk)
      auto positions = (gates.flip(-1).cumsum(-1).flip(-1) + gate_carry)
                           .clamp_max_(double(z.size(-1) - 1));
      gate_carry.add_(gates.sum(-1, /*keepdim=*/true));
      auto lower = positions.floor();
      auto w = positions - lower;
      scores.add_(z.gather(-1, lower.to(torch::kLong)).mul_(1 - w) +
                  z.gather(-1, positions.ceil().to(torch::kLong)).mul_(w));
    }
    if (row_scale.defined()) {  // masked entries stay -inf whatever the factor (0 where n_i = 1)
      const auto masked = scores == -kInfinity;
      scores.mul_(row_scale).masked_fill_(masked, -kInfinity);
    }

    // Online softmax. A row that has seen only masked keys so far keeps max -inf; it is
    // shifted by 0 instead, so that exp(-inf - shift) = 0 rather than NaN.
    auto new_max = torch::maximum(running_max, scores.amax(-1, /*keepdim=*/true));  // (G, bq, 1)
    auto shift = new_max.masked_fill(new_max == -kInfinity, 0.0);
    auto rescale = (running_max - shift).exp_();  // 0 for rows that had nothing
    // Probabilities, unnormalised. Scores more than kNegligibleShift below the row's maximum become
    // exact zeros: they weigh less than e^-64 (1.6e-28) of the maximum, far below fp32
    // rounding, and would otherwise be denormal numbers, on which the probabilities x values
    // product runs several times slower (ALiBi tiles far from the diagonal are full of them).
    torch::threshold_(scores.sub_(shift), kNegligibleShift, -kInfinity).exp_();
    running_sum.mul_(rescale).add_(scores.sum(-1, /*keepdim=*/true));
    accumulator.mul_(rescale);
    accumulator.view({kv_groups, group_rows, p.d}).baddbmm_(group_scores, p.v.narrow(1, k0, cols));
    running_max = new_max;
  };

  const int64_t key_block = p.blocks.key_block;
  if (q0 < p.tk) visit(Side::Diagonal, q0, std::min(q1, p.tk));
  if (p.any_left)
    for (int64_t k1 = std::min(q0, p.tk); k1 > 0; k1 -= key_block)
      visit(Side::Left, std::max<int64_t>(0, k1 - key_block), k1);
  if (p.any_right)
    for (int64_t k0 = q1; k0 < p.tk; k0 += key_block)
      visit(Side::Right, k0, std::min(k0 + key_block, p.tk));

  // A row that sees no key at all is 0 / 0 = NaN, as softmax over -inf gives in the reference.
  out.narrow(1, q0, rows).copy_(accumulator.div_(running_sum));
}

// Refuses inputs the efficient path cannot take: shapes, device, dtype, block sizes, training.
void check_efficient_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const AttentionBias& bias, const AttentionOptions& options,
                            const EfficientAttentionBlocks& blocks) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention_efficient expects (B, H, T, D) tensors, got q ", q.sizes(), ", k ",
              k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0 &&
                  q.size(3) == k.size(3),
              "attention_efficient: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(),
              " do not match");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "attention_efficient runs on the CPU, got q on ", q.device());
  TORCH_CHECK(q.is_floating_point(), "attention_efficient expects floating-point inputs, got ",
              q.scalar_type());
  TORCH_CHECK(blocks.query_block > 0 && blocks.key_block > 0,
              "attention_efficient: block sizes must be positive, got ", blocks.query_block,
              " x ", blocks.key_block);
  TORCH_CHECK(!(options.training && options.dropout > 0),
              "attention_efficient is inference only: it has no attention dropout");
  TORCH_CHECK(bias.kind != AttentionBias::Kind::ScoreMixing, "attention_efficient: a ", bias.describe(),
              " bias needs every head's whole score matrix at once; the reference backend takes it");
  const bool linear = bias.kind == AttentionBias::Kind::Linear;
  TORCH_CHECK(!(linear && bias.positions.defined()),
              "attention_efficient takes no sampled positions (a training-time option)");
  TORCH_CHECK(options.causal || !bias.depends_on_input(), "attention_efficient: a ",
              bias.describe(), " bias is defined for causal attention only");
  TORCH_CHECK(!torch::GradMode::is_enabled() ||
                  !(q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                    (linear && (bias.slopes_left.requires_grad() ||
                                bias.slopes_right.requires_grad())) ||
                    (bias.cumulative.defined() && bias.cumulative.requires_grad()) ||
                    (bias.position_embeddings.defined() &&
                     bias.position_embeddings.requires_grad()) ||
                    (bias.sink.defined() && bias.sink.requires_grad()) ||
                    (bias.logit_scale.defined() && bias.logit_scale.requires_grad())),
              "attention_efficient is inference only: an input requires grad (use the reference "
              "backend for training, or a torch::NoGradGuard)");
}

// The shared problem: fp32 (G, T, D) copies of q, k and v and the bias prepared for tiles.
TiledProblem tiled_problem(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const AttentionBias& bias, const AttentionOptions& options,
                     const EfficientAttentionBlocks& blocks) {
  const bool linear = bias.kind == AttentionBias::Kind::Linear;
  TiledProblem p;
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.kv_heads = k.size(1);
  p.tq = q.size(2);
  p.tk = k.size(2);
  p.d = q.size(3);
  p.scale = 1.0 / std::sqrt(double(p.d));
  p.softcap = bias.softcap;
  p.causal = options.causal;
  p.bias = &bias;
  p.blocks = blocks;
  const int64_t groups = p.batch * p.heads;
  // Computed in fp32 whatever the input type; contiguous() copies only when it must. Detached:
  // grad mode is per thread, and the worker threads do not inherit attention_efficient()'s guard.
  p.q = q.detach().to(torch::kFloat32).reshape({groups, p.tq, p.d}).contiguous();
  p.k = k.detach().to(torch::kFloat32).reshape({p.batch * p.kv_heads, p.tk, p.d}).contiguous();
  p.v = v.detach().to(torch::kFloat32).reshape({p.batch * p.kv_heads, p.tk, p.d}).contiguous();
  if (p.causal) p.any_right = false;
  if (bias.sink.defined()) {
    TORCH_CHECK(bias.sink.dim() == 1 && bias.sink.size(0) == p.heads, "attention_efficient: sink must be (",
                p.heads, "), got ", bias.sink.sizes());
    p.sink = bias.sink.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  }
  if (bias.logit_scale.defined()) {
    bias.check_logit_scale(p.heads, p.tq, "attention_efficient");
    p.logit_scale = bias.logit_scale.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  }
  if (linear) {
    TORCH_CHECK(bias.slopes_left.size(0) == p.heads, "linear bias has ",
                bias.slopes_left.size(0), " slopes for ", p.heads, " heads");
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    auto rows = torch::arange(blocks.query_block, f32).view({-1, 1});
    auto cols = torch::arange(blocks.key_block, f32).view({1, -1});
    p.tile_offsets = rows - cols;  // (bq, bk)
    auto left = -bias.slopes_left.to(torch::kCPU, torch::kFloat32);
    auto right = bias.slopes_right.to(torch::kCPU, torch::kFloat32);
    p.left_coefficient = left.masked_fill(bias.look_left.logical_not(), -kInfinity).view({-1, 1, 1});
    p.right_coefficient =
        right.masked_fill(bias.look_right.logical_not(), kInfinity).view({-1, 1, 1});
    p.any_left = bias.look_left.any().item<bool>();
    p.any_right = p.any_right && bias.look_right.any().item<bool>();
  }
  if (bias.kind == AttentionBias::Kind::Contextual)
    p.position_embeddings = bias.position_embeddings.detach().to(torch::kCPU, torch::kFloat32);
  if (linear || ((bias.kind == AttentionBias::Kind::None || bias.kind == AttentionBias::Kind::Contextual) && p.causal)) {
    // Without the window and chunk masks, which are not the same on every diagonal tile (a chunk
    // boundary may cross it): visit() applies them tile by tile.
    AttentionBias diagonal = linear ? bias : AttentionBias::none();
    diagonal.window = diagonal.chunk = 0;
    diagonal.sink = diagonal.logit_scale = torch::Tensor();
    const int64_t size = std::min(blocks.query_block, p.tq);
    p.diagonal_bias = materialize_bias(diagonal, p.heads, size, size, p.causal);  // (H, bq, bq)
  }
  return p;
}

// Attends every query block, spread over the worker threads; returns (G, Tq, D).
torch::Tensor attend_query_blocks(const TiledProblem& p) {
  const int64_t groups = p.batch * p.heads;
  const EfficientAttentionBlocks& blocks = p.blocks;
  auto out = torch::empty({groups, p.tq, p.d}, p.q.options());  // (G, Tq, D)
  const int64_t tile_floats =
      groups * blocks.query_block * std::max(blocks.query_block, blocks.key_block);
  const int64_t num_query_blocks = (p.tq + blocks.query_block - 1) / blocks.query_block;
  // Parallel over query blocks, each tile operation on one thread: a tile's operations are too
  // small to gain from threads of their own, and forking threads for each of them costs far
  // more than it saves, most of all when another job holds a core. Each thread takes the next
  // block until none is left, the costliest first (a causal block's cost grows with its index),
  // so that a thread slowed by other work on the machine takes fewer blocks.
  std::atomic<int64_t> next_block{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    torch::NoGradGuard worker_no_grad;  // a dense bias may come from learned tables
    auto score_buffer = torch::empty({tile_floats}, p.q.options());
    for (int64_t taken; (taken = next_block++) < num_query_blocks;) {
      const int64_t q0 = (num_query_blocks - 1 - taken) * blocks.query_block;
      attend_query_block(p, q0, std::min(q0 + blocks.query_block, p.tq), score_buffer, out);
    }
  });
  return out;
}

}  // namespace

bool efficient_tiles_take(const AttentionBias& bias) {
  using Kind = AttentionBias::Kind;
  return bias.kind != Kind::StickBreaking && bias.kind != Kind::Householder && bias.kind != Kind::ScoreMixing &&
         !bias.far_queries.defined();
}

torch::Tensor attention_efficient(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionBias& bias,
                                  const AttentionOptions& options,
                                  const EfficientAttentionBlocks& blocks) {
  // Stick-breaking has no softmax to run online: its own row-blocked path, which trains too.
  // PaTH's scores and Self-Extend's two sets of scores are not tiles of one score matrix: each
  // comes a block of query rows at a time. These take one key head per query head.
  TORCH_CHECK(efficient_tiles_take(bias) || k.size(1) == q.size(1), "attention_efficient: a ", bias.describe(),
              " bias takes one key head per query head, got ", k.size(1), " for ", q.size(1),
              " (attention() repeats them)");
  if (bias.kind == AttentionBias::Kind::StickBreaking)
    return stick_breaking_attention_blocked(q, k, v, bias, options, blocks.query_block);
  if (bias.kind == AttentionBias::Kind::Householder || bias.far_queries.defined())
    return attention_reference_blocked(q, k, v, bias, options, blocks.query_block);
  check_efficient_inputs(q, k, v, bias, options, blocks);
  torch::NoGradGuard no_grad;
  const TiledProblem p = tiled_problem(q, k, v, bias, options, blocks);
  auto out = attend_query_blocks(p);  // (G, Tq, D)
  return out.view({p.batch, p.heads, p.tq, p.d}).to(q.scalar_type());
}

}  // namespace extrap
