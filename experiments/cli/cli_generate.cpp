// `extrap generate`: text from a trained causal model, with a per-layer KV cache; and
// `extrap bench generate`: decode tokens/s with and without the cache.
#include "core/base/files.h"
#include "core/data/hf_tokenizer.h"
#include "core/data/sentencepiece.h"
#include "core/data/tokenizer.h"
#include "core/eval/generate.h"
#include "core/runtime/sysinfo.h"
#include "core/train/trainer.h"
#include "experiments/cli/commands.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace po = boost::program_options;

namespace extrap::cli {

namespace {

// The prompt as the corpus's tokens. Word level and sentencepiece: each line's words or pieces,
// <eos> between lines (none after the last unless the text ends with a newline); unknown words
// become <unk>.
std::vector<int32_t> encode_prompt(const Corpus& corpus, const std::string& text) {
  if (corpus.byte_level()) return byte_tokens(text);
  if (corpus.hf) return corpus.hf->encode(text).ids;  // as tokenizer(prompt): a BOS where it adds one
  const bool ends_line = !text.empty() && (text.back() == '\n' || text.back() == '\r');
  if (corpus.sentencepiece) {
    std::vector<int32_t> tokens = corpus.sentencepiece->encode_lines(text).ids;
    if (!tokens.empty() && !ends_line) tokens.pop_back();  // the last line's end-of-sentence
    return tokens;
  }
  if (!corpus.has_text()) {
    // Pre-tokenised corpora: the prompt is the ids themselves, separated by spaces.
    std::vector<int32_t> tokens;
    std::istringstream words(text);
    for (std::string word; words >> word;) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
      }
      if (used != word.size() || id < 0 || id >= corpus.vocab_size - 1)
        throw ConfigError("--prompt: '" + word + "' is not a token id below " +
                          std::to_string(corpus.vocab_size - 1) + " (corpus '" + corpus.name +
                          "' is pre-tokenised: give the prompt as ids separated by spaces)");
      tokens.push_back(int32_t(id));
    }
    return tokens;
  }
  WordVocabulary vocabulary(corpus.vocabulary);
  std::vector<int32_t> tokens = vocabulary.encode(text);
  if (!tokens.empty() && tokens.back() == kWordEos && !ends_line) tokens.pop_back();
  return tokens;
}

// How a generated token is printed: its bytes, a piece's text, or a word-level token's word
// with a space before it (a newline for <eos>).
std::string token_output(const Corpus& corpus, int32_t token) {
  if (corpus.byte_level() || corpus.hf) return corpus.token_text(token);  // hf: the token's bytes
  if (corpus.sentencepiece)
    return token == corpus.mask_token ? "<mask>" : corpus.sentencepiece->piece_text(token);
  if (!corpus.has_text()) return " " + corpus.token_text(token);
  if (token == corpus.eos_token) return "\n";
  std::string text(1, ' ');
  text += corpus.token_text(token);
  return text;
}

}  // namespace

