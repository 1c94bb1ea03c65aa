// LongPPL (core/eval/longppl.h): the evaluator's per-token NLLs against a forward pass per
// target over exactly the context the definition gives it (its non-overlapping window; its last
// K tokens), the key-token rule on hand-made NLLs at its boundaries, LongPPL of one model on
// another model's key tokens against the same brute force, and `extrap eval --longppl`.
#include "core/eval/longppl.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace extrap;

namespace {

TransformerLM seeded_model(uint64_t seed) {
  torch::manual_seed(seed);
  auto model = build_model(testing::tiny_config("alibi"), 257);
  model->eval();
  return model;
}

// The NLL of target t (1 <= t) read after stream tokens [start, t).
double target_nll(TransformerLM& model, const TokenStream& stream, int64_t start, int64_t t) {
  torch::NoGradGuard no_grad;
  auto context = torch::empty({1, t - start}, torch::kLong);
  for (int64_t p = start; p < t; ++p) context[0][p - start] = stream.data()[p];
  const auto logp = torch::log_softmax(model->forward(context)[0][t - start - 1], -1);
  return -logp[stream.data()[t]].item<double>();
}

// An evaluation result with hand-made token NLLs and window positions (NaN / -1: not scored).
EvalResult made(int64_t length, int64_t stride, const std::vector<double>& nll,
                const std::vector<int64_t>& position) {
  EvalResult r;
  r.length = length;
  r.stride = stride;
  r.token_nll = torch::tensor(nll, torch::kFloat64);
  r.token_position = torch::tensor(position, torch::kLong);
  return r;
}

}  // namespace

TEST_CASE("token NLLs of the evaluator equal a forward pass per target over its own context",
          "[eval][longppl]") {
  auto corpus = testing::tiny_byte_corpus(2);
  auto model = seeded_model(7);
  const int64_t n = 70;
  for (auto [L, S] : std::vector<std::pair<int64_t, int64_t>>{{24, 0}, {8, 1}, {8, 3}}) {
    INFO("L " << L << " S " << S);
    EvalSpec spec;
    spec.length = L;
    spec.stride = S;
    spec.max_tokens = n;
    spec.batch_tokens = 40;
    spec.keep_token_nll = true;
    const EvalResult r = evaluate(model, corpus, corpus.valid, spec);
    REQUIRE(r.token_nll.size(0) == n);
    REQUIRE(std::isnan(r.token_nll[0].item<double>()));  // token 0 is never a target
    REQUIRE(r.token_position[0].item<int64_t>() == -1);
    double sum = 0;
    for (int64_t t = 1; t < n; ++t) {
      // The definition's context: the non-overlapping window, or the last L tokens at stride 1.
      int64_t start = ((t - 1) / L) * L;
      if (S == 1) start = std::max<int64_t>(0, t - L);
      if (S == 3) continue;  // checked by the sums below only
      CAPTURE(t);
      CHECK(r.token_position[t].item<int64_t>() == t - 1 - start);
      CHECK(r.token_nll[t].item<double>() ==
            Approx(target_nll(model, corpus.valid, start, t)).epsilon(1e-5));
    }
    for (int64_t t = 1; t < n; ++t) sum += r.token_nll[t].item<double>();
    CHECK(sum == Approx(r.nll_sum).epsilon(1e-12));
  }
  EvalSpec plain;
  plain.length = 16;
  plain.max_tokens = n;
  CHECK_FALSE(evaluate(model, corpus, corpus.valid, plain).token_nll.defined());
}

