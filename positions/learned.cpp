// `learned`: one trained vector per absolute position up to `max_length` (GPT-2 / BERT style).
// Positions past the maximum have no vector: asking for them is an error naming both numbers.
#include "positions/position.h"

namespace extrap {
namespace {

struct LearnedOptions {
  int64_t max_length = 1024;
  double init_std = 0.02;
  void read(const OptionReader& r) {
    r.read("max_length", max_length, "number of positions with a trained vector");
    r.read("init_std", init_std, "standard deviation of the initial vectors");
    r.at_least("max_length", max_length, 1);
  }
};

class LearnedAbsolute : public PositionMethod {
 public:
  LearnedAbsolute(const PositionContext& context, LearnedOptions options) : options_(options) {
    if (context.sampling.range > options.max_length)
      throw ConfigError("learned positions: " + context.sampling.key() + " " +
                        std::to_string(context.sampling.range) + " exceeds max_length " +
                        std::to_string(options.max_length) + " (the table must hold every " +
                        "sampled position)");
    table_ = register_parameter(
        "table", torch::randn({options.max_length, context.d_model}) * options.init_std);
  }

  torch::Tensor embed(const torch::Tensor& x, const TokenPositions& positions) override {
    if (positions.is_sampled()) {  // sorted: the last is the largest
      const int64_t last = positions.sampled[-1].item<int64_t>();
      TORCH_CHECK(last < options_.max_length, "learned positions: asked for positions up to ", last + 1,
                  " but max_length is ", options_.max_length,
                  " (learned absolute embeddings cannot extrapolate)");
      return x + table_.index_select(0, positions.sampled.to(table_.device())).unsqueeze(0);
    }
    const int64_t end = positions.offset + x.size(1);
    TORCH_CHECK(end <= options_.max_length, "learned positions: asked for positions up to ", end,
                " but max_length is ", options_.max_length,
                " (learned absolute embeddings cannot extrapolate)");
    return x + table_.narrow(0, positions.offset, x.size(1)).unsqueeze(0);  // (1, T, D)
  }

 private:
  LearnedOptions options_;
  torch::Tensor table_;  // (max_length, D)
};

PositionInfo make_learned_info() {
  PositionInfo info;
  info.name = "learned";
  info.description = "trained absolute position embeddings up to max_length";
  info.hooks = kEmbed;
  info.modes = kCausal | kBidirectional;
  info.randomizable = true;
  info.tensors = "position.table (max_length, d_model): row p is added to the embedding at position p";
  info.options = document_options<LearnedOptions>();
  info.factory = factory_for<LearnedAbsolute, LearnedOptions>();
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(learned, extrap::make_learned_info);
