// `extrap task` (print a retrieval-task instance) and `extrap eval --retrieval TASK` (exact-match
// accuracy by length and depth).
#include "core/base/files.h"
#include "core/data/tokenizer.h"
#include "core/eval/retrieval_eval.h"
#include "core/runtime/distributed.h"
#include "core/train/trainer.h"
#include "experiments/cli/commands.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

namespace po = boost::program_options;

namespace extrap::cli {

namespace {

// A byte-level corpus with no text: all a byte-level task instance needs.
Corpus byte_corpus() {
  Corpus corpus;
  corpus.name = "(bytes)";
  corpus.tokenizer = Tokenizer::byte;
  corpus.vocab_size = kByteVocabSize;
  corpus.mask_token = kByteMask;
  return corpus;
}

// The depths of a length that place the key alike, said in one line under its row.
std::string placement_note(int64_t length, const std::vector<RetrievalPlacement>& groups) {
  std::string text;
  for (const auto& g : groups) {
    if (g.depths.size() < 2) continue;
    std::string depths;
    for (double d : g.depths) depths += (depths.empty() ? "" : ", ") + number_text(d);
    char placed[48];
    std::snprintf(placed, sizeof placed, " (at %.0f%%%s)", g.pooled.placed_depth, text.empty() ? " of it" : "");
    text += (text.empty() ? "" : " and ") + depths + placed;
  }
  return "  (length " + std::to_string(length) + ": the filler's few sentences place the key alike for depths " + text +
         ": each group is one measurement, its instances pooled)";
}

}  // namespace

int task(const Args& args) {
  po::options_description options("extrap task");
  std::string task_name = "passkey", config_path, json_path;
  int64_t length = 0, seed = 1;
  double depth = 50;
  options.add_options()
      ("task", po::value(&task_name), "passkey | multikey | variable_tracking")
      ("length", po::value(&length)->required(), "tokens in the instance (prompt and answer)")
      ("depth", po::value(&depth), "where the key goes, percent of the filler (default 50)")
      ("seed", po::value(&seed), "instance seed (default 1)")
      ("config", po::value(&config_path),
       "use this config's corpus and tokenizer (default: byte level, no corpus needed)")
      ("json", po::value(&json_path), "also write the tokens and offsets to this JSON file");
  po::variables_map vm;
  if (!parse(args, "extrap task --length N [--task passkey|multikey|variable_tracking] [--depth 50] [--seed 1]",
             options, vm))
    return 0;
  check_json_path(json_path, "task");
  const RetrievalTask kind = parse_enum<RetrievalTask>(task_name, "--task");
  if (kind == RetrievalTask::none) throw ConfigError("--task none: name a task (passkey, multikey, variable_tracking)");
  if (!(depth >= 0 && depth <= 100))
    throw ConfigError("--depth " + number_text(depth) + ": must be a percentage in [0, 100]");
  check_instance_memory(length, 1);
  const Corpus corpus = config_path.empty() ? byte_corpus() : load_corpus(load_config(config_path, {}).data);
  const TaskGenerator generator(kind, corpus);
  const TaskInstance instance = generator.make(length, depth / 100.0, uint64_t(seed));
  const std::vector<int32_t> prompt(instance.tokens.begin(),
                                    instance.tokens.begin() + instance.prompt_length);
  std::cout << generator.text(prompt) << "\n";
  std::cerr << "answer '" << generator.text(instance.answer) << "' (" << instance.answer.size()
            << " tokens";
  if (kind == RetrievalTask::variable_tracking)
    std::cerr << "; its " << instance.variables.size() << " names in any order are right"
              << "); the assignment of " << instance.key << " to " << instance.name
              << " is tokens [";
  else
    std::cerr << "); the " << instance.name << " key sentence is tokens [";
  std::cerr << instance.key_begin << ", " << instance.key_end << ") at depth "
            << number_text(instance.depth * 100) << "% of the filler\n";
  if (!json_path.empty()) {
    const nlohmann::json document = {{"written_by", json_written_by("task")},
                                     {"task", task_name},
                                     {"length", length},
                                     {"depth_asked", depth},
                                     {"seed", seed},
                                     {"tokens", instance.tokens},
                                     {"prompt_length", instance.prompt_length},
                                     {"answer", instance.answer},
                                     {"key", instance.key},
                                     {"name", instance.name},
                                     {"key_begin", instance.key_begin},
                                     {"key_end", instance.key_end},
                                     {"depth", instance.depth},
                                     {"distractor_keys", instance.distractor_keys},
                                     {"distractor_begins", instance.distractor_begins},
                                     {"variables", instance.variables},
                                     {"statement_begins", instance.statement_begins}};
    write_file_atomic(json_path, document.dump(1) + "\n");
  }
  return 0;
}

int evaluate_retrieval_all(TransformerLM& model, const Corpus& corpus, RetrievalSpec spec,
                           const std::vector<int64_t>& lengths, int64_t train_length,
                           RopeScalingKind rope, double rope_factor, nlohmann::json* rows,
                           torch::Device device) {
  check_retrieval_spec(spec);
  std::printf("%-10s", "length");
  for (double d : spec.depths) std::printf(" %8s", (number_text(d) + "%").c_str());
  std::printf(" %9s %12s %8s\n", "accuracy", "nll/answer", "seconds");
  int failures = 0;
  for (int64_t length : lengths) {
    spec.length = length;
    StatusLine progress(ProcessGroup::leader());
    spec.on_progress = progress_display(progress, "length " + std::to_string(length), "instances");
    const std::string failure = failure_of([&] {
      spec.rope_scaling = rope_scaling_for(rope, rope_factor, train_length, length);
      if (const std::string warning = estimate_retrieval_work(model, spec, device)
                                          .warning("extrap eval: retrieval at length " + std::to_string(length));
          !warning.empty() && ProcessGroup::leader()) {
        progress.clear();
        std::cerr << warning << std::endl;
      }
      const RetrievalResult r = evaluate_retrieval(model, corpus, spec, device);
      progress.clear();
      std::printf("%-10lld", (long long)length);
      // A group of depths that place the key alike is one measurement: its pooled accuracy
      // under its first depth, "=D%" under the others (D that first depth).
      const std::vector<RetrievalPlacement> groups = retrieval_placement_groups(r.cells);
      nlohmann::json cells = nlohmann::json::array();
      for (const auto& c : r.cells) {
        if (c.distinct()) {
          for (const auto& g : groups)
            if (g.pooled.depth == c.depth) std::printf(" %8.2f", double(g.pooled.correct) / double(g.pooled.trials));
        } else {
          std::printf(" %8s", ("=" + number_text(c.same_as) + "%").c_str());
        }
        cells.push_back({{"depth", c.depth}, {"trials", c.trials}, {"correct", c.correct},
                         {"answer_nll", c.answer_nll}, {"answer_tokens", c.answer_tokens},
                         {"placed_depth", c.placed_depth}, {"same_as", c.same_as}});
      }
      const RetrievalCell total = retrieval_totals(r.cells);
      std::printf(" %9.3f %12.4f %8.2f\n", r.accuracy,
                  total.answer_nll / double(total.answer_tokens), r.seconds);
      if (groups.size() < r.cells.size()) std::printf("%s\n", placement_note(length, groups).c_str());
      if (rows)
        rows->push_back({{"length", length}, {"status", "ok"}, {"accuracy", r.accuracy},
                         {"trials", r.trials}, {"correct", r.correct}, {"seconds", r.seconds},
                         {"cells", cells}});
    });
    if (!failure.empty()) {
      progress.clear();
      ++failures;
      print_failed_length(length, failure, rows);
    }
    std::fflush(stdout);
  }
  return failures;
}

}  // namespace extrap::cli
