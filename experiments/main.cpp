// extrap: the command-line front end. `extrap COMMAND [args]`; `extrap COMMAND --help`.
#include "core/sysinfo.h"
#include "core/yaml_options.h"
#include "experiments/commands.h"

#include <boost/program_options/errors.hpp>

#include <c10/util/Exception.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>

namespace {

struct Command {
  std::string summary;
  std::function<int(const extrap::cli::Args&)> run;
};

const std::map<std::string, Command>& commands() {
  using namespace extrap::cli;
  static const std::map<std::string, Command> table = {
      {"train", {"train a model from a YAML config", train}},
      {"eval", {"evaluate a trained run at any length (non-overlapping or sliding window)", eval}},
      {"generate", {"continue a prompt with a trained causal model (KV cache)", generate}},
      {"task", {"print a retrieval-task instance (passkey, multikey) as the model sees it", task}},
      {"export", {"write a trained model as safetensors for Python (analysis/extrap_model.py)", export_model}},
      {"positions", {"list the registered position methods, their options and hooks", positions}},
      {"inspect", {"print ALiBi slopes or any method's attention-score bias", inspect}},
      {"keys", {"list every config key with its default and meaning", config_keys}},
      {"bench", {"benchmarks: `bench train`, `bench attention`, `bench generate`", bench}},
      {"sweep", {"train and evaluate a grid of configs, results to HDF5 (resumable)", sweep}},
      {"merge", {"merge the results files of a sharded sweep", merge}},
      {"report", {"write a Markdown report with plots from a sweep's results", report}},
  };
  return table;
}

void usage(std::ostream& out) {
  out << "usage: extrap COMMAND [options]   (extrap COMMAND --help for its options)\n"
         "       extrap --version             (versions, CUDA, BLAS and threads in use)\n\ncommands:\n";
  for (const auto& [name, command] : commands())
    out << "  " << name << std::string(12 - name.size(), ' ') << command.summary << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(std::cout);
    return 0;
  }
  if (name == "--version" || name == "version") {
    std::cout << extrap::describe_runtime(extrap::runtime_info());
    return 0;
  }
  const auto found = commands().find(name);
  if (found == commands().end()) {
    std::cerr << "extrap: unknown command '" << name << "'\n\n";
    usage(std::cerr);
    return 2;
  }
  extrap::cli::Args args(argv + 2, argv + argc);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk,
  // instead of killing the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return found->second.run(args);
  } catch (const boost::program_options::error& e) {
    std::cerr << "extrap " << name << ": " << e.what() << " (see extrap " << name << " --help)\n";
    return 2;
  } catch (const extrap::ConfigError& e) {
    std::cerr << "extrap " << name << ": " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    // LibTorch's own message, without the C++ backtrace it carries.
    std::cerr << "extrap " << name << ": error: " << extrap::one_line(e.what_without_backtrace()) << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "extrap " << name << ": error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "extrap " << name << ": error: " << e.what() << "\n";
    return 1;
  }
}