TEST_CASE("key tokens: candidates past K tokens of context, a gain above alpha and a "
          "log-probability above beta, strictly",
          "[eval][longppl]") {
  const double nan = NAN;
  // Targets 1..7 of an 8-token stream at T = 4 (windows [0, 4), [4, 8)), K = 2: positions
  // p = 0 1 2 3 | 0 1 2; candidates p >= 2: targets 3, 4, 7.
  const EvalResult long_eval = made(4, 4, {nan, 1.0, 1.0, 0.5, 1.5, 0.1, 1.0, 2.0},
                                    {-1, 0, 1, 2, 3, 0, 1, 2});
  const EvalResult short_eval = made(2, 1, {nan, 9.0, 9.0, 3.0, 3.5, 9.0, 9.0, 4.0},
                                     {-1, 0, 1, 1, 1, 1, 1, 1});
  LongPplSpec spec;
  spec.short_length = 2;
  KeyTokens keys = select_key_tokens(long_eval, short_eval, spec);
  CHECK(keys.candidates == 3);
  // Target 3: gain 2.5 > 2, -0.5 > -2: key. Target 4: gain exactly 2: not. Target 7: gain 2,
  // not. Targets 1, 2, 5, 6: gains of 8 but no more context than K.
  CHECK(keys.count == 1);
  CHECK(keys.key[3].item<bool>());
  spec.alpha = 1.9;
  keys = select_key_tokens(long_eval, short_eval, spec);
  CHECK(keys.count == 2);  // 3 and 4; target 7's -2.0 is not above beta
  CHECK_FALSE(keys.key[7].item<bool>());
  spec.beta = -2.5;
  CHECK(select_key_tokens(long_eval, short_eval, spec).count == 3);

  // LongPPL over the keys: exp(mean of the evaluated model's NLLs there).
  const EvalResult evaluated = made(4, 4, {nan, 5, 5, 0.3, 0.7, 5, 5, 1.1}, {-1, 0, 1, 2, 3, 0, 1, 2});
  const LongPplResult r = longppl(evaluated, select_key_tokens(long_eval, short_eval, spec));
  CHECK(r.key_tokens == 3);
  CHECK(r.nll_sum == Approx(2.1));
  CHECK(r.longppl == Approx(std::exp(0.7)));
  spec.alpha = 100;
  CHECK(std::isnan(longppl(evaluated, select_key_tokens(long_eval, short_eval, spec)).longppl));

  // Refusals.
  spec.alpha = 2;
  spec.short_length = 4;
  CHECK_THROWS_WITH(select_key_tokens(long_eval, short_eval, spec), Catch::Contains("evaluate past K"));
  spec.short_length = 2;
  CHECK_THROWS_WITH(select_key_tokens(long_eval, made(2, 2, {nan, 1, 1, 1, 1, 1, 1, 1}, {-1, 0, 1, 0, 1, 0, 1, 0}), spec),
                    Catch::Contains("stride 1"));
  CHECK_THROWS_WITH(select_key_tokens(long_eval, made(2, 1, {nan, 1, 1}, {-1, 0, 1}), spec),
                    Catch::Contains("the same"));
  CHECK_THROWS_WITH(select_key_tokens(made(4, 2, {nan, 1}, {-1, 0}), short_eval, spec),
                    Catch::Contains("non-overlapping"));
  CHECK_THROWS_WITH(select_key_tokens(EvalResult{}, short_eval, spec), Catch::Contains("keep_token_nll"));
  CHECK_THROWS_WITH(select_key_tokens(made(4, 4, {nan, 1.0, 1.0, NAN, 1.5, 0.1, 1.0, 2.0},
                                           {-1, 0, 1, 2, 3, 0, 1, 2}),
                                      short_eval, spec),
                    Catch::Contains("not finite"));
  CHECK_THROWS_WITH(longppl(made(8, 8, {nan, 1, 1, 1, 1, 1, 1, 1}, {-1, 0, 1, 2, 3, 4, 5, 6}),
                            select_key_tokens(long_eval, short_eval, spec)),
                    Catch::Contains("selected at length 4"));
}

TEST_CASE("LongPPL of one model on another's key tokens equals a forward pass per target",
          "[eval][longppl]") {
  auto corpus = testing::tiny_byte_corpus(3);
  auto reference = seeded_model(7), evaluated = seeded_model(8);
  const int64_t n = 90, T = 40, K = 6;
  LongPplSpec spec;
  spec.short_length = K;
  spec.alpha = 0.02;  // an untrained model gains little from more context: keys at a low bar
  spec.beta = -10;
  EvalSpec base;
  base.max_tokens = n;
  base.batch_tokens = 64;
  base.keep_token_nll = true;
  EvalSpec long_spec = base;
  long_spec.length = T;
  const KeyTokens keys =
      select_key_tokens(evaluate(reference, corpus, corpus.valid, long_spec),
                        evaluate(reference, corpus, corpus.valid, short_context_spec(base, K)), spec);
  const LongPplResult r = longppl(evaluate(evaluated, corpus, corpus.valid, long_spec), keys);
  // The same from the definition, target by target.
  int64_t candidates = 0, count = 0;
  double nll = 0;
  for (int64_t t = 1; t < n; ++t) {
    const int64_t start = ((t - 1) / T) * T;
    if (t - 1 - start < K) continue;
    ++candidates;
    const double long_nll = target_nll(reference, corpus.valid, start, t);
    const double short_nll = target_nll(reference, corpus.valid, t - K, t);
    if (short_nll - long_nll > spec.alpha && -long_nll > spec.beta) {
      ++count;
      nll += target_nll(evaluated, corpus.valid, start, t);
      CHECK(keys.key[t].item<bool>());
    }
  }
  CHECK(keys.candidates == candidates);
  REQUIRE(count > 3);
  CHECK(r.key_tokens == count);
  CHECK(r.nll_sum == Approx(nll).epsilon(1e-5));
  CHECK(r.longppl == Approx(std::exp(nll / double(count))).epsilon(1e-5));
}

