// Adaptive input embeddings (Baevski & Auli, ICLR 2019) and an adaptive softmax (Grave et al.,
// ICML 2017) sharing their weights: the vocabulary of the ALiBi paper's WikiText-103 model
// (fairseq's transformer_lm_wiki103 with --tie-adaptive-weights --tie-adaptive-proj).
//
// The vocabulary is cut into bands by frequency (ids sorted by descending count, so that the
// frequent words come first): band k holds ids [c_{k-1}, c_k) with c_{-1} = 0 and c_n = V. Band
// k has an embedding E_k (size_k, D / factor^k) and a projection P_k (D, D / factor^k).
//
//   input:   token t of band k  ->  E_k[t - c_{k-1}] P_k^T                        (D)
//   output:  head  = [h E_0^T, h C^T]   (c_0 words, then one logit per tail band: C (n, D))
//            tail k = dropout(h P_k) E_k^T                                       (size_k)
//            log p(t) = log_softmax(head)[t]                                 for t in band 0
//            log p(t) = log_softmax(head)[c_0 + k - 1] + log_softmax(tail k)[t - c_{k-1}]  else
//
// with dropout (the adaptive softmax's) on h before the head and the tails, in training. As
// fairseq ties them, the output's head uses E_0 without P_0 (h is already D wide), every tail
// reads its band's P_k and E_k, and C has no bias; nothing else has one either. Initialised as
// fairseq does: E_k from N(0, dim_k^-1/2), P_k and C Xavier-uniform.
//
// LibTorch's AdaptiveLogSoftmaxWithLoss computes the same log-likelihood for untied weights but
// its tails are Linear(D -> dim_k) then Linear(dim_k -> size_k) of its own (no tying with an
// input embedding), its head carries no P_0-free tie either, and its target() drops dropout:
// it cannot hold these weights, so the computation is written here.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace extrap {

// Band k's width: d_model / factor^k (fairseq's int(d // factor ** k)); 0 where it runs out.
int64_t adaptive_band_width(int64_t d_model, int64_t factor, int64_t band);

class AdaptiveVocabularyImpl : public torch::nn::Module {
 public:
  // cutoffs: the band ends below V, strictly increasing in (0, V); factor >= 1; each band's width
  // d_model / factor^k at least 1 (std::invalid_argument otherwise, naming the value).
  AdaptiveVocabularyImpl(int64_t vocab_size, int64_t d_model, std::vector<int64_t> cutoffs, int64_t factor,
                         double dropout);

  // Token ids (any shape) -> their input embeddings (..., D), unscaled.
  torch::Tensor embed(const torch::Tensor& tokens);
  // Hidden states (..., D) -> the log-probability of every word (..., V), float32.
  torch::Tensor log_probs(const torch::Tensor& hidden);
  // Hidden states (N, D) and targets (N,) -> each target's negative log-likelihood (N,),
  // float32; a target of -100 is not scored (0). Only the bands the targets fall in are computed.
  torch::Tensor nll(const torch::Tensor& hidden, const torch::Tensor& targets);

  int64_t vocab_size() const { return ends_.back(); }
  int64_t bands() const { return int64_t(ends_.size()); }
  // Band k's first id and its end.
  int64_t band_begin(int64_t k) const { return k == 0 ? 0 : ends_[k - 1]; }
  int64_t band_end(int64_t k) const { return ends_[k]; }

  std::vector<torch::Tensor> embeddings;   // E_k (size_k, dim_k): "embedding_k"
  std::vector<torch::Tensor> projections;  // P_k (D, dim_k): "projection_k"
  torch::Tensor clusters;                  // C (bands - 1, D): "clusters"

 private:
  std::vector<int64_t> ends_;  // the cutoffs, then V
  double dropout_;
  torch::Tensor dropped(const torch::Tensor& x) const;
  torch::Tensor band_of(const torch::Tensor& ids) const;  // each id's band (same shape, int64)
  torch::Tensor head_log_probs(const torch::Tensor& h) const;                // (N, c_0 + bands - 1)
  torch::Tensor tail_log_probs(const torch::Tensor& h, int64_t band) const;  // (N, size_k)
};
TORCH_MODULE(AdaptiveVocabulary);

}  // namespace extrap
