// PaTH's Householder-product scores in blocks of positions, and its row-blocked evaluation. See
// householder.h for the definition and the plan.
#include "core/attention/householder.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace extrap {
namespace {

// C: the window rounded up to a power of two, 8 to 64 (Tk / C steps across blocks; a block's own
// work grows with C^2 a row).
int64_t default_block(int64_t tk) {
  int64_t c = 8;
  while (c < 64 && c < tk) c *= 2;
  return c;
}

}  // namespace

torch::Tensor householder_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                 const torch::Tensor& beta, int64_t block) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && w.dim() == 4 && beta.dim() == 3,
              "householder scores: expected q, k, w (B, H, T, D) and beta (B, H, T), got q ", q.sizes(), ", k ",
              k.sizes(), ", w ", w.sizes(), ", beta ", beta.sizes());
  const int64_t B = k.size(0), heads = k.size(1), tk = k.size(2), D = k.size(3), tq = q.size(2);
  TORCH_CHECK(w.sizes() == k.sizes() && beta.size(0) == B && beta.size(1) == heads && beta.size(2) == tk &&
                  q.size(0) == B && q.size(1) == heads && q.size(3) == D && tq <= tk,
              "householder scores: q ", q.sizes(), ", k ", k.sizes(), ", w ", w.sizes(), " and beta ", beta.sizes(),
              " do not match");
  const int64_t C = block > 0 ? block : default_block(tk);
  const int64_t nb = (tk + C - 1) / C, pad = nb * C - tk, offset = tk - tq;
  // Padded positions (after the last key) reflect nothing (w = 0) and come after every query.
  const auto blocks = [&](const torch::Tensor& x) {
    return torch::constant_pad_nd(x, {0, 0, 0, pad}).view({B, heads, nb, C, D});
  };
  const auto K = blocks(k), W = blocks(w.to(k.scalar_type()));
  const auto Beta = torch::constant_pad_nd(beta.to(k.scalar_type()), {0, pad}).view({B, heads, nb, C});

  // Within each block (positions 0..C-1 of it), with A = I + strictly_lower(W W^T) diag(beta), unit
  // lower triangular: a key j carried through H_{j+1} .. H_s loses beta_s w_s U[s][j] at step s,
  // where U = A^-1 strictly_lower(W K^T) (the projections w_s . k_j^(s-1) solve that system), so
  //   k^ = K - U^T diag(beta) W,   logits(i, j) = q_i . k_j - sum_{j < s <= i} beta_s (q_i . w_s) U[s][j];
  // and for a vector x entering at the block's start, Y = A^-1 W gives
  //   H_i ... H_0 x = x - sum_{s <= i} beta_s w_s (Y x)_s,   so  q^ = Q - tril(Q W^T) diag(beta) Y,
  //   G = I - W^T diag(beta) Y.
  // A handful of batched products and one triangular solve instead of C sequential steps.
  const auto bool_options = torch::TensorOptions().dtype(torch::kBool).device(k.device());
  const auto below = torch::ones({C, C}, bool_options).tril(-1), on_or_below = torch::ones({C, C}, bool_options).tril();
  const auto beta_rows = Beta.unsqueeze(-1);  // (B, H, nb, C, 1)
  const auto A = (torch::matmul(W, W.transpose(-1, -2)) * Beta.unsqueeze(-2)).masked_fill(below.logical_not(), 0) +
                 torch::eye(C, k.options());
  const auto R = torch::matmul(W, K.transpose(-1, -2)).masked_fill(below.logical_not(), 0);
  const auto solved = torch::linalg_solve_triangular(A, torch::cat({R, W}, -1), /*upper=*/false, /*left=*/true,
                                                     /*unitriangular=*/true);
  const auto U = solved.narrow(-1, 0, C), Y = solved.narrow(-1, C, D);  // (B, H, nb, C, C), (B, H, nb, C, D)
  const auto k_hat = K - torch::matmul(U.transpose(-1, -2), beta_rows * W);
  const auto G = torch::eye(D, k.options()) - torch::matmul(W.transpose(-1, -2), beta_rows * Y);  // (B, H, nb, D, D)

  // The blocks that hold queries: rows placed at their positions (zero rows before the first query).
  const int64_t first_block = offset / C, nq = nb - first_block, lead = offset - first_block * C;
  const auto Q = torch::constant_pad_nd(q.to(k.scalar_type()), {0, 0, lead, pad}).view({B, heads, nq, C, D});
  const auto own = [&](const torch::Tensor& x) { return x.narrow(2, first_block, nq); };
  const auto reach = torch::matmul(Q, own(W).transpose(-1, -2)).masked_fill(on_or_below.logical_not(), 0) *
                     own(Beta).unsqueeze(-2);  // (q_i . w_s) beta_s for s <= i
  const auto intra = torch::matmul(Q, own(K).transpose(-1, -2)).masked_fill(on_or_below.logical_not(), 0) -
                     torch::matmul(reach, own(U));  // (B, H, nq, C, C), 0 above the diagonal
  const auto u = Q - torch::matmul(reach, own(Y));   // q^

  // Across blocks: at step `back`, query block I meets key block I - back, then carries its rows
  // through that block (r^T G). Blocks with no key block left drop out of the front.
  std::vector<std::vector<torch::Tensor>> tiles(static_cast<size_t>(nq));
  for (int64_t r = 0; r < nq; ++r) tiles[size_t(r)].resize(size_t(first_block + r + 1));
  for (int64_t r = 0; r < nq; ++r) tiles[size_t(r)][size_t(first_block + r)] = intra.select(2, r);
  auto carried = u;  // rows of query blocks `active` .. nq - 1
  int64_t active = 0;
  for (int64_t back = 1; back < nb; ++back) {
    const int64_t start = std::max<int64_t>(0, back - first_block);
    if (start >= nq) break;
    carried = carried.narrow(2, start - active, nq - start);
    active = start;
    const int64_t key_block = first_block + start - back, count = nq - start;
    const auto products = torch::matmul(carried, k_hat.narrow(2, key_block, count).transpose(-1, -2));
    for (int64_t r = start; r < nq; ++r)
      tiles[size_t(r)][size_t(first_block + r - back)] = products.select(2, r - start);
    if (back + 1 < nb) carried = torch::matmul(carried, G.narrow(2, key_block, count));
  }
  std::vector<torch::Tensor> rows;
  for (auto& row : tiles) {
    auto joined = torch::cat(row, -1);  // (B, H, C, (I + 1) C)
    rows.push_back(torch::constant_pad_nd(joined, {0, nb * C - joined.size(-1)}));
  }
  return torch::stack(rows, 2).view({B, heads, nq * C, nb * C}).narrow(2, lead, tq).narrow(3, 0, tk);
}

}  // namespace extrap
