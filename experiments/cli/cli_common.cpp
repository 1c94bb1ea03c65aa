#include "experiments/cli/commands.h"

#include "core/base/errors.h"
#include "core/run/run_dir.h"
#include "core/base/files.h"
#include "core/runtime/cuda_support.h"

#include <chrono>
#include <filesystem>
#include <iostream>

namespace po = boost::program_options;

namespace extrap::cli {

std::function<void(int64_t, int64_t)> progress_display(StatusLine& line, const std::string& what,
                                                       const std::string& unit) {
  const auto start = std::chrono::steady_clock::now();
  return [&line, what, unit, start](int64_t done, int64_t total) {
    if (!line.redraws()) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool last = done >= total;
    std::string text = what + ": " + std::to_string(done) + "/" + std::to_string(total) + " " + unit + ", " +
                       format_duration(seconds);
    if (!last && done > 0)
      text += ", about " + format_duration(seconds * double(total - done) / double(done)) + " left";
    line.status(text, last);
  };
}

std::string json_written_by(const std::string& command) { return "extrap " + command + " --json"; }

void check_json_path(const std::string& path, const std::string& command) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const std::string flag = "extrap " + command + " --json " + path;
  std::error_code error;
  if (fs::is_directory(path, error)) throw ConfigError(flag + ": is a directory; give a file name");
  if (const fs::path run = enclosing_run_directory(path); !run.empty())
    throw ConfigError(flag + ": lies inside the run directory " + run.string() +
                      ", whose own files it could overwrite; write it outside the run");
  check_output_folder(path, flag);  // said now, not after the evaluation
  if (!fs::exists(path, error)) return;
  bool ours = false;
  try {
    const auto document = nlohmann::json::parse(read_file(path));
    ours = document.is_object() && document.value("written_by", std::string()) == json_written_by(command);
  } catch (const std::exception&) {
    ours = false;
  }
  if (!ours)
    throw ConfigError(flag + ": " + path + " exists and is not an earlier output of `" + json_written_by(command) +
                      "`; it is left as it is: remove it or choose another path");
}

bool parse(const Args& args, const std::string& usage_line, po::options_description& options,
           po::variables_map& values, const po::positional_options_description* positional,
           const po::options_description* hidden) {
  options.add_options()("help,h", "show this help");
  po::options_description all;
  all.add(options);
  if (hidden) all.add(*hidden);
  auto parser = po::command_line_parser(args).options(all);
  if (positional) parser.positional(*positional);
  const po::parsed_options parsed = parser.run();
  // A word that is no option's value and that no positional slot takes (a stray file name, a
  // value after a flag that takes none) would be dropped without a word.
  for (const auto& option : parsed.options)
    if (option.string_key.empty())
      throw ConfigError("unexpected argument '" +
                        (option.original_tokens.empty() ? std::string() : option.original_tokens[0]) +
                        "': options start with -- (see --help)");
  po::store(parsed, values);
  if (values.count("help")) {
    std::cout << "usage: " << usage_line << "\n\n" << options << "\n";
    return false;
  }
  po::notify(values);
  return true;
}

torch::Device command_device(const std::string& requested, Device trained, const std::string& run_dir,
                             const std::string& doing) {
  const Device where = requested.empty() ? trained : parse_enum<Device>(requested, "--device");
  if (const std::string why_not = where == Device::cuda ? cuda_unavailable_reason() : ""; !why_not.empty())
    throw ConfigError(requested.empty()
                          ? run_dir + " trained on cuda, but " + why_not + ": pass --device cpu to " + doing + " it here"
                          : "--device cuda, but " + why_not);
  return torch_device(where);
}

int bench(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: extrap bench train|attention|generate [options]   (--help on each)\n";
    return args.empty() ? 2 : 0;
  }
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "train") return bench_train(rest);
  if (args[0] == "attention") return bench_attention(rest);
  if (args[0] == "generate") return bench_generate(rest);
  std::cerr << "extrap bench: unknown benchmark '" << args[0] << "' (known: train, attention, generate)\n";
  return 2;
}

}  // namespace extrap::cli
