// extrap: the command-line front end. `extrap COMMAND [args]`; `extrap COMMAND --help`.
#include "core/attention/cuda_attention.h"
#include "core/base/allocator.h"
#include "core/base/environment.h"
#include "core/base/yaml_options.h"
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/cpu_linear.h"
#include "core/kernels/fused_adamw.h"
#include "core/kernels/gelu_linear.h"
#include "core/kernels/glu_linear.h"
#include "core/kernels/rotate_pairs.h"
#include "core/kernels/residual_norm.h"
#include "core/runtime/block_cache.h"
#include "core/runtime/cuda_support.h"
#include "core/runtime/distributed.h"
#include "core/runtime/sysinfo.h"
#include "experiments/cli/commands.h"

#include <boost/program_options/errors.hpp>

#include <c10/util/Exception.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <set>

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
      {"tokenizer", {"train a SentencePiece tokenizer on a corpus (`tokenizer train`), or show a text's pieces", tokenizer}},
      {"task", {"print a retrieval-task instance (passkey, multikey, variable_tracking) as the model sees it", task}},
      {"export", {"write a trained model as safetensors for Python (analysis/extrap_model.py)", export_model}},
      {"import", {"a Hugging Face checkpoint folder (BLOOM, MPT, Falcon-RW, GPT-NeoX, GPT-2, Llama, Mistral, Qwen2) as a run", import_model}},
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

// Removes `--nproc N` (or --nproc=N) from the arguments of the commands that can run as
// data-parallel ranks and returns N (0: not given).
int take_nproc(const std::string& command, extrap::cli::Args& args) {
  static const std::set<std::string> parallel = {"train", "eval", "sweep", "bench"};
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    size_t erase = 0;
    if (args[i] == "--nproc" && i + 1 < args.size()) {
      value = args[i + 1];
      erase = 2;
    } else if (args[i].rfind("--nproc=", 0) == 0) {
      value = args[i].substr(8);
      erase = 1;
    } else if (args[i] == "--nproc") {
      throw extrap::ConfigError("--nproc needs a number of ranks");
    } else {
      continue;
    }
    if (!parallel.count(command) || (command == "bench" && args[0] != "train"))
      throw extrap::ConfigError("--nproc: `extrap " + command + "` does not run data-parallel " +
                                "(train, eval, sweep and bench train do)");
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (end == value.c_str() || *end || n < 1)
      throw extrap::ConfigError("--nproc " + value + ": expected a number of ranks, at least 1");
    args.erase(args.begin() + long(i), args.begin() + long(i + erase));
    return int(n);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  const std::string name = argv[1];
  try {
    extrap::tune_allocator();  // before the first tensor: training reuses the heap's pages
    // An evaluation's large blocks come back layer after layer: kept by size, not in the heap
    // (EXTRAP_BLOCK_CACHE=0 leaves them to LibTorch's allocator, for A/B runs).
    if (name == "eval" && extrap::environment_switch("EXTRAP_BLOCK_CACHE", "LibTorch's CPU allocator for every block",
                                                     "extrap's block cache for an evaluation's large blocks, the default"))
      extrap::install_block_cache();
    // Before anything asks LibTorch about CUDA: it decides once per process.
    extrap::load_cuda_support();
    // The on/off switches, so that a bad value is this command's error, not a failed step.
    extrap::onednn_linear_switched_on();
    extrap::fused_adamw_switched_on();
    extrap::fused_gelu_switched_on();
    extrap::fused_glu_switched_on();
    extrap::fused_rotation_switched_on();
    extrap::fused_layer_norm_switched_on();
    extrap::bf16_gemm::available();
    extrap::gpu_new_routes_on();
  } catch (const extrap::ConfigError& e) {
    std::cerr << "extrap: " << e.what() << "\n";
    return 2;
  }
  if (name == "--help" || name == "-h" || name == "help") {
    usage(std::cout);
    return 0;
  }
  if (name == "--version" || name == "version") {
    std::cout << extrap::describe_runtime(extrap::runtime_info());
    if (extrap::load_cuda_support().state == extrap::CudaSupport::State::loaded)
      std::cout << "fused cuda attention: "
                << (extrap::cuda_attention() ? "registered" : "missing (libextrap_cuda.so did not register it)")
                << "\n";
    if (const auto* cuda = extrap::cuda_attention())
      std::cout << "cudnn attention: "
                << (cuda->cudnn_description ? cuda->cudnn_description()
                                            : "not built (no cuDNN frontend headers: scripts/cudnn_frontend.sh)")
                << "\n";
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
  std::string label = "extrap " + name;
  // The message of an error, and the exit code: 2 for a refused config, 1 otherwise.
  std::string message;
  int code = 0;
  try {
    if (const int nproc = take_nproc(name, args); nproc > 0)
      return extrap::cli::launch_local_ranks(nproc, name, args);
    if (const auto& env = extrap::ProcessGroup::environment()) {
      label += " (rank " + std::to_string(env->rank) + ")";
      // Only rank 0 prints results; every rank still reports its errors on stderr.
      if (env->rank != 0 && !std::freopen("/dev/null", "w", stdout))
        throw std::runtime_error("cannot redirect rank " + std::to_string(env->rank) + "'s stdout");
      extrap::ProcessGroup::set_command_line(name, args);
    }
    code = found->second.run(args);
    // Rank 0 serves the store: no rank leaves while another may still use it.
    if (auto* group = extrap::ProcessGroup::existing()) group->barrier("the end of the command");
    extrap::ProcessGroup::stop_heartbeat();
    return code;
  } catch (const boost::program_options::error& e) {
    message = std::string(e.what()) + " (see extrap " + name + " --help)";
    code = 2;
  } catch (const extrap::ConfigError& e) {
    message = e.what();
    code = 2;
  } catch (const c10::Error& e) {
    // LibTorch's own message, without the C++ backtrace it carries.
    message = "error: " + extrap::one_line(e.what_without_backtrace());
    code = 1;
  } catch (const std::bad_alloc&) {
    message = "error: out of memory";
    code = 1;
  } catch (const std::exception& e) {
    message = std::string("error: ") + e.what();
    code = 1;
  }
  std::cerr << label << ": " << message << "\n";
  extrap::ProcessGroup::publish_failure_if_any(message);
  extrap::ProcessGroup::stop_heartbeat();
  return code;
}
