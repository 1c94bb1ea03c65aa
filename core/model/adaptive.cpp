#include "core/model/adaptive.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace extrap {

int64_t adaptive_band_width(int64_t d_model, int64_t factor, int64_t band) {
  int64_t width = d_model;
  for (int64_t k = 0; k < band && width > 0; ++k) width /= factor;
  return width;
}

AdaptiveVocabularyImpl::AdaptiveVocabularyImpl(int64_t vocab_size, int64_t d_model, std::vector<int64_t> cutoffs,
                                               int64_t factor, double dropout)
    : ends_(std::move(cutoffs)), dropout_(dropout) {
  if (factor < 1) throw std::invalid_argument("adaptive vocabulary: factor must be at least 1, got " + std::to_string(factor));
  int64_t previous = 0;
  for (const int64_t c : ends_) {
    if (c <= previous || c >= vocab_size)
      throw std::invalid_argument("adaptive vocabulary: cutoff " + std::to_string(c) + " must be above " +
                                  std::to_string(previous) + " and below the vocabulary's " +
                                  std::to_string(vocab_size) + " words");
    previous = c;
  }
  ends_.push_back(vocab_size);
  for (int64_t k = 0; k < bands(); ++k) {
    const int64_t dim = adaptive_band_width(d_model, factor, k);
    if (dim < 1)
      throw std::invalid_argument("adaptive vocabulary: band " + std::to_string(k) + " would be " +
                                  std::to_string(d_model) + " / " + std::to_string(factor) + "^" + std::to_string(k) +
                                  " = 0 wide: fewer cutoffs or a smaller factor");
    const int64_t size = band_end(k) - band_begin(k);
    auto e = torch::empty({size, dim});
    torch::nn::init::normal_(e, 0.0, std::pow(double(dim), -0.5));
    auto p = torch::empty({d_model, dim});
    torch::nn::init::xavier_uniform_(p);
    embeddings.push_back(register_parameter("embedding_" + std::to_string(k), e));
    projections.push_back(register_parameter("projection_" + std::to_string(k), p));
  }
  auto c = torch::empty({bands() - 1, d_model});
  if (bands() > 1) torch::nn::init::xavier_uniform_(c);
  clusters = register_parameter("clusters", c);
}

torch::Tensor AdaptiveVocabularyImpl::embed(const torch::Tensor& tokens) {
  const int64_t D = projections[0].size(0);
  const auto flat = tokens.reshape({-1});
  auto sizes = tokens.sizes().vec();
  sizes.push_back(D);
  const auto options = projections[0].options();
  torch::Tensor out = torch::zeros({flat.size(0), D}, options);
  const auto band = band_of(flat);
  for (int64_t k = 0; k < bands(); ++k) {
    const auto rows = band.eq(k).nonzero().squeeze(1);
    if (rows.numel() == 0) continue;
    const auto e = embeddings[k].index_select(0, flat.index_select(0, rows) - band_begin(k));  // (n, dim_k)
    out = out.index_add(0, rows, torch::linear(e, projections[k]).to(out.scalar_type()));    // e P_k^T
  }
  return out.view(sizes);
}

torch::Tensor AdaptiveVocabularyImpl::band_of(const torch::Tensor& ids) const {
  const auto ends = torch::tensor(std::vector<int64_t>(ends_.begin(), ends_.end() - 1), ids.options());
  return torch::bucketize(ids, ends, /*out_int32=*/false, /*right=*/true);  // the cutoffs below or at each id
}

torch::Tensor AdaptiveVocabularyImpl::dropped(const torch::Tensor& x) const {
  return is_training() && dropout_ > 0 ? torch::dropout(x, dropout_, true) : x;
}

torch::Tensor AdaptiveVocabularyImpl::head_log_probs(const torch::Tensor& h) const {
  auto head = torch::linear(h, bands() > 1 ? torch::cat({embeddings[0], clusters}, 0) : embeddings[0]);
  return torch::log_softmax(head.to(torch::kFloat32), -1);
}

torch::Tensor AdaptiveVocabularyImpl::tail_log_probs(const torch::Tensor& h, int64_t band) const {
  const auto reduced = dropped(torch::matmul(h, projections[band].to(h.scalar_type())));  // h P_k (n, dim_k)
  return torch::log_softmax(torch::linear(reduced, embeddings[band]).to(torch::kFloat32), -1);
}

torch::Tensor AdaptiveVocabularyImpl::log_probs(const torch::Tensor& hidden) {
  auto sizes = hidden.sizes().vec();
  sizes.back() = vocab_size();
  const auto h = dropped(hidden.reshape({-1, hidden.size(-1)}));
  const auto head = head_log_probs(h);
  const int64_t c0 = band_end(0);
  std::vector<torch::Tensor> parts{head.narrow(1, 0, c0)};
  for (int64_t k = 1; k < bands(); ++k) parts.push_back(head.narrow(1, c0 + k - 1, 1) + tail_log_probs(h, k));
  return torch::cat(parts, 1).view(sizes);
}

torch::Tensor AdaptiveVocabularyImpl::nll(const torch::Tensor& hidden, const torch::Tensor& targets) {
  TORCH_CHECK(hidden.dim() == 2 && targets.dim() == 1 && hidden.size(0) == targets.size(0),
              "adaptive softmax: hidden (N, D) and targets (N,) expected, got ", hidden.sizes(), " and ", targets.sizes());
  const int64_t N = targets.size(0), c0 = band_end(0);
  const auto scored = targets.ne(-100);
  const auto bad = scored & (targets.lt(0) | targets.ge(vocab_size()));
  TORCH_CHECK(!bad.any().item<bool>(), "adaptive softmax: target ",
              targets.masked_select(bad).index({0}).item<int64_t>(), " is out of bounds for a vocabulary of ",
              vocab_size(), " words");
  const auto rows = scored.nonzero().squeeze(1);
  const auto t = targets.index_select(0, rows);
  const auto h = dropped(hidden.index_select(0, rows));
  // The head's target: the word itself in band 0, its band's cluster column otherwise.
  const auto band = band_of(t);
  const auto head_target = torch::where(band.eq(0), t, band + (c0 - 1));
  auto loss = -head_log_probs(h).gather(1, head_target.unsqueeze(1)).squeeze(1);  // (n,)
  for (int64_t k = 1; k < bands(); ++k) {
    const auto in_band = band.eq(k).nonzero().squeeze(1);
    if (in_band.numel() == 0) continue;
    const auto lp = tail_log_probs(h.index_select(0, in_band), k);
    const auto word = (t.index_select(0, in_band) - band_begin(k)).unsqueeze(1);
    loss = loss.index_add(0, in_band, -lp.gather(1, word).squeeze(1));
  }
  return torch::zeros({N}, loss.options()).index_add(0, rows, loss);
}

}  // namespace extrap
