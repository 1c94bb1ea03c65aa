// `cope`: Contextual Position Encoding (Golovneva et al., 2024; facebookresearch/RAM,
// projects/cope). Positions are counted by the content: query i gives key t a gate
// g_it = sigmoid(q_i . k_t / sqrt(d)) (0 where masked), and key j sits at the contextual
// position p_ij = sum_{t = j..i} g_it, clamped to npos - 1. The logit gains q_i . e(p_ij),
// interpolated linearly between the learned embeddings e(floor p) and e(ceil p). The
// embeddings (d_head x npos per layer, shared by the heads, zero at the start) are the only
// parameters; the attention backends compute the rest from the description
// AttentionBias::contextual (core/attention/attention.h), since it needs the scores themselves.
//
// The term is added to the scaled scores (the paper's listing; RAM's code adds it before the
// 1/sqrt(d), which only rescales the embeddings). Causal only: the count runs from the query
// back to each key.
#include "positions/position.h"

namespace extrap {
namespace {

struct CopeOptions {
  int64_t npos = 513;
  bool per_head = false;
  void read(const OptionReader& r) {
    r.read("npos", npos,
           "number of position embeddings; positions clamp at npos - 1 (the reference uses the "
           "training length + 1)");
    r.read("per_head", per_head, "one embedding table per head; false (the reference): shared");
    if (!r.decoding()) return;
    r.at_least("npos", npos, 2);
  }
};

class Cope : public PositionMethod {
 public:
  Cope(const PositionContext& context, CopeOptions options) {
    const int64_t tables = options.per_head ? context.num_heads : 1;
    embeddings_ = register_parameter(
        "embeddings", torch::zeros({context.num_layers, tables, context.d_head, options.npos}));
  }

  AttentionBias bias(const LayerInput& at) override {
    return AttentionBias::contextual(embeddings_[at.layer]);  // (1 or H, d_head, npos)
  }

 private:
  torch::Tensor embeddings_;  // (layers, 1 or H, d_head, npos)
};

PositionInfo make_cope_info() {
  PositionInfo info;
  info.name = "cope";
  info.description =
      "CoPE: contextual positions counted by sigmoid gates of q.k, with interpolated embeddings";
  info.hooks = kBias;
  info.modes = kCausal;
  info.mode_reason = "contextual positions are counted from the query back to each key";
  // Gates, positions, weights and gathered logits: 12 score-sized tensors a layer, the training
  // peak beyond ALiBi's (the measured peaks are in benchmarks/RESULTS.md).
  info.training_scores = 12;
  info.tensors =
      "position.embeddings (layers, 1 or H, d_head, npos): layer l uses E = embeddings[l]; with "
      "s = q.k / sqrt(d_head) (causally masked), g = sigmoid(s), p_ij = min(sum_{t=j..i} g_it, "
      "npos - 1), z_i = q_i E, bias(i, j) = (1 - w) z_i[floor p] + w z_i[ceil p], w = p - floor p";
  info.options = document_options<CopeOptions>();
  info.factory = factory_for<Cope, CopeOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(cope, extrap::make_cope_info);
