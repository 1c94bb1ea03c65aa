#include "core/runtime/distributed.h"

#include "core/base/environment.h"
#include "core/base/yaml_options.h"
#include "core/runtime/cuda_support.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Logging.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <thread>

namespace extrap {

namespace {

using std::chrono::milliseconds;

std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

int integer_variable(const char* name, const std::string& text, int low, int high) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (errno || end == text.c_str() || *end || value < low || value > high)
    throw ConfigError("environment variable " + std::string(name) + "=" + text +
                      ": expected an integer in [" + std::to_string(low) + ", " +
                      std::to_string(high) + "]");
  return int(value);
}

int required_integer(const char* name, const std::string& why, int low, int high) {
  const auto text = variable(name);
  if (!text) throw ConfigError("environment variable " + std::string(name) + " is not set; " + why);
  return integer_variable(name, *text, low, high);
}

milliseconds to_ms(double seconds) { return milliseconds(int64_t(seconds * 1000.0)); }

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return backend_error_text(c10_error->what_without_backtrace());
  return backend_error_text(e.what());
}

bool loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

}  // namespace

std::string backend_error_text(const std::string& text) {
  std::string out = one_line(text);
  // gloo's advice after its own message, which ends "GLHF!" and an emoji: not extrap's to repeat.
  if (const size_t advice = out.find(" This is typically caused by"); advice != std::string::npos) {
    out.resize(advice);
    if (!out.empty() && out.back() == '.') out.pop_back();
  }
  // Where in PyTorch's build tree the message was raised: "[/__w/pytorch/.../pair.cc:545] ".
  static const std::regex location(R"(\[[^\]\s]*\.(cc|cpp|cu|h|hpp):[0-9]+\] ?)");
  return std::regex_replace(out, location, "");
}

double distributed_timeout_seconds() {
  const auto timeout = variable("EXTRAP_DIST_TIMEOUT");
  if (!timeout) return 600;
  char* end = nullptr;
  const double seconds = std::strtod(timeout->c_str(), &end);
  if (end == timeout->c_str() || *end || !(seconds >= 1) || seconds > 86400 * 7)
    throw ConfigError("environment variable EXTRAP_DIST_TIMEOUT=" + *timeout +
                      ": expected seconds, at least 1");
  return seconds;
}

std::optional<LaunchEnvironment> launch_environment() {
  if (!environment_switch("EXTRAP_DISTRIBUTED", "ignore a launcher's variables", "join the launch a launcher's variables describe"))
    return std::nullopt;
  LaunchEnvironment env;
  env.timeout_seconds = distributed_timeout_seconds();
  const std::string why_master =
      "a data-parallel launch needs MASTER_ADDR and MASTER_PORT (the store's address)";
  if (const auto rank = variable("RANK")) {
    env.launcher = "torchrun";
    env.world_size = required_integer("WORLD_SIZE", "RANK is set (a torchrun launch)", 1, 1 << 20);
    env.rank = integer_variable("RANK", *rank, 0, env.world_size - 1);
    env.local_rank = variable("LOCAL_RANK")
                         ? required_integer("LOCAL_RANK", "", 0, 1 << 20)
                         : env.rank;
    env.local_world_size = variable("LOCAL_WORLD_SIZE")
                               ? required_integer("LOCAL_WORLD_SIZE", "", 1, 1 << 20)
                               : env.world_size;
  } else if (const auto procid = variable("SLURM_PROCID")) {
    const auto tasks = variable("SLURM_NTASKS");
    if (!tasks) return std::nullopt;
    env.launcher = "slurm";
    env.world_size = integer_variable("SLURM_NTASKS", *tasks, 1, 1 << 20);
    if (env.world_size == 1) return std::nullopt;  // one task: an ordinary process
    env.rank = integer_variable("SLURM_PROCID", *procid, 0, env.world_size - 1);
    env.local_rank = variable("SLURM_LOCALID")
                         ? required_integer("SLURM_LOCALID", "", 0, 1 << 20)
                         : 0;
    // "4" or "4(x2)": the tasks on this node when Slurm says so uniformly.
    if (const auto per_node = variable("SLURM_TASKS_PER_NODE"))
      env.local_world_size = std::max(1, std::atoi(per_node->c_str()));
  } else {
    return std::nullopt;
  }
  const auto addr = variable("MASTER_ADDR");
  if (!addr)
    throw ConfigError("environment variable MASTER_ADDR is not set; " + why_master +
                      (env.launcher == "slurm" ? " (export them in the job script: docs/distributed.md, Slurm)" : ""));
  env.master_addr = *addr;
  env.master_port = required_integer("MASTER_PORT", why_master, 1, 65535);
  env.agent_store = env.launcher == "torchrun" &&
                    variable("TORCHELASTIC_USE_AGENT_STORE") == std::string("True");
  env.key_prefix = "extrap/";
  if (const auto attempt = variable("TORCHELASTIC_RESTART_COUNT"))
    env.key_prefix += "attempt_" + *attempt + "/";
  return env;
}

