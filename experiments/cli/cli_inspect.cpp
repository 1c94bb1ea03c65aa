// `extrap positions`, `extrap inspect slopes|bias` and `extrap keys`: look inside without training.
#include "core/attention/householder.h"
#include "core/attention/stick_breaking.h"
#include "core/data/corpus.h"
#include "core/eval/attention_profile.h"
#include "core/model/config.h"
#include "core/runtime/sysinfo.h"
#include "core/train/trainer.h"
#include "experiments/cli/commands.h"
#include "experiments/sweep/sweep_spec.h"
#include "positions/alibi_slopes.h"
#include "positions/position.h"

#include <cmath>
#include <cstdio>
#include <iostream>

namespace po = boost::program_options;

namespace extrap::cli {

namespace {

std::string hook_names(unsigned hooks) {
  std::string out;
  if (hooks & kEmbed) out += "embed ";
  if (hooks & kRotateQK) out += "rotate_qk ";
  if (hooks & kBias) out += "bias ";
  return out.empty() ? "(none)" : out.substr(0, out.size() - 1);
}

std::string mode_names(unsigned modes) {
  std::string out;
  if (modes & kCausal) out += "causal ";
  if (modes & kBidirectional) out += "bidirectional ";
  return out.substr(0, out.size() - 1);
}

// %.9g prints every float exactly enough to round-trip; -inf as "-inf".
void print_matrix(const torch::Tensor& m) {
  auto a = m.to(torch::kFloat64).contiguous();
  auto acc = a.accessor<double, 2>();
  for (int64_t i = 0; i < a.size(0); ++i) {
    for (int64_t j = 0; j < a.size(1); ++j) {
      const double v = acc[i][j];
      if (j) std::fputc(' ', stdout);
      if (std::isinf(v)) std::fputs(v < 0 ? "-inf" : "inf", stdout);
      else std::printf("%.9g", v == 0 ? 0.0 : v);
    }
    std::fputc('\n', stdout);
  }
}

// What the method adds to the (H, T, T) scores of its layer `layer`. Methods that rotate q and k add no
// bias; for them, show the scores of a fixed unit query and key at every pair of positions
// so their relative pattern is still visible. A bias that depends on the layer input (fox) is
// shown at a zero input, one that depends on q.k (cope) for that unit query and key. A sliding
// window of `window` keys and chunks of `chunk` (the attention options; 0: none) mask entries
// to -inf as they do in the model.
torch::Tensor score_pattern(PositionMethod& method, const PositionInfo& info, int64_t heads,
                            int64_t d_head, int64_t length, bool causal, int64_t layer, int64_t window,
                            int64_t chunk) {
  torch::NoGradGuard no_grad;
  const LayerInput at = layer_window(layer, length);
  auto unit = torch::ones({1, heads, length, d_head}) / std::sqrt(double(d_head));
  auto q = unit.clone(), k = unit.clone();
  if (info.hooks & kRotateQK) method.rotate_qk(q, k, at);
  AttentionBias description = method.bias(at);
  description.window = window;
  description.chunk = chunk;
  torch::Tensor bias;
  if (description.kind == AttentionBias::Kind::StickBreaking) {
    // Not a bias: log A, the log of each key's stick-breaking weight, for the unit query and key.
    std::cerr << info.name << ": no bias; shown is log A_ij, the log of each key's stick-breaking weight, for a unit "
                 "query and key\n";
    return torch::log(stick_breaking_weights(q, k, description))[0];
  }
  if (description.kind == AttentionBias::Kind::Householder) {
    // Not a bias: the products' scores less the plain ones, at a zero input (every reflection the identity).
    auto plain = torch::matmul(q / std::sqrt(double(d_head)), k.transpose(-2, -1));  // (1, H, T, T)
    auto scores = householder_scores(q / std::sqrt(double(d_head)), k, description.householder_w,
                                     description.householder_beta);
    bias = (add_bias_(scores, description, q, causal) - plain)[0];
    std::cerr << info.name << ": no bias; shown are q^T H_i ... H_{j+1} k - q^T k for a unit query and key at a zero "
                 "layer input, where every reflection is the identity\n";
  } else if (description.kind == AttentionBias::Kind::Contextual || description.kind == AttentionBias::Kind::ScoreMixing) {
    auto scores = torch::matmul(q / std::sqrt(double(d_head)), k.transpose(-2, -1));  // (1, H, T, T)
    auto plain = scores.clone();
    bias = (add_bias_(scores, description, q, causal) - plain)[0];
    std::cerr << info.name << ": the bias depends on q.k; shown for a unit query and key\n";
  } else {
    bias = materialize_bias(description, heads, length, length, causal);
    if (bias.dim() == 4) bias = bias[0];  // per batch (fox): the only one
    if (description.kind == AttentionBias::Kind::Cumulative)
      std::cerr << info.name << ": the bias depends on the layer input; shown at a zero input\n";
  }
  if (info.hooks & kRotateQK) bias = bias + torch::matmul(q, k.transpose(-2, -1))[0];  // (H, T, T)
  return bias;
}

}  // namespace

int positions(const Args& args) {
  po::options_description options("extrap positions");
  std::vector<std::string> plugins;
  options.add_options()("plugin", po::value(&plugins)->composing(), "also load this plugin .so (repeatable)");
  po::variables_map vm;
  if (!parse(args, "extrap positions [--plugin PATH.so ...]", options, vm)) return 0;
  auto& registry = PositionRegistry::instance();
  for (const auto& p : plugins) registry.load_plugin(p);
  {
    auto documenter = OptionReader::documenter("position");
    read_sampling(documenter);
    std::cout << "every method marked 'randomized: yes' also takes\n";
    for (const OptionDoc& doc : documenter.docs())
      std::cout << "    option " << doc.key.substr(doc.key.find('.') + 1) << " = " << doc.default_value << "   " << doc.help << "\n";
    std::cout << "\n";
  }
  for (const auto& name : registry.names()) {
    const PositionInfo& info = registry.get(name);
    std::cout << name << "\n    " << info.description << "\n    hooks: " << hook_names(info.hooks)
              << "    modes: " << mode_names(info.modes)
              << "    randomized: " << (info.randomizable ? "yes" : "no");
    if (info.origin != "built-in") std::cout << "    from: " << info.origin;
    if (!info.reference_only.empty()) std::cout << "\n    attention: the reference path only (" << info.reference_only << ")";
    std::cout << "\n";
    for (const auto& o : info.options)
      std::cout << "    option " << o.key << " = " << o.default_value << "   " << o.help << "\n";
  }
  return 0;
}

namespace {

// "0", "1", "2-3", ... for the distance bins of a profile (the last one ends at length - 1).
std::string bin_label(const std::vector<int64_t>& edges, size_t b) {
  const int64_t first = edges[b], last = edges[b + 1] - 1;
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

// `extrap inspect attention`: a trained run's attention profile at one length
// (core/eval/attention_profile.h), one row per layer and head.
int inspect_attention(const Args& args) {
  std::string checkpoint, split = "valid", device_name;
  AttentionProfileSpec spec;
  int threads = 0;
  po::options_description options("extrap inspect attention");
  options.add_options()
      ("checkpoint", po::value(&checkpoint)->required(), "run directory written by extrap train")
      ("length", po::value(&spec.length)->required(), "window length T")
      ("windows", po::value(&spec.windows), "at most this many windows, from the split's start (default 8; 0: all)")
      ("max-tokens", po::value(&spec.max_tokens), "windows from the first N tokens only")
      ("split", po::value(&split), "valid | test | train")
      ("device", po::value(&device_name), "cpu | cuda (default: the device the run trained on)")
      ("threads", po::value(&threads), "CPU threads (default: all cores)");
  po::variables_map vm;
  if (!parse(args, "extrap inspect attention --checkpoint RUN --length T [--windows N]", options, vm))
    return 0;
  if (spec.length < 1) throw ConfigError("--length " + std::to_string(spec.length) + ": must be at least 1");
  if (spec.windows < 0) throw ConfigError("--windows " + std::to_string(spec.windows) + ": must not be negative");
  if (spec.max_tokens < 0) throw ConfigError("--max-tokens " + std::to_string(spec.max_tokens) + ": must not be negative");
  // An edge at the training length, as sweeps record it: the mass past L is a sum of columns.
  const Split which = parse_enum<Split>(split, "--split");
  configure_threads(threads);
  const VerifiedCheckpoint verified = require_checkpoint(checkpoint);
  const Config& config = verified.config;
  const Corpus corpus = load_corpus(config.data);
  LoadedRun run = load_run(verified, corpus);
  spec.split_at = config.train.seq_len;
  const torch::Device device = command_device(device_name, config.train.device, checkpoint, "inspect");
  run.model->to(device);
  const AttentionProfile profile = attention_profile(run.model, corpus.split(which), spec, device);
  std::printf("attention of %s (%s, trained %lld steps at L = %lld) at length %lld: %lld window(s) of the %s "
              "split, %s (%.1f s)\n",
              checkpoint.c_str(), position_label(config).c_str(), (long long)run.step,
              (long long)config.train.seq_len, (long long)spec.length, (long long)profile.windows, split.c_str(),
              profile.causal ? "causal, distance i - j" : "bidirectional, distance |i - j|", profile.seconds);
  std::printf("mass by distance, mean over queries (a row sums to 1 less the sink's share); entropy in nats\n");
  const size_t bins = profile.edges.size() - 1;
  std::printf("%-5s %-4s %8s %6s |", "layer", "head", "entropy", "sink");
  for (size_t b = 0; b < bins; ++b) std::printf(" %9s", bin_label(profile.edges, b).c_str());
  std::printf("\n");
  const bool has_sink = profile.sink.abs().max().item<double>() > 0;
  for (int64_t l = 0; l < profile.mass.size(0); ++l)
    for (int64_t h = 0; h < profile.mass.size(1); ++h) {
      char sink[16] = "-";
      if (has_sink) std::snprintf(sink, sizeof sink, "%.4f", profile.sink[l][h].item<double>());
      std::printf("%-5lld %-4lld %8.4f %6s |", (long long)l, (long long)h,
                  profile.entropy[l][h].sum().item<double>(), sink);
      for (size_t b = 0; b < bins; ++b) std::printf(" %9.4f", profile.mass[l][h][int64_t(b)].item<double>());
      std::printf("\n");
    }
  return 0;
}

}  // namespace

namespace {

int inspect_slopes(const Args& rest) {
  int heads = 0;
  po::variables_map vm;
  po::options_description options("extrap inspect slopes");
  options.add_options()("heads", po::value(&heads)->required(), "number of heads");
  if (!parse(rest, "extrap inspect slopes --heads H", options, vm)) return 0;
  for (double s : alibi_slopes(heads)) std::printf("%.17g\n", s);
  return 0;
}

// What `inspect bias` draws: a position method with its heads and head size, causal or not, the
// layer (its number among its kind's) and the window and chunk masks.
struct ShownBias {
  std::string name;
  std::shared_ptr<PositionMethod> method;
  int64_t heads = 0, d_head = 64, layer = 0, window = 0, chunk = 0;
  bool causal = true;
};

// A checkpoint's layer as it was trained: its method and learned values, its shape and masks.
// What the command line asked (`asked`, with `given` its flags) must agree with it.
ShownBias checkpoint_bias(const std::string& checkpoint, const ShownBias& asked, const po::variables_map& given) {
  const VerifiedCheckpoint verified = require_checkpoint(checkpoint);
  const Config& config = verified.config;
  Corpus corpus = load_corpus(config.data);
  LoadedRun run = load_run(verified, corpus);
  const LayerPlan& plan = run.model->plan();
  if (asked.layer < 0 || asked.layer >= config.model.layers)
    throw ConfigError("--layer " + std::to_string(asked.layer) + ": the checkpoint's layers are 0 to " +
                      std::to_string(config.model.layers - 1));
  const int64_t kind = plan.layer_kind[asked.layer];
  ShownBias shown;
  shown.name = plan.kinds[kind].position_name;
  if (!asked.name.empty() && asked.name != shown.name)
    throw ConfigError("--position " + asked.name + " does not match the checkpoint's method " + shown.name +
                      (plan.patterned() ? " in layer " + std::to_string(asked.layer) : ""));
  shown.heads = config.model.heads;
  shown.d_head = config.model.d_model / shown.heads;
  shown.causal = config.model.causal();
  shown.method = std::shared_ptr<PositionMethod>(run.model.ptr(), &run.model->kind_position(kind));
  const AttentionConfig& attention = plan.kinds[kind].attention;
  for (const auto& [flag, value] : {std::pair{"window", attention.window}, {"chunk", attention.chunk}})
    if (given.count(flag) && given[flag].as<int64_t>() != value)
      throw ConfigError(std::string("--") + flag + " " + std::to_string(given[flag].as<int64_t>()) + ": the checkpoint's " +
                        (plan.patterned() ? "layer " + std::to_string(asked.layer) : "model") + " has attention." +
                        flag + " " + std::to_string(value) + " (leave it out to see the layer's own)");
  shown.window = attention.window;
  shown.chunk = attention.chunk;
  shown.layer = plan.layer_index[asked.layer];  // the layer's number among its kind's
  return shown;
}

int inspect_bias(const Args& rest) {
  std::string checkpoint;
  ShownBias asked;
  std::vector<std::string> plugins, overrides;
  int64_t length = 0;
  po::variables_map vm;
  po::options_description options("extrap inspect bias");
  options.add_options()
      ("position", po::value(&asked.name), "position method (default: the checkpoint's)")
      ("heads", po::value(&asked.heads), "number of heads (default: the checkpoint's)")
      ("length", po::value(&length)->required(), "T: rows are queries 0..T-1, columns keys")
      ("bidirectional", "bidirectional attention (no causal mask)")
      ("head-dim", po::value(&asked.d_head), "head size (for methods that rotate q and k)")
      ("window", po::value(&asked.window), "mask keys W or more away, as attention.window does (-inf; with --checkpoint: "
                                           "the layer's own)")
      ("chunk", po::value(&asked.chunk), "mask keys outside the query's chunk of C, as attention.chunk does (-inf; with "
                                         "--checkpoint: the layer's own)")
      ("set", po::value(&overrides)->composing(), "a method option: --set base=500 (repeatable)")
      ("checkpoint", po::value(&checkpoint), "show a trained run's learned values")
      ("layer", po::value(&asked.layer), "with --checkpoint: the layer to show (its own method where layers follow a pattern)")
      ("plugin", po::value(&plugins)->composing(), "load this plugin .so first (repeatable)");
  if (!parse(rest, "extrap inspect bias --position NAME --heads H --length T [--bidirectional] [--window W] [--chunk C]",
             options, vm))
    return 0;
  // It prints H x T x T numbers: past a few thousand a screen cannot show them, and the matrix
  // alone would outgrow memory (10^5 is 40 GB a head).
  constexpr int64_t kLongestShown = 4096;
  if (length < 1 || length > kLongestShown)
    throw ConfigError("--length " + std::to_string(length) + ": must be 1 to " + std::to_string(kLongestShown) +
                      " (the matrix is printed whole, T x T numbers a head)");
  auto& registry = PositionRegistry::instance();
  for (const auto& p : plugins) registry.load_plugin(p);
  asked.causal = !vm.count("bidirectional");
  ShownBias shown = asked;
  if (!checkpoint.empty()) {
    shown = checkpoint_bias(checkpoint, asked, vm);
  } else {
    if (asked.name.empty() || asked.heads < 1) throw ConfigError("--position and --heads are required without --checkpoint");
    if (asked.layer != 0) throw ConfigError("--layer is for a checkpoint's layers: give --checkpoint RUN");
    YAML::Node options_node(YAML::NodeType::Map);
    for (const auto& o : overrides) apply_override(options_node, o);
    PositionContext context;
    context.num_heads = asked.heads;
    context.d_head = asked.d_head;
    context.d_model = asked.heads * asked.d_head;
    context.causal = asked.causal;
    shown.method = registry.create(asked.name, context, OptionReader(options_node, "--set", "position"));
  }
  const PositionInfo& info = registry.get(shown.name);
  shown.method->eval();
  if (shown.window < 0 || shown.chunk < 0)
    throw ConfigError("--" + std::string(shown.window < 0 ? "window" : "chunk") + " " +
                      std::to_string(shown.window < 0 ? shown.window : shown.chunk) + ": must not be negative (0: no mask)");
  auto pattern = score_pattern(*shown.method, info, shown.heads, shown.d_head, length, shown.causal, shown.layer,
                               shown.window, shown.chunk);  // (H, T, T)
  for (int64_t h = 0; h < shown.heads; ++h) {
    std::printf("head %lld\n", (long long)h);
    print_matrix(pattern[h]);
  }
  return 0;
}

}  // namespace

int inspect(const Args& args) {
  if (!args.empty() && args[0] == "attention") return inspect_attention(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "slopes") return inspect_slopes(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "bias") return inspect_bias(Args(args.begin() + 1, args.end()));
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << "usage: extrap inspect slopes --heads H\n"
                 "       extrap inspect bias --position NAME --heads H --length T [--bidirectional] [--window W] [--chunk C]\n"
                 "       extrap inspect attention --checkpoint RUN --length T [--windows N]\n";
    return 0;
  }
  throw ConfigError("expected 'slopes', 'bias' or 'attention' after 'inspect' (see extrap inspect --help)");
}

int config_keys(const Args& args) {
  po::options_description options("extrap keys");
  options.add_options()("sweep", "list the keys of a sweep file instead (grid, eval, output, ...)");
  po::variables_map vm;
  if (!parse(args, "extrap keys [--sweep]", options, vm)) return 0;
  const bool sweep = vm.count("sweep") > 0;
  // The mark says what a change of the key changes: the trained model (its run fingerprint),
  // the recorded evaluation, or nothing either records (sections carry none).
  // (A sweep file's keys have no mark: its base and grid values carry the configs' own.)
  if (sweep) {
    std::printf("%-32s %-14s %s\n", "key", "default", "meaning");
    for (const auto& doc : sweep_documentation())
      std::printf("%-32s %-14s %s\n", doc.key.c_str(), doc.default_value.c_str(), doc.help.c_str());
  } else {
    std::printf("%-32s %-14s %-10s %s\n", "key", "default", "affects", "meaning");
    for (const auto& doc : config_documentation())
      std::printf("%-32s %-14s %-10s %s\n", doc.key.c_str(), doc.default_value.c_str(),
                  doc.section ? "" : to_string(doc.affects), doc.help.c_str());
  }
  if (sweep)
    std::printf("\nbase holds an `extrap train` config (`extrap keys` lists its keys); grid.KEY "
                "takes any of them.\n");
  else
    std::printf("\nposition options depend on the method: see `extrap positions`; a sweep "
                "file's keys: `extrap keys --sweep`.\n");
  return 0;
}

}  // namespace extrap::cli
