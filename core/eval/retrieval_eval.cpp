#include "core/eval/retrieval_eval.h"

#include "core/model/memory_estimate.h"
#include "core/runtime/progress.h"

#include <chrono>
#include <cmath>
#include <map>
#include <set>

namespace extrap {

uint64_t retrieval_instance_seed(int64_t seed, int64_t length, double depth, int64_t sample) {
  return task_seed({uint64_t(seed), uint64_t(length), uint64_t(std::llround(depth * 1000.0)),
                    uint64_t(sample), 0x72657472u});
}

bool greedy_answer_is_right(const TaskInstance& instance, std::vector<int32_t> generated,
                            const GreedyStep& step) {
  const int64_t length = int64_t(instance.tokens.size());
  for (;;) {
    const AnswerMatch match = match_answer(instance, generated);
    if (match != AnswerMatch::partial) return match == AnswerMatch::complete;
    std::vector<int64_t> sequence(instance.tokens.begin(), instance.tokens.end());
    for (size_t g = 0; g < generated.size(); ++g)
      sequence[size_t(instance.prompt_length) + g] = generated[g];
    const int64_t row = instance.prompt_length + int64_t(generated.size()) - 1;
    // A right answer has answer.size() tokens, so an open one is shorter.
    TORCH_CHECK(row < length - 1, "retrieval: an open answer as long as the instance's");
    generated.push_back(step(sequence, row));
  }
}

GreedyStep model_greedy_step(TransformerLM& model, int64_t banned, torch::Device device) {
  return [&model, banned, device](const std::vector<int64_t>& sequence, int64_t row) {
    torch::NoGradGuard no_grad;
    auto inputs = torch::tensor(sequence, torch::kLong).view({1, -1}).to(device);
    auto logits = model->logits(model->hidden(inputs).select(1, row)).to(torch::kFloat64).cpu();
    if (!logits.isfinite().all().item<bool>())
      throw EvalFailure("retrieval at length " + std::to_string(sequence.size()) +
                        ": the model produced non-finite logits");
    if (banned >= 0) logits.select(1, banned).fill_(-INFINITY);
    return int32_t(logits.argmax(1).item<int64_t>());
  };
}

RetrievalCell retrieval_totals(const std::vector<RetrievalCell>& cells) {
  RetrievalCell total;
  for (const auto& c : cells) {
    total.trials += c.trials;
    total.correct += c.correct;
    total.answer_nll += c.answer_nll;
    total.answer_tokens += c.answer_tokens;
  }
  return total;
}

std::vector<RetrievalPlacement> retrieval_placement_groups(const std::vector<RetrievalCell>& cells) {
  std::vector<RetrievalPlacement> groups;
  for (const RetrievalCell& cell : cells) {
    RetrievalPlacement* group = nullptr;
    if (!cell.distinct())
      for (auto& g : groups)
        if (g.pooled.depth == cell.same_as) group = &g;
    if (!group) {
      groups.push_back({cell, {cell.depth}});
      continue;
    }
    RetrievalCell& p = group->pooled;
    const double weight = double(p.trials) + double(cell.trials);
    if (weight > 0)
      p.placed_depth = (p.placed_depth * double(p.trials) + cell.placed_depth * double(cell.trials)) / weight;
    p.trials += cell.trials;
    p.correct += cell.correct;
    p.answer_nll += cell.answer_nll;
    p.answer_tokens += cell.answer_tokens;
    group->depths.push_back(cell.depth);
  }
  return groups;
}

namespace {
// Each cell's placed_depth (the mean of its instances' depths) and same_as: cells c and d place
// alike when, for every filler length among the instances, the generator puts the key at the
// same boundary at c's depth as at d's.
void record_placements(const TaskGenerator& generator, const std::vector<double>& depths,
                       const std::vector<std::pair<size_t, const TaskInstance*>>& instances,
                       std::vector<RetrievalCell>& cells) {
  std::vector<double> fractions;
  for (double d : depths) fractions.push_back(d / 100.0);
  std::map<int64_t, std::vector<int64_t>> placements;  // filler length -> each depth's boundary
  std::vector<double> placed_sum(cells.size(), 0.0);
  std::vector<int64_t> count(cells.size(), 0);
  for (const auto& [cell, instance] : instances) {
    if (!placements.count(instance->filler))
      placements[instance->filler] = generator.key_placements(instance->filler, fractions);
    placed_sum[cell] += instance->depth * 100.0;
    ++count[cell];
  }
  for (size_t c = 0; c < cells.size(); ++c) {
    cells[c].placed_depth = count[c] > 0 ? placed_sum[c] / double(count[c]) : NAN;
    cells[c].same_as = cells[c].depth;
    for (size_t e = 0; e < c; ++e) {
      bool alike = true;
      for (const auto& [filler, at] : placements) alike = alike && at[c] == at[e];
      if (alike) {
        cells[c].same_as = cells[e].same_as;
        break;
      }
    }
  }
}
}  // namespace

void check_retrieval_spec(const RetrievalSpec& spec) {
  if (spec.task == RetrievalTask::none) throw ConfigError("retrieval: no task named");
  if (spec.depths.empty()) throw ConfigError("retrieval depths: give at least one (percent)");
  std::set<double> seen;
  for (double d : spec.depths) {
    if (!(d >= 0 && d <= 100))
      throw ConfigError("retrieval depth " + number_text(d) + ": must be a percentage in [0, 100]");
    if (!seen.insert(d).second)
      throw ConfigError("retrieval depth " + number_text(d) + " is listed twice");
  }
  if (spec.samples < 1)
    throw ConfigError("retrieval samples " + std::to_string(spec.samples) + ": must be at least 1");
  if (spec.batch_tokens < 1)
    throw ConfigError("retrieval batch_tokens " + std::to_string(spec.batch_tokens) +
                      ": must be at least 1");
}

void check_instance_memory(int64_t length, int64_t instances) {
  // An instance holds its tokens (4 bytes each) and, while it is laid out, the filler's sentence
  // starts (8 bytes each, a sentence being several tokens): 8 bytes a token bounds both.
  constexpr double kBytesPerToken = 8;
  const double bytes = std::min(double(length) * double(instances) * kBytesPerToken, 9.0e18);
  check_memory(int64_t(bytes),
               std::to_string(instances) + " retrieval instance(s) of " + std::to_string(length) + " tokens",
               "give a shorter retrieval length");
}

RetrievalWork estimate_retrieval_work(TransformerLM& model, const RetrievalSpec& spec, torch::Device device) {
  RetrievalWork work;
  work.instances = int64_t(spec.depths.size()) * spec.samples;
  const ModelConfig& m = model->config();
  const int64_t vocab = model->vocab_size();
  // A window holds the question and the answer's rows: a few dozen scored positions each.
  constexpr int64_t kScored = 16;
  work.flops = forward_flops(m, vocab, work.instances, spec.length, work.instances * kScored);
  // The rate: one window of up to 512 tokens, timed on its second pass (the first allocates).
  const int64_t probe = std::min<int64_t>(spec.length, 512);
  torch::NoGradGuard no_grad;
  EvaluationScope scope(model, RopeScaling{});
  const auto tokens = torch::zeros({1, probe}, torch::TensorOptions().dtype(torch::kLong).device(device));
  double seconds = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    auto hidden = model->hidden(tokens);
    model->logits(hidden.narrow(1, probe - 1, 1));
    if (device.is_cuda()) hidden.cpu();  // waits for the device
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double rate = forward_flops(m, vocab, 1, probe, 1) / std::max(seconds, 1e-9);
  if (std::isfinite(rate) && rate > 0) work.seconds = work.flops / rate;
  return work;
}

std::string RetrievalWork::warning(const std::string& who, double threshold) const {
  if (!(seconds > threshold)) return "";
  char days[32];
  std::snprintf(days, sizeof days, "%.0f days", seconds / 86400);
  char text[400];
  std::snprintf(text, sizeof text,
                "%s: %lld instance(s), about %.2g floating-point operations: about %s at the rate this model "
                "computes here (fewer samples or depths, or a shorter length, finish sooner)",
                who.c_str(), (long long)instances, flops,
                seconds > 2 * 86400 ? days : format_duration(seconds).c_str());
  return text;
}

RetrievalResult evaluate_retrieval(TransformerLM& model, const Corpus& corpus,
                                   const RetrievalSpec& spec, torch::Device device) {
  check_retrieval_spec(spec);
  if (!model->config().causal())
    throw EvalFailure("retrieval needs a causal model (the answer is generated); this one is a "
                      "masked LM");
  const TaskGenerator generator(spec.task, corpus);
  if (spec.length < generator.min_length())
    throw EvalFailure("retrieval task " + enum_name(spec.task) + " at length " +
                      std::to_string(spec.length) + ": an instance needs at least " +
                      std::to_string(generator.min_length()) + " tokens");
  // Refused before any instance is built: the instances, then the model's batch of them.
  const int64_t instances = int64_t(spec.depths.size()) * spec.samples;
  const int64_t per_batch = std::max<int64_t>(1, spec.batch_tokens / spec.length);
  check_instance_memory(spec.length, instances);
  check_window_memory(model, std::min(per_batch, instances), spec.length);
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  EvaluationScope scope(model, spec.rope_scaling);

  // Every (depth, sample) instance, batched by length alone: all have `length` tokens.
  struct Trial {
    size_t cell;
    TaskInstance instance;
  };
  std::vector<Trial> trials;
  RetrievalResult result;
  result.length = spec.length;
  result.correct_by_trial.assign(size_t(spec.depths.size()) * size_t(spec.samples), 0);
  for (size_t c = 0; c < spec.depths.size(); ++c) {
    result.cells.push_back({spec.depths[c], 0, 0, 0.0, 0, NAN, NAN});
    for (int64_t s = 0; s < spec.samples; ++s)
      trials.push_back(
          {c, generator.make(spec.length, spec.depths[c] / 100.0,
                             retrieval_instance_seed(spec.seed, spec.length, spec.depths[c], s))});
  }
  {
    std::vector<std::pair<size_t, const TaskInstance*>> instances;
    for (const Trial& t : trials) instances.push_back({t.cell, &t.instance});
    record_placements(generator, spec.depths, instances, result.cells);
  }
  const int64_t banned = corpus.byte_level() ? corpus.mask_token : -1;
  const GreedyStep step = model_greedy_step(model, banned, device);

  for (size_t first = 0; first < trials.size(); first += size_t(per_batch)) {
    const int64_t count = std::min<int64_t>(per_batch, int64_t(trials.size() - first));
    auto inputs = torch::empty({count, spec.length}, torch::kLong);
    auto in = inputs.accessor<int64_t, 2>();
    // The rows of the positions that predict the answer: the last prompt token and every
    // answer token but the last.
    std::vector<int64_t> rows;
    for (int64_t b = 0; b < count; ++b) {
      const TaskInstance& instance = trials[first + size_t(b)].instance;
      for (int64_t p = 0; p < spec.length; ++p) in[b][p] = instance.tokens[size_t(p)];
      for (int64_t p = instance.prompt_length - 1; p < spec.length - 1; ++p)
        rows.push_back(b * spec.length + p);
    }
    auto hidden = model->hidden(inputs.to(device));  // (b, T, D)
    auto picked = hidden.reshape({-1, hidden.size(-1)})
                      .index_select(0, torch::tensor(rows, torch::kLong).to(device));  // (R, D)
    auto logits = model->logits(picked).to(torch::kFloat64).cpu();                 // (R, V)
    if (!logits.isfinite().all().item<bool>())
      throw EvalFailure("retrieval at length " + std::to_string(spec.length) +
                        ": the model produced non-finite logits");
    if (banned >= 0) logits.select(1, banned).fill_(-INFINITY);
    auto log_probs = torch::log_softmax(logits, 1);
    auto best = logits.argmax(1);
    auto lp = log_probs.accessor<double, 2>();
    auto top = best.accessor<int64_t, 1>();
    int64_t row = 0;
    for (int64_t b = 0; b < count; ++b) {
      const Trial& trial = trials[first + size_t(b)];
      const TaskInstance& instance = trial.instance;
      RetrievalCell& cell = result.cells[trial.cell];
      // Greedy decoding's choices while it follows the answer, then its first other choice
      // (that row's most likely token).
      std::vector<int32_t> generated;
      for (size_t a = 0; a < instance.answer.size(); ++a, ++row) {
        if (generated.size() == a && (a == 0 || generated[a - 1] == instance.answer[a - 1]))
          generated.push_back(int32_t(top[row]));
        cell.answer_nll -= lp[row][instance.answer[a]];
        ++cell.answer_tokens;
      }
      const bool correct = greedy_answer_is_right(instance, std::move(generated), step);
      ++cell.trials;
      cell.correct += correct;
      result.correct_by_trial[first + size_t(b)] = correct;
    }
    if (spec.on_progress) spec.on_progress(int64_t(first) + count, int64_t(trials.size()));
  }
  const RetrievalCell total = retrieval_totals(result.cells);
  if (!std::isfinite(total.answer_nll))
    throw EvalFailure("retrieval at length " + std::to_string(spec.length) +
                      ": the answer's NLL is not finite");
  result.trials = total.trials;
  result.correct = total.correct;
  result.accuracy = double(result.correct) / double(result.trials);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace extrap
