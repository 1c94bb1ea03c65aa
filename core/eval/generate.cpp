#include "core/eval/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>

namespace extrap {

void check_generate_options(const GenerateOptions& o) {
  if (o.max_new < 0)
    throw ConfigError("--max-new " + std::to_string(o.max_new) + ": must not be negative");
  if (!(std::isfinite(o.temperature) && o.temperature >= 0))
    throw ConfigError("--temperature " + number_text(o.temperature) +
                      ": must be 0 (greedy) or positive");
  if (o.top_k < 0)
    throw ConfigError("--top-k " + std::to_string(o.top_k) + ": must be 0 (all tokens) or positive");
}

int32_t sample_token(const torch::Tensor& logits, const GenerateOptions& options,
                     torch::Generator& generator) {
  auto scores = logits.to(torch::kFloat64).flatten().clone();  // (V,)
  for (int32_t banned : options.banned)
    if (banned >= 0 && banned < scores.size(0)) scores[banned] = -INFINITY;
  TORCH_CHECK(scores.isfinite().any().item<bool>(), "generate: the model gave no finite logit");
  if (options.temperature == 0) return int32_t(scores.argmax().item<int64_t>());
  scores = scores / options.temperature;
  if (options.top_k > 0 && options.top_k < scores.size(0)) {
    const double kth = std::get<0>(scores.topk(options.top_k))[-1].item<double>();
    scores = scores.masked_fill(scores < kth, -INFINITY);
  }
  auto probabilities = torch::softmax(scores, 0);
  return int32_t(torch::multinomial(probabilities, 1, false, generator).item<int64_t>());
}

std::vector<int32_t> generate(TransformerLM& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options,
                              const std::function<void(int32_t)>& on_token) {
  check_generate_options(options);
  if (prompt.empty()) throw ConfigError("generate: the prompt has no tokens");
  if (!model->config().causal())
    throw ConfigError("generate: the model is a masked LM; generation needs a causal model");
  for (int32_t t : prompt)
    if (t < 0 || t >= model->vocab_size())
      throw ConfigError("generate: prompt token " + std::to_string(t) +
                        " is outside the model's vocabulary of " +
                        std::to_string(model->vocab_size()));
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const torch::Device device = model->parameters().front().device();
  torch::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);

  std::vector<int64_t> sequence(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  const int64_t planned = int64_t(prompt.size()) + options.max_new;
  KVCache cache(planned);
  // The first pass reads the whole prompt; with the cache every later pass reads one token.
  torch::Tensor next_input = torch::tensor(sequence, torch::kLong).view({1, -1}).to(device);
  for (int64_t step = 0; step < options.max_new; ++step) {
    torch::Tensor hidden;
    if (options.use_cache) {
      hidden = model->hidden(next_input, cache);  // (1, T, D)
    } else {
      hidden = model->hidden(torch::tensor(sequence, torch::kLong).view({1, -1}).to(device));
    }
    const auto logits = model->logits(hidden.select(1, hidden.size(1) - 1)).cpu();  // (1, V)
    const int32_t token = sample_token(logits[0], options, generator);
    generated.push_back(token);
    sequence.push_back(token);
    if (on_token) on_token(token);
    next_input = torch::full({1, 1}, int64_t(token), torch::kLong).to(device);
  }
  if (was_training) model->train();
  return generated;
}

}  // namespace extrap