int generate(const Args& args) {
  po::options_description options("extrap generate");
  std::string run_dir, prompt, prompt_file;
  GenerateOptions g;
  int64_t threads = 0;
  options.add_options()
      ("checkpoint", po::value(&run_dir)->required(), "run directory written by extrap train (a causal LM)")
      ("prompt", po::value(&prompt), "the text to continue")
      ("prompt-file", po::value(&prompt_file), "read the text to continue from this file")
      ("max-new", po::value(&g.max_new)->required(), "tokens to generate")
      ("temperature", po::value(&g.temperature), "sampling temperature (default 1; 0: greedy)")
      ("top-k", po::value(&g.top_k), "sample from the k most likely tokens (default 0: all)")
      ("seed", po::value(&g.seed), "seed of the sampling (default 0): the same seed, the same text")
      ("no-cache", "recompute the whole sequence at every step instead of using the KV cache")
      ("threads", po::value(&threads), "CPU threads (default: all cores)");
  po::variables_map vm;
  if (!parse(args, "extrap generate --checkpoint DIR --prompt TEXT|--prompt-file F --max-new N "
                   "[--temperature T --top-k K --seed S]", options, vm))
    return 0;
  if (vm.count("prompt") == vm.count("prompt-file"))
    throw ConfigError("give the text to continue with exactly one of --prompt and --prompt-file");
  if (vm.count("prompt-file")) prompt = read_file(prompt_file);
  g.use_cache = !vm.count("no-cache");
  check_generate_options(g);
  if (threads < 0) throw ConfigError("--threads " + std::to_string(threads) + ": must not be negative");
  configure_threads(threads);
  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  Corpus corpus = load_corpus(checkpoint.config.data);
  LoadedRun run = load_run(checkpoint, corpus);
  if (!run.model->config().causal())
    throw ConfigError("run " + run_dir + " is a masked LM; generation needs a causal model");
  const std::vector<int32_t> tokens = encode_prompt(corpus, prompt);
  if (tokens.empty())
    throw ConfigError(std::string(vm.count("prompt-file") ? "--prompt-file " + prompt_file : "--prompt") +
                      ": the prompt has no tokens");
  if (corpus.mask_token >= 0) g.banned.push_back(corpus.mask_token);

  std::cout << prompt << std::flush;
  const auto start = std::chrono::steady_clock::now();
  const auto generated = extrap::generate(run.model, tokens, g, [&](int32_t token) {
    std::cout << token_output(corpus, token) << std::flush;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << std::endl;  // before the summary on stderr
  std::fprintf(stderr, "generate: %zu prompt tokens, %zu new in %.2f s (%.1f tokens/s, %s; trained at L = %lld)\n",
               tokens.size(), generated.size(), seconds, double(generated.size()) / std::max(seconds, 1e-9),
               g.use_cache ? "KV cache" : "no cache", (long long)checkpoint.config.train.seq_len);
  return 0;
}

int bench_generate(const Args& args) {
  po::options_description options("extrap bench generate");
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t prompt_tokens = 64, new_tokens = 256, vocab = 257;
  options.add_options()
      ("config,c", po::value(&config_path)->required(), "YAML config (model and position; a causal LM)")
      ("set", po::value(&overrides)->composing(), "override a key (repeatable)")
      ("prompt-tokens", po::value(&prompt_tokens), "random prompt tokens (default 64)")
      ("new", po::value(&new_tokens), "tokens to generate (default 256)")
      ("vocab", po::value(&vocab), "vocabulary size (257: byte level)");
  po::variables_map vm;
  if (!parse(args, "extrap bench generate --config FILE [--prompt-tokens P] [--new N]", options, vm)) return 0;
  if (prompt_tokens < 1) throw ConfigError("--prompt-tokens must be at least 1");
  if (new_tokens < 1) throw ConfigError("--new must be at least 1");
  const Config config = load_config(config_path, overrides);
  if (!config.model.causal()) throw ConfigError(config_path + ": a masked LM cannot generate");
  const int threads = configure_threads(config.train.threads);
  torch::manual_seed(uint64_t(config.train.seed));
  TransformerLM model = build_model(config, vocab);
  model->eval();
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
  for (auto& t : prompt) t = int32_t(torch::randint(0, vocab, {1}).item<int64_t>());
  GenerateOptions g;
  g.max_new = new_tokens;
  g.temperature = 0;  // greedy: both ways must choose the same tokens
  std::printf("machine: %s\ndate: %s\nruntime: %s\n", machine_description().c_str(),
              iso_time_now().c_str(), runtime_summary().c_str());
  std::printf("model: %lld parameters, %lld layers, d_model %lld, heads %lld, position %s; %d threads\n",
              (long long)model->num_parameters(), (long long)config.model.layers,
              (long long)config.model.d_model, (long long)config.model.heads,
              position_label(config).c_str(), threads);
  std::printf("decode: %lld prompt tokens, %lld new tokens (greedy)\n", (long long)prompt_tokens,
              (long long)new_tokens);
  std::vector<int32_t> outputs[2];
  double rates[2] = {0, 0};
  for (int cached = 1; cached >= 0; --cached) {
    g.use_cache = cached == 1;
    GenerateOptions warmup = g;
    warmup.max_new = std::min<int64_t>(4, new_tokens);
    extrap::generate(model, prompt, warmup);
    const auto start = std::chrono::steady_clock::now();
    outputs[cached] = extrap::generate(model, prompt, g);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates[cached] = double(new_tokens) / seconds;
    std::printf("decode tokens/s %s: %.1f (%.3f s)\n", cached ? "with KV cache   " : "without KV cache", rates[cached], seconds);
  }
  std::printf("speed-up of the cache: %.2fx; same tokens both ways: %s\n", rates[1] / rates[0],
              outputs[0] == outputs[1] ? "yes" : "no");
  {  // The cache's size at the sequence's full length: keys and values of model.kv_heads heads.
    torch::NoGradGuard no_grad;
    std::vector<int64_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), outputs[1].begin(), outputs[1].end());
    KVCache cache(int64_t(all.size()));
    model->hidden(torch::tensor(all, torch::kLong).unsqueeze(0), cache);
    int64_t bytes = 0;
    for (const auto& layer : cache.layers) bytes += layer.keys.nbytes() + layer.values.nbytes();
    std::printf("KV cache at %lld tokens: %.1f KiB (%lld key and value heads of %lld)\n", (long long)all.size(),
                double(bytes) / 1024.0, (long long)config.model.key_value_heads(), (long long)config.model.heads);
  }
  return 0;
}

}  // namespace extrap::cli