// --- the group ------------------------------------------------------------------------------

struct ProcessGroup::State {
  c10::intrusive_ptr<c10d::Store> store;  // this attempt's keys (PrefixStore)
  c10::intrusive_ptr<c10d::Backend> backend;
  std::thread heartbeat;
  std::atomic<bool> stop{false};
};

namespace {

NcclBackendFactory nccl_factory = nullptr;

c10::intrusive_ptr<c10d::TCPStore> connect_store(const LaunchEnvironment& env, bool server,
                                                  milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = uint16_t(env.master_port);
  options.isServer = server;
  if (server) options.numWorkers = size_t(env.world_size);
  options.waitWorkers = false;
  options.timeout = timeout;
  options.multiTenant = true;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnvironment& env) {
  if (const auto interface = variable("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  if (loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

std::mutex group_mutex;
ProcessGroup* the_group = nullptr;  // created once, never destroyed before exit
std::string the_command_line;       // YAML {command, arguments}; "" until set_command_line

}  // namespace

const std::optional<LaunchEnvironment>& ProcessGroup::environment() {
  static const std::optional<LaunchEnvironment> env = launch_environment();
  return env;
}

void ProcessGroup::set_command_line(const std::string& command, const std::vector<std::string>& args) {
  YAML::Node node(YAML::NodeType::Map);
  node["command"] = command;
  node["arguments"] = YAML::Node(YAML::NodeType::Sequence);
  for (const auto& a : args) node["arguments"].push_back(a);
  std::lock_guard<std::mutex> lock(group_mutex);
  the_command_line = YAML::Dump(node);
}

ProcessGroup* ProcessGroup::existing() {
  std::lock_guard<std::mutex> lock(group_mutex);
  return the_group;
}

bool ProcessGroup::leader() {
  const auto& env = environment();
  return !env || env->rank == 0;
}

ProcessGroup* ProcessGroup::get(torch::Device device) {
  const auto& env = environment();
  if (!env) return nullptr;
  std::lock_guard<std::mutex> lock(group_mutex);
  if (the_group) {
    if (the_group->device_.type() != device.type())
      throw ConfigError("this data-parallel process group was made for " +
                        c10::DeviceTypeName(the_group->device_.type(), true) + "; a later step asks for " +
                        c10::DeviceTypeName(device.type(), true) +
                        ": run every point of a data-parallel job on one kind of device");
    return the_group;
  }
  the_group = new ProcessGroup(*env, device);
  if (!the_command_line.empty()) the_group->check_same("command line", the_command_line);
  return the_group;
}

ProcessGroup::ProcessGroup(const LaunchEnvironment& env, torch::Device device)
    : env_(env), device_(device), state_(std::make_shared<State>()) {
  // c10d logs every failed socket operation with a C++ backtrace; extrap says what went wrong
  // in one line of its own instead. TORCH_CPP_LOG_LEVEL, when set, is respected.
  if (!variable("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 3;  // fatal only
  const milliseconds timeout = to_ms(env.timeout_seconds);
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  try {
    tcp = connect_store(env, !env.agent_store && env.rank == 0, timeout);
  } catch (const std::exception& e) {
    throw DistributedError("rank " + std::to_string(env.rank) + " cannot " +
                           (!env.agent_store && env.rank == 0 ? "serve" : "reach") +
                           " the store at " + where + ": " + error_text(e));
  }
  state_->store = c10::make_intrusive<c10d::PrefixStore>(env.key_prefix, tcp);
  auto backend_store = c10::make_intrusive<c10d::PrefixStore>(env.key_prefix + "backend/", tcp);
  try {
    if (device.is_cuda()) {
      if (!nccl_factory) {
        const std::string why_not = cuda_unavailable_reason();
        throw ConfigError("train.device is cuda in a data-parallel launch, but NCCL is not loaded: " +
                          (why_not.empty() ? "this build's CUDA half has no NCCL (nccl.h was not found)"
                                           : why_not));
      }
      // Slurm's --gpus-per-task may show each rank only its own device.
      const int devices = std::max<int>(1, int(torch::cuda::device_count()));
      device_ = torch::Device(torch::kCUDA, c10::DeviceIndex(env.local_rank % devices));
      state_->backend = nccl_factory(backend_store, env.rank, env.world_size, timeout);
    } else {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      options->devices.push_back(gloo_device(env));
      state_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(backend_store, env.rank,
                                                                     env.world_size, options);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError("rank " + std::to_string(env.rank) + " of " +
                           std::to_string(env.world_size) + " could not form the process group through " +
                           where + " within " + std::to_string(int64_t(env.timeout_seconds)) +
                           " s (EXTRAP_DIST_TIMEOUT): " + error_text(e));
  }
  // The heartbeat: its own connection, so that a collective in progress never delays it.
  auto beat_store = c10::make_intrusive<c10d::PrefixStore>(
      env.key_prefix, connect_store(env, false, milliseconds(5000)));
  const std::string key = "beat/" + std::to_string(env.rank);
  state_->heartbeat = std::thread([state = state_, beat_store, key] {
    while (!state->stop) {
      try {
        beat_store->add(key, 1);
      } catch (...) {
        return;  // the store is gone: the collectives will say so
      }
      for (int i = 0; i < 10 && !state->stop; ++i) std::this_thread::sleep_for(milliseconds(100));
    }
  });
}

void ProcessGroup::stop_heartbeat() noexcept {
  std::lock_guard<std::mutex> lock(group_mutex);
  if (!the_group) return;
  auto& state = *the_group->state_;
  state.stop = true;
  if (state.heartbeat.joinable()) state.heartbeat.join();  // within 0.1 s, or a 5 s store timeout
}

ProcessGroup::~ProcessGroup() { stop_heartbeat(); }

std::string ProcessGroup::diagnose() {
  try {
    auto probe = c10::make_intrusive<c10d::PrefixStore>(env_.key_prefix,
                                                        connect_store(env_, false, milliseconds(2000)));
    const auto failure = [&]() -> std::string {
      for (int r = 0; r < size(); ++r) {
        const std::string key = "failed/" + std::to_string(r);
        if (r != rank() && probe->check({key})) {
          const auto bytes = probe->get(key);
          return "rank " + std::to_string(r) + " stopped: " + std::string(bytes.begin(), bytes.end());
        }
      }
      return "";
    };
    if (auto text = failure(); !text.empty()) return text;
    std::vector<int64_t> before(size_t(size()), 0);
    for (int r = 0; r < size(); ++r) before[size_t(r)] = probe->add("beat/" + std::to_string(r), 0);
    std::this_thread::sleep_for(milliseconds(3000));
    if (auto text = failure(); !text.empty()) return text;
    std::string stale;
    for (int r = 0; r < size(); ++r)
      if (r != rank() && probe->add("beat/" + std::to_string(r), 0) == before[size_t(r)])
        stale += (stale.empty() ? "" : ", ") + std::to_string(r);
    if (!stale.empty())
      return "rank " + stale + " stopped responding (no heartbeat for 3 s: killed, stopped, or its "
             "machine is gone)";
    return "";
  } catch (const std::exception&) {
    return "the store at " + env_.master_addr + ":" + std::to_string(env_.master_port) +
           " no longer answers" + (env_.agent_store ? " (torchrun's agent is gone)" : " (rank 0 serves it: rank 0 is gone)");
  }
}

void ProcessGroup::fail(const std::string& what, const std::string& error) {
  const std::string cause = diagnose();
  throw DistributedError("rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ": " +
                         (cause.empty() ? "a peer failed" : cause) + " during " + what +
                         "; exiting (" + error + ")");
}

void ProcessGroup::each_tensor(std::vector<torch::Tensor>& tensors, const std::string& what,
                               bool reduce) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  // NCCL takes device tensors only: a CPU tensor (a step's loss, the failure flags, an
  // evaluation's sums) goes through this rank's GPU and back.
  std::vector<torch::Tensor> staged;
  staged.reserve(tensors.size());
  try {
    for (auto& t : tensors) {
      staged.push_back(device_.is_cuda() && !t.is_cuda() ? t.to(device_) : t);
      std::vector<at::Tensor> one{staged.back()};
      works.push_back(reduce ? state_->backend->allreduce(one) : state_->backend->broadcast(one));
    }
    for (auto& w : works) w->wait();
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!staged[i].is_same(tensors[i])) tensors[i].copy_(staged[i]);
  } catch (const std::exception& e) {
    fail(what, error_text(e));
  }
}

void ProcessGroup::all_reduce_sum(std::vector<torch::Tensor>& tensors, const std::string& what) {
  each_tensor(tensors, what, true);
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, const std::string& what) {
  each_tensor(tensors, what, false);
}

void ProcessGroup::barrier(const std::string& what) {
  try {
    state_->backend->barrier()->wait();
  } catch (const std::exception& e) {
    fail(what, error_text(e));
  }
}

void ProcessGroup::check_same(const std::string& what, const std::string& yaml) {
  const std::string base = "check/" + std::to_string(sequence_++) + "/";
  std::vector<std::string> texts(static_cast<size_t>(size()));
  try {
    state_->store->set(base + std::to_string(rank()), std::vector<uint8_t>(yaml.begin(), yaml.end()));
    for (int r = 0; r < size(); ++r) {
      if (r == rank() || (rank() != 0 && r != 0)) continue;
      const auto bytes = state_->store->get(base + std::to_string(r));
      texts[size_t(r)].assign(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    fail("the comparison of " + what, error_text(e));
  }
  texts[size_t(rank())] = yaml;
  const YAML::Node first = YAML::Load(texts[0]);
  for (int r = 1; r < size(); ++r) {
    if (texts[size_t(r)].empty() || texts[size_t(r)] == texts[0]) continue;
    const auto d = first_difference(first, YAML::Load(texts[size_t(r)]));
    throw DistributedError("rank " + std::to_string(r) + " was started with another " + what +
                      " than rank 0" +
                      (d ? ": first difference at '" + d->key + "': " + d->first + " on rank 0, " +
                               d->second + " on rank " + std::to_string(r)
                         : "") +
                      "; start every rank with the same command, config and data");
  }
}

std::string ProcessGroup::all_reduce_agreeing(std::vector<torch::Tensor>& tensors,
                                              const std::string& mine, const std::string& what) {
  auto failed = torch::zeros({size()}, torch::kFloat64);
  if (!mine.empty()) failed[rank()] = 1.0;
  tensors.push_back(failed);
  all_reduce_sum(tensors, what);
  tensors.pop_back();
  const auto nonzero = failed.nonzero();
  if (nonzero.numel() == 0) return "";
  const int64_t first = nonzero[0][0].item<int64_t>();
  const std::string name = "failure/" + std::to_string(sequence_++);
  try {
    if (first == rank()) {
      state_->store->set(name, std::vector<uint8_t>(mine.begin(), mine.end()));
      return mine;
    }
    const auto bytes = state_->store->get(name);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    fail("sharing rank " + std::to_string(first) + "'s error", error_text(e));
  }
}

std::string ProcessGroup::share(const std::string& key, const std::string& value) {
  const std::string name = "share/" + std::to_string(sequence_++) + "/" + key;
  try {
    if (rank() == 0) {
      state_->store->set(name, std::vector<uint8_t>(value.begin(), value.end()));
      return value;
    }
    const auto bytes = state_->store->get(name);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    fail("sharing " + key, error_text(e));
  }
}

void ProcessGroup::publish_failure(const std::string& message) noexcept {
  try {
    state_->store->set("failed/" + std::to_string(rank()),
                       std::vector<uint8_t>(message.begin(), message.end()));
  } catch (...) {
  }
}

void ProcessGroup::publish_failure_if_any(const std::string& message) noexcept {
  std::lock_guard<std::mutex> lock(group_mutex);
  if (the_group) the_group->publish_failure(message);
}

std::string failure_message(const std::exception& error) { return error_text(error); }

void all_reduce_gradients(ProcessGroup& group, const std::vector<torch::Tensor>& parameters,
                          const std::string& what, int64_t bucket_bytes) {
  if (group.size() == 1) return;
  // Buckets of consecutive gradients of one dtype, each flattened into one tensor.
  std::vector<std::vector<torch::Tensor>> buckets;
  int64_t bytes = 0;
  for (const auto& p : parameters) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    const int64_t size = g.numel() * int64_t(g.element_size());
    if (buckets.empty() || bytes + size > bucket_bytes ||
        buckets.back().front().scalar_type() != g.scalar_type()) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(g);
    bytes += size;
  }
  std::vector<torch::Tensor> flat;
  flat.reserve(buckets.size());
  for (const auto& bucket : buckets) {
    std::vector<torch::Tensor> pieces;
    for (const auto& g : bucket) pieces.push_back(g.reshape({-1}));
    flat.push_back(torch::cat(pieces));
  }
  group.all_reduce_sum(flat, what);
  for (size_t b = 0; b < buckets.size(); ++b) {
    int64_t offset = 0;
    for (auto& g : buckets[b]) {
      g.copy_(flat[b].narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
}

void broadcast_parameters(ProcessGroup& group, torch::nn::Module& module) {
  if (group.size() == 1) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors;
  for (const auto& p : module.parameters()) tensors.push_back(p);
  for (const auto& b : module.buffers()) tensors.push_back(b);
  group.broadcast(tensors, "the broadcast of rank 0's parameters");
}

void register_nccl_backend(NcclBackendFactory factory) { nccl_factory = factory; }

}  // namespace extrap
