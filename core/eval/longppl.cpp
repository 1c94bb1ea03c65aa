#include "core/eval/longppl.h"

#include <cmath>
#include <yaml-cpp/yaml.h>

namespace extrap {

namespace {

void require_tokens(const EvalResult& e, const char* which) {
  if (!e.token_nll.defined())
    throw EvalFailure(std::string("LongPPL: the ") + which +
                      " evaluation kept no token NLLs (EvalSpec::keep_token_nll)");
}

}  // namespace

EvalSpec short_context_spec(const EvalSpec& base, int64_t short_length) {
  EvalSpec spec = base;
  spec.length = short_length;
  spec.stride = 1;
  spec.rope_scaling = RopeScaling();
  spec.keep_token_nll = true;
  return spec;
}

KeyTokens select_key_tokens(const EvalResult& long_eval, const EvalResult& short_eval,
                            const LongPplSpec& spec) {
  require_tokens(long_eval, "long");
  require_tokens(short_eval, "short");
  const int64_t k = spec.short_length;
  if (k < 1) throw EvalFailure("LongPPL: short context " + std::to_string(k) + ": must be at least 1");
  if (long_eval.length <= k)
    throw EvalFailure("LongPPL at length " + std::to_string(long_eval.length) +
                      ": no target has more context than the short " + std::to_string(k) +
                      " tokens; evaluate past K");
  if (long_eval.stride != long_eval.length)
    throw EvalFailure("LongPPL: the long evaluation at " + std::to_string(long_eval.length) +
                      " has stride " + std::to_string(long_eval.stride) +
                      "; it takes non-overlapping windows");
  if (short_eval.length != k || short_eval.stride != 1)
    throw EvalFailure("LongPPL: the short evaluation is at length " +
                      std::to_string(short_eval.length) + ", stride " +
                      std::to_string(short_eval.stride) + "; it must be length " +
                      std::to_string(k) + ", stride 1");
  if (long_eval.token_nll.size(0) != short_eval.token_nll.size(0))
    throw EvalFailure("LongPPL: the long and short evaluations read " +
                      std::to_string(long_eval.token_nll.size(0)) + " and " +
                      std::to_string(short_eval.token_nll.size(0)) +
                      " tokens of the stream; they must read the same");
  const auto candidate = long_eval.token_position.ge(k).logical_and(short_eval.token_position.ge(0));
  const auto long_nll = long_eval.token_nll.masked_select(candidate);
  const auto short_nll = short_eval.token_nll.masked_select(candidate);
  if (!long_nll.isfinite().all().item<bool>() || !short_nll.isfinite().all().item<bool>())
    throw EvalFailure("LongPPL at length " + std::to_string(long_eval.length) +
                      ": a reference NLL is not finite");
  KeyTokens keys;
  keys.length = long_eval.length;
  keys.short_length = k;
  const auto gain = short_eval.token_nll - long_eval.token_nll;  // NaN where either is not scored
  keys.key = candidate.logical_and(gain.gt(spec.alpha))
                 .logical_and(long_eval.token_nll.neg().gt(spec.beta));
  keys.candidates = candidate.sum().item<int64_t>();
  keys.count = keys.key.sum().item<int64_t>();
  return keys;
}

LongPplResult longppl(const EvalResult& long_eval, const KeyTokens& keys) {
  require_tokens(long_eval, "evaluated model's");
  if (long_eval.length != keys.length || long_eval.stride != long_eval.length)
    throw EvalFailure("LongPPL: key tokens selected at length " + std::to_string(keys.length) +
                      " for an evaluation at length " + std::to_string(long_eval.length) +
                      (long_eval.stride != long_eval.length ? " with overlapping windows" : ""));
  if (long_eval.token_nll.size(0) != keys.key.size(0))
    throw EvalFailure("LongPPL: key tokens of a " + std::to_string(keys.key.size(0)) +
                      "-token stream for an evaluation of " +
                      std::to_string(long_eval.token_nll.size(0)));
  LongPplResult out;
  out.length = keys.length;
  out.short_length = keys.short_length;
  out.key_tokens = keys.count;
  out.candidates = keys.candidates;
  const auto nll = long_eval.token_nll.masked_select(keys.key);
  if (nll.isnan().any().item<bool>())
    throw EvalFailure("LongPPL at length " + std::to_string(keys.length) +
                      ": the evaluated model did not score every key token");
  out.nll_sum = nll.sum().item<double>();
  if (!std::isfinite(out.nll_sum))
    throw EvalFailure("LongPPL at length " + std::to_string(keys.length) +
                      ": the NLL over the key tokens is not finite");
  if (out.key_tokens > 0) out.longppl = std::exp(out.nll_sum / double(out.key_tokens));
  return out;
}

LoadedRun load_key_token_model(const std::string& run_dir, const Corpus& corpus, torch::Device device,
                               const std::string& what) {
  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  if (YAML::Dump(load_corpus(checkpoint.config.data).identity()) != YAML::Dump(corpus.identity()))
    throw ConfigError(what + " reads other data or tokens than the evaluated run: key tokens are positions "
                             "in one token stream");
  if (!checkpoint.config.model.causal())
    throw ConfigError(what + " is a masked LM; LongPPL's key tokens need a causal model");
  LoadedRun run = load_run(checkpoint, corpus);
  run.model->to(device);
  return run;
}

}  // namespace extrap
