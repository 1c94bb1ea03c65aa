// `extrap eval --longppl`: LongPPL by evaluation length (core/eval/longppl.h).
#include "core/runtime/distributed.h"
#include "experiments/cli/commands.h"

#include <cstdio>
#include <iostream>

namespace extrap::cli {

int evaluate_longppl_all(TransformerLM& model, TransformerLM* reference, const Corpus& corpus,
                         const Config& config, const LongPplSpec& spec, nlohmann::json* rows,
                         torch::Device device) {
  const TokenStream& stream = corpus.split(config.eval.split);
  TransformerLM& selector = reference ? *reference : model;
  // The reference's short-context NLLs, once for every length.
  EvalResult short_eval;
  const std::string short_failure = failure_of([&] {
    const EvalSpec base = eval_spec_for(config, spec.short_length);
    short_eval = evaluate(selector, corpus, stream, short_context_spec(base, spec.short_length), device);
  });
  std::printf("key tokens: %s, short context K = %lld, alpha %s, beta %s\n",
              reference ? "the reference run's" : "the evaluated model's own",
              (long long)spec.short_length, number_text(spec.alpha).c_str(),
              number_text(spec.beta).c_str());
  std::printf("%-10s %10s %10s %11s %11s %8s\n", "length", "ppl", "longppl", "key tokens",
              "candidates", "seconds");
  int failures = 0;
  for (int64_t length : config.eval.lengths) {
    std::string failure = short_failure.empty() ? "" : "short context evaluation: " + short_failure;
    if (failure.empty()) {
      failure = failure_of([&] {
        EvalSpec long_spec = eval_spec_for(config, length);
        long_spec.keep_token_nll = true;
        const EvalResult evaluated = evaluate(model, corpus, stream, long_spec, device);
        const KeyTokens keys = select_key_tokens(
            reference ? evaluate(*reference, corpus, stream, long_spec, device) : evaluated,
            short_eval, spec);
        const LongPplResult r = longppl(evaluated, keys);
        const double seconds = evaluated.seconds + short_eval.seconds;
        // With no key token LongPPL is empty, not a number (docs/evaluation.md).
        char longppl_text[32] = "-";
        if (std::isfinite(r.longppl)) std::snprintf(longppl_text, sizeof longppl_text, "%.4f", r.longppl);
        std::printf("%-10lld %10.4f %10s %11lld %11lld %8.2f\n", (long long)length,
                    evaluated.perplexity, longppl_text, (long long)r.key_tokens,
                    (long long)r.candidates, seconds);
        if (rows)
          rows->push_back({{"length", length}, {"status", "ok"},
                           {"perplexity", evaluated.perplexity},
                           {"longppl", std::isfinite(r.longppl) ? nlohmann::json(r.longppl)
                                                               : nlohmann::json()},
                           {"key_nll_sum", r.nll_sum}, {"key_tokens", r.key_tokens},
                           {"candidates", r.candidates}, {"short_length", r.short_length},
                           {"seconds", seconds}});
      });
    }
    if (!failure.empty()) {
      ++failures;
      print_failed_length(length, failure, rows);
    }
    std::fflush(stdout);
  }
  return failures;
}

}  // namespace extrap::cli