TEST_CASE("extrap eval --longppl: the rows of an in-process evaluation, another run's key tokens, "
          "refusals",
          "[eval][longppl][cli]") {
  using namespace extrap::testing;
  SweepDir d;
  const std::string train =
      "data: {path: corpus, tokenizer: byte, cache_dir: cache}\n"
      "model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}\n"
      "position: alibi\n"
      "train: {seq_len: 16, batch_tokens: 256, steps: 30, lr: 0.003, warmup: 2, validate_every: 0,\n"
      "        validate_tokens: 0, checkpoint_every: 0, log_every: 10, threads: 1, out_dir: runs/a}\n"
      "eval: {lengths: [16], max_tokens: 512}\n";
  write_text(d.root / "train.yaml", train);
  std::string out;
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml"}, &out) == 0);
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--set", "train.out_dir=runs/b", "--set",
                      "position=rotary"},
                  &out) == 0);
  const auto rows_of = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"eval", "--checkpoint", "runs/a", "--length", "48", "96",
                                     "--longppl", "--max-tokens", "800", "--json", "lp.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    REQUIRE(run_cli(d, args, &out) == 0);
    return nlohmann::json::parse(read_text(d.root / "lp.json"));
  };
  auto a = load_cli_run(d, "runs/a"), b = load_cli_run(d, "runs/b");
  for (const bool other : {false, true}) {
    INFO("key tokens from " << (other ? "runs/b" : "runs/a"));
    const auto document =
        rows_of(other ? std::vector<std::string>{"--longppl-reference", "runs/b", "--longppl-short", "8"}
                      : std::vector<std::string>{});
    const int64_t k = other ? 8 : 16;  // default: the training length
    CHECK(document["longppl_short"] == k);
    CHECK(document["longppl_reference"] == (other ? "runs/b" : "runs/a"));
    REQUIRE(document["results"].size() == 2);
    EvalSpec base;
    base.max_tokens = 800;
    base.keep_token_nll = true;
    TransformerLM& selector = other ? b.run.model : a.run.model;
    const EvalResult short_eval =
        evaluate(selector, a.corpus, a.corpus.valid, short_context_spec(base, k));
    LongPplSpec spec;
    spec.short_length = k;
    for (const auto& row : document["results"]) {
      EvalSpec long_spec = base;
      long_spec.length = row["length"].get<int64_t>();
      const EvalResult evaluated = evaluate(a.run.model, a.corpus, a.corpus.valid, long_spec);
      const LongPplResult r = longppl(
          evaluated,
          select_key_tokens(evaluate(selector, a.corpus, a.corpus.valid, long_spec), short_eval, spec));
      CHECK(row["status"] == "ok");
      CHECK(row["key_tokens"] == r.key_tokens);
      CHECK(row["candidates"] == r.candidates);
      CHECK(row["perplexity"].get<double>() == Approx(evaluated.perplexity).epsilon(1e-9));
      if (r.key_tokens > 0) CHECK(row["longppl"].get<double>() == Approx(r.longppl).epsilon(1e-9));
      else CHECK(row["longppl"].is_null());
    }
  }
  // A key-token model on other tokens (a word-level run), a masked LM, no run at all.
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--set", "train.out_dir=runs/words", "--set",
                      "data.tokenizer=word", "--set", "train.steps=2"}, &out) == 0);
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--set", "train.out_dir=runs/mlm", "--set",
                      "model.objective=masked_lm", "--set", "position=alibi_symmetric", "--set", "train.steps=2"},
                  &out) == 0);
  // Refusals, each in one line.
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl", "--longppl-reference", "runs/words"},
            "--longppl-reference runs/words reads other data or tokens than the evaluated run"},
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl", "--longppl-reference", "runs/mlm"},
            "--longppl-reference runs/mlm is a masked LM; LongPPL's key tokens need a causal model"},
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl", "--longppl-reference", "runs/none"},
            "runs/none"},
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl-short", "8"}, "add --longppl"},
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl", "--longppl-short", "0"},
            "--longppl-short 0"},
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl", "--retrieval", "passkey"},
            "one at a time"},
           {{"eval", "--checkpoint", "runs/a", "--length", "48", "--longppl", "--stride", "8"},
            "--stride is not taken with --longppl"},
           // What only a causal model has, on a masked LM (docs/refusals.md), before any row.
           {{"eval", "--checkpoint", "runs/mlm", "--length", "16", "--streaming", "8"},
            "--streaming: run runs/mlm is a masked LM; StreamingLLM reads a causal model's stream"},
           {{"eval", "--checkpoint", "runs/mlm", "--length", "48", "--retrieval", "passkey"},
            "--retrieval: run runs/mlm is a masked LM; retrieval scores a causal model's greedy answer"},
           {{"eval", "--checkpoint", "runs/mlm", "--length", "48", "--longppl"},
            "--longppl: run runs/mlm is a masked LM; LongPPL scores a causal model's next-token predictions"}}) {
    CHECK(run_cli(d, args, &out) == 2);
    require_one_line_error(out, expected);
  }
  // A length within the short context fails as a row, and the command exits 1.
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "--length", "16", "--longppl"}, &out) == 1);
  CHECK_THAT(out, Catch::Contains("evaluate past K"));
}
