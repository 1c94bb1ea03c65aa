// Data-parallel runs on PyTorch's distributed engine (c10d): one process per rank, a TCPStore
// for rendezvous and checks, ProcessGroupGloo on CPUs and ProcessGroupNCCL on GPUs (from
// libextrap_cuda.so, where the build has it: core/runtime/cuda_support.h).
//
// A process is a rank when its launcher says so:
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Under torchrun's agent
//              (TORCHELASTIC_USE_AGENT_STORE=True) the agent already serves the store at
//              MASTER_ADDR:MASTER_PORT and every rank connects as a client, as PyTorch does;
//              keys are kept apart per restart (TORCHELASTIC_RESTART_COUNT).
//   Slurm      SLURM_PROCID, SLURM_NTASKS (> 1), SLURM_LOCALID, with MASTER_ADDR and
//              MASTER_PORT exported by the job script (docs/distributed.md, Slurm).
//   --nproc N  `extrap train|eval|sweep|bench train --nproc N` starts N local ranks with the
//              torchrun variables (experiments/cli/launch.cpp).
// Otherwise (or with EXTRAP_DISTRIBUTED=0) nothing changes: no store, no process group.
//
// Every rank runs the same command and makes the same calls in the same order; only rank 0
// writes files and prints. Collectives that fail (a rank died, hung past the timeout, or
// stopped on an error) throw DistributedError with a line naming the rank: each rank beats a
// heartbeat counter in the store every second and publishes the error it stops on, so the
// others can tell which rank went and why. EXTRAP_DIST_TIMEOUT (seconds, default 600) bounds
// every collective and every wait on the store.
#pragma once

#include "core/base/errors.h"

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace extrap {

struct LaunchEnvironment {
  std::string launcher;  // "torchrun", "slurm"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks on this machine (threads default to cores / this)
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false;  // torchrun's agent serves the store: connect as a client
  std::string key_prefix;    // this attempt's store keys
  double timeout_seconds = 600;
};

// EXTRAP_DIST_TIMEOUT in seconds (default 600); a value that is not at least 1 is a ConfigError.
double distributed_timeout_seconds();

// The launcher's environment, or nullopt when this process is not a rank. Inconsistent or
// incomplete variables (RANK without WORLD_SIZE, a rank outside the world, Slurm tasks
// without MASTER_ADDR) are a ConfigError naming the variable.
std::optional<LaunchEnvironment> launch_environment();

// A peer rank died, hung past the timeout or stopped on an error, or the ranks were started
// differently: the job cannot go on (never recorded as one point's failure).
struct DistributedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ProcessGroup {
 public:
  // The process group of this process, created on first use for `device` (gloo for the CPU,
  // NCCL for CUDA); nullptr when the process is not a rank. Later calls with another device
  // kind are refused.
  static ProcessGroup* get(torch::Device device);
  // The group when one was made (nullptr otherwise).
  static ProcessGroup* existing();
  // This process's launch environment, read once (nullopt: not a rank).
  static const std::optional<LaunchEnvironment>& environment();
  // Whether this process may write files and print results: not a rank, or rank 0.
  static bool leader();
  // The command this process runs (`extrap COMMAND ARGS...`), set by main before the command
  // starts: the first thing a new group does is compare it across the ranks (check_same), so
  // that ranks started with different commands or flags are refused in one line rather than
  // failing in a collective that does not match.
  static void set_command_line(const std::string& command, const std::vector<std::string>& args);

  int rank() const { return env_.rank; }
  int size() const { return env_.world_size; }
  const LaunchEnvironment& env() const { return env_; }
  // The device this rank computes on: the CPU, or cuda:LOCAL_RANK.
  torch::Device device() const { return device_; }

  // In place; every rank passes tensors of the same shapes and types. `what` names the
  // collective in errors ("the gradient all-reduce at step 12").
  void all_reduce_sum(std::vector<torch::Tensor>& tensors, const std::string& what);
  void broadcast(std::vector<torch::Tensor>& tensors, const std::string& what);
  void barrier(const std::string& what);

  // Refuses (DistributedError) a rank whose `yaml` (a config, a corpus identity) differs from rank
  // 0's, naming the first differing key and the rank; `what` says what was compared.
  void check_same(const std::string& what, const std::string& yaml);
  // all_reduce_sum of `tensors` that also agrees on failure: `mine` is this rank's error ("" if
  // none). Returns, on every rank, the lowest failed rank's message ("" when none failed), so a
  // step that failed on some ranks only fails on all of them alike, with one message, instead of
  // leaving the others waiting in the next collective.
  std::string all_reduce_agreeing(std::vector<torch::Tensor>& tensors, const std::string& mine,
                                  const std::string& what);
  // Rank 0's `value` on every rank (through the store).
  std::string share(const std::string& key, const std::string& value);

  // Records this rank's fatal error for the others (best effort, never throws).
  void publish_failure(const std::string& message) noexcept;
  // Publishes `message` when this process is a rank whose group exists.
  static void publish_failure_if_any(const std::string& message) noexcept;

  // Stops this rank's heartbeat (at the end of the command, before the process exits).
  static void stop_heartbeat() noexcept;

  ~ProcessGroup();

 private:
  struct State;
  ProcessGroup(const LaunchEnvironment& env, torch::Device device);
  [[noreturn]] void fail(const std::string& what, const std::string& error);
  // One all-reduce (reduce) or broadcast from rank 0 per tensor, then waits for all.
  void each_tensor(std::vector<torch::Tensor>& tensors, const std::string& what, bool reduce);
  std::string diagnose();

  LaunchEnvironment env_;
  torch::Device device_;
  std::shared_ptr<State> state_;  // shared with the heartbeat thread
  int64_t sequence_ = 0;  // numbers check_same / share keys: every rank calls them in order
};

// The NCCL backend is built into libextrap_cuda.so (core/runtime/nccl_backend.cpp), which
// registers its factory here when it loads; a CUDA launch without it is refused.
using NcclBackendFactory = c10::intrusive_ptr<c10d::Backend> (*)(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout);
void register_nccl_backend(NcclBackendFactory factory);

// The one-line message of an error (LibTorch's without its backtrace).
std::string failure_message(const std::exception& error);
// A c10d or gloo error as extrap's lines quote it: one line, without the build-tree location
// PyTorch prefixes ("[/__w/pytorch/.../pair.cc:545] ") and gloo's advice after its message
// ("This is typically caused by ... GLHF!").
std::string backend_error_text(const std::string& text);

// Runs `work`. In one process its errors propagate; with ranks (`group` set) an error other
// than a DistributedError is caught and its message returned, for all_reduce_agreeing to agree on
// ("" when `work` succeeded).
template <class Work>
std::string run_or_capture(ProcessGroup* group, Work&& work) {
  try {
    work();
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {
    if (!group) throw;
    return failure_message(error);
  }
  return "";
}

// Sums the gradients of `parameters` over the ranks in buckets of about `bucket_bytes`
// (coalesced into one flat tensor each: a few large all-reduces instead of one a parameter).
// Parameters without a gradient are skipped (on every rank alike).
void all_reduce_gradients(ProcessGroup& group, const std::vector<torch::Tensor>& parameters,
                          const std::string& what, int64_t bucket_bytes = 16 << 20);

// Copies rank 0's parameters and buffers to every rank.
void broadcast_parameters(ProcessGroup& group, torch::nn::Module& module);

}  // namespace extrap
