// Data-parallel training and evaluation on c10d (core/runtime/distributed.h): gloo on 127.0.0.1, small
// models, ranks started by `extrap --nproc`, by hand with torchrun's variables, and by torchrun.
#include "core/results/results_store.h"
#include "core/runtime/distributed.h"
#include "experiments/sweep/sweep.h"
#include "tests/support/cli_harness.h"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

using namespace extrap;
using namespace extrap::testing;

namespace {

// A small training config in `d`: 16 sequences of 16 bytes a step (so 2 ranks take 8 each).
void write_train_config(const TempDir& d, const std::string& objective = "causal_lm") {
  write_text(d.root / "train.yaml", R"(data: {path: corpus, tokenizer: byte, cache_dir: cache}
model: {layers: 2, d_model: 32, heads: 4, d_ffn: 64, dropout: 0.0, objective: )" + objective + R"(}
position: )" + (objective == "causal_lm" ? "alibi" : "alibi_symmetric") + R"(
train: {seq_len: 16, batch_tokens: 256, steps: 24, lr: 0.003, warmup: 4, validate_every: 12,
        validate_tokens: 512, checkpoint_every: 4, log_every: 1, threads: 1}
eval: {lengths: [16, 32], max_tokens: 1024}
)");
}

std::vector<std::string> train_args(const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"train", "--config", "train.yaml", "--set", "train.out_dir=" + out,
                                   "--no-eval"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// Losses at every logged step and the final parameters of two runs agree to `tolerance`.
void require_same_run(const TempDir& d, const std::string& a, const std::string& b, double tolerance) {
  const VerifiedCheckpoint ca = require_checkpoint(d.root / a);
  const VerifiedCheckpoint cb = require_checkpoint(d.root / b);
  REQUIRE(ca.state.step == cb.state.step);
  REQUIRE(ca.state.train_curve.size() == cb.state.train_curve.size());
  REQUIRE(ca.state.train_curve.size() == size_t(ca.state.step));
  for (size_t i = 0; i < ca.state.train_curve.size(); ++i) {
    INFO("step " << ca.state.train_curve[i].step);
    CHECK(relative(ca.state.train_curve[i].loss, cb.state.train_curve[i].loss) < tolerance);
  }
  REQUIRE(ca.state.valid_curve.size() == cb.state.valid_curve.size());
  for (size_t i = 0; i < ca.state.valid_curve.size(); ++i)
    CHECK(relative(ca.state.valid_curve[i].loss, cb.state.valid_curve[i].loss) < tolerance);
  const CliRun ra = load_cli_run(d, a);
  const CliRun rb = load_cli_run(d, b);
  const auto pa = ra.run.model->named_parameters(), pb = rb.run.model->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (const auto& item : pa) {
    auto x = item.value();
    auto y = pb[item.key()];
    INFO(item.key());
    // The key projection's bias has no gradient in exact arithmetic (softmax ignores a shift of
    // every score of a query), only rounding noise, which AdamW scales up to lr-sized steps of
    // either sign: it differs between any two summation orders and is checked through its
    // (nil) effect on the losses and the evaluation instead.
    if (item.key().find("attention.qkv.bias") != std::string::npos) {
      const int64_t d = x.size(0) / 3;
      x = torch::cat({x.narrow(0, 0, d), x.narrow(0, 2 * d, d)});
      y = torch::cat({y.narrow(0, 0, d), y.narrow(0, 2 * d, d)});
    }
    const double difference = (x - y).abs().max().item<double>();
    const double scale = std::max(1.0, y.abs().max().item<double>());
    CHECK(difference <= tolerance * scale);
  }
}

// Starts rank `rank` of `world` by hand, as torchrun would, on `port`.
pid_t spawn_rank(const TempDir& d, int rank, int world, int port, const std::vector<std::string>& args,
                 std::vector<std::string> env = {}) {
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(world));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  return spawn(d.root, args, d.root / ("rank" + std::to_string(rank) + ".log"), 0, env);
}

// A TCP port on 127.0.0.1 that nothing listens on now, from the kernel (bind to port 0), within
// [lo, hi] (tries again until one is): ports made from the process id collided, now and then,
// with those of the distributed tests that ctest runs beside this one.
int free_port(int lo = 1024, int hi = 65535) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t size = sizeof(address);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                       ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0;
    ::close(fd);
    const int port = bound ? int(ntohs(address.sin_port)) : 0;
    if (port >= lo && port <= hi) return port;
  }
  FAIL("no free TCP port in " << lo << " .. " << hi);
  return 0;
}
int test_port() { return free_port(); }

}  // namespace

// What gloo and c10d raise, as extrap's rank-failure lines quote it (seen when a peer is killed).
TEST_CASE("distributed: a backend's error is quoted without its build path and gloo's advice", "[distributed]") {
  CHECK(backend_error_text("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                           "[127.0.0.1]:40350: Connection reset by peer. This is typically caused by a remote "
                           "worker hanging or bugs in the application. Check the logs of the remote worker "
                           "before reporting an error. GLHF! \xf0\x9f\x8f\x96\xef\xb8\x8f") ==
        "Read error [127.0.0.1]:40350: Connection reset by peer");
  CHECK(backend_error_text("Connection closed by peer [10.0.0.2]:1234\nnext line") ==
        "Connection closed by peer [10.0.0.2]:1234 next line");
  CHECK(backend_error_text("timed out after 30 s.") == "timed out after 30 s.");
}

TEST_CASE("distributed: the launcher's environment is read or refused by name", "[distributed]") {
  struct Variables {
    static void clear() {
      for (const char* n : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                            "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                            "EXTRAP_DISTRIBUTED", "EXTRAP_DIST_TIMEOUT", "TORCHELASTIC_USE_AGENT_STORE",
                            "TORCHELASTIC_RESTART_COUNT", "SLURM_TASKS_PER_NODE"})
        ::unsetenv(n);
    }
    explicit Variables(std::vector<std::pair<std::string, std::string>> values) {
      clear();
      for (const auto& [k, v] : values) ::setenv(k.c_str(), v.c_str(), 1);
    }
    ~Variables() { clear(); }
  };
  {
    Variables v({});
    CHECK(!launch_environment());
  }
  {
    Variables v({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
    const auto env = launch_environment();
    REQUIRE(env);
    CHECK(env->launcher == "torchrun");
    CHECK(env->rank == 1);
    CHECK(env->world_size == 4);
    CHECK(env->local_world_size == 2);
    CHECK(env->agent_store);
    CHECK(env->key_prefix == "extrap/attempt_2/");
  }
  {
    Variables v({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                 {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "1234"}});
    const auto env = launch_environment();
    REQUIRE(env);
    CHECK(env->launcher == "slurm");
    CHECK(env->rank == 3);
    CHECK(env->local_rank == 1);
    CHECK(env->local_world_size == 4);
  }
  {
    Variables v({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
    CHECK(!launch_environment());  // one task: an ordinary process
  }
  {
    Variables v({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"},
                 {"EXTRAP_DISTRIBUTED", "0"}});
    CHECK(!launch_environment());
  }
  const auto refused = [](std::vector<std::pair<std::string, std::string>> values,
                          const std::string& named) {
    Variables v(std::move(values));
    CHECK_THROWS_WITH(launch_environment(), Catch::Contains(named));
  };
  refused({{"RANK", "0"}}, "WORLD_SIZE");
  // EXTRAP_DISTRIBUTED is 0 or 1: "false" must not silently join the launch.
  refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"EXTRAP_DISTRIBUTED", "false"}}, "EXTRAP_DISTRIBUTED=false");
  refused({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}}, "RANK=2");
  refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, "MASTER_ADDR");
  refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "99999"}},
          "MASTER_PORT=99999");
  refused({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "MASTER_ADDR");
  refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"},
           {"EXTRAP_DIST_TIMEOUT", "soon"}},
          "EXTRAP_DIST_TIMEOUT=soon");
}

// Under NAG without clipping the update is the gradient's scale (AdamW would hide a factor
// on it): a sum over ranks where the mean belongs steps twice as far.
TEST_CASE("distributed: 2 ranks take 1 process's NAG steps, unclipped", "[distributed]") {
  SweepDir d;
  write_train_config(d, "masked_lm");
  const std::vector<std::string> nag = {"--set", "train.optimizer=nag", "--set", "train.clip=0",
                                        "--set", "train.lr=0.05", "--set", "train.weight_decay=0"};
  REQUIRE(run_cli(d, train_args("runs/one", nag)) == 0);
  std::vector<std::string> two = nag;
  two.insert(two.end(), {"--nproc", "2"});
  REQUIRE(run_cli(d, train_args("runs/two", two)) == 0);
  require_same_run(d, "runs/one", "runs/two", 1e-5);
}

TEST_CASE("distributed: 2 ranks train as 1 process on the same global batch", "[distributed]") {
  for (const std::string objective : {"causal_lm", "masked_lm"}) {
    SECTION(objective) {
      SweepDir d;
      write_train_config(d, objective);
      REQUIRE(run_cli(d, train_args("runs/one")) == 0);
      std::string output;
      REQUIRE(run_cli(d, train_args("runs/two", {"--nproc", "2"}), &output) == 0);
      CHECK(require_checkpoint(d.root / "runs/two").state.world_size == 2);
      require_same_run(d, "runs/one", "runs/two", 1e-5);
      // Only rank 0 wrote the run directory; both evaluate it to the same numbers.
      REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/one", "--length", "16", "32", "--json", "one.json"}) == 0);
      REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/two", "--length", "16", "32", "--json", "two.json"}) == 0);
      const auto one = read_json(d.root / "one.json")["results"];
      const auto two = read_json(d.root / "two.json")["results"];
      REQUIRE(one.size() == 2);
      for (size_t i = 0; i < one.size(); ++i)
        CHECK(relative(two[i]["perplexity"].get<double>(), one[i]["perplexity"].get<double>()) < 1e-5);
    }
  }
}

TEST_CASE("distributed: evaluation on 2 ranks scores the same tokens as on 1", "[distributed]") {
  SweepDir d;
  write_train_config(d);
  REQUIRE(run_cli(d, train_args("runs/one", {"--set", "train.steps=8"})) == 0);
  const std::vector<std::string> eval = {"eval", "--checkpoint", "runs/one", "--length", "16", "32", "48",
                                         "--stride", "8", "--batch-tokens", "96"};
  auto with = [&](const std::string& json, std::vector<std::string> extra) {
    auto args = eval;
    args.insert(args.end(), {"--json", json});
    args.insert(args.end(), extra.begin(), extra.end());
    REQUIRE(run_cli(d, args) == 0);
    return read_json(d.root / json)["results"];
  };
  const auto one = with("one.json", {});
  const auto two = with("two.json", {"--nproc", "2"});
  const auto three = with("three.json", {"--nproc", "3"});  // more ranks than some lengths' batches
  REQUIRE(one.size() == 3);
  for (const auto& other : {two, three}) {
    REQUIRE(other.size() == one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      INFO("length " << one[i]["length"]);
      CHECK(other[i]["scored_tokens"] == one[i]["scored_tokens"]);
      CHECK(other[i]["windows"] == one[i]["windows"]);
      CHECK(relative(other[i]["nll_sum"].get<double>(), one[i]["nll_sum"].get<double>()) < 1e-6);
      REQUIRE(other[i]["by_position"].size() == one[i]["by_position"].size());
      for (size_t b = 0; b < one[i]["by_position"].size(); ++b)
        CHECK(other[i]["by_position"][b][3] == one[i]["by_position"][b][3]);
    }
  }
}

TEST_CASE("distributed: a killed rank stops the others with its name, and --resume continues",
          "[distributed]") {
  SweepDir d;
  write_train_config(d);
  REQUIRE(run_cli(d, train_args("runs/straight", {"--nproc", "2"})) == 0);

  // Rank 1 stops itself after step 6 (a checkpoint exists at step 4); it is then killed.
  const fs::path stops = d.root / "stops";
  const fs::path log = d.root / "killed.log";
  const pid_t launcher =
      spawn(d.root, train_args("runs/killed", {"--nproc", "2"}), log, 0,
            {"EXTRAP_TEST_STOP_AT=step@rank 1:6", "EXTRAP_TEST_STOP_FILE=" + stops.string(),
             "EXTRAP_DIST_TIMEOUT=30"});
  const auto start = std::chrono::steady_clock::now();
  while (read_stops(stops).empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto found = read_stops(stops);
  REQUIRE(found.size() == 1);
  ::kill(found[0].pid, SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  const int code = wait_exit(launcher);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string text = read_text(log);
  INFO(text);
  CHECK(code != 0);
  CHECK(seconds < 25);  // well within the 30 s timeout: a closed connection is noticed at once
  CHECK(text.find("(rank 0): error: rank 0 of 2: rank 1 stopped responding") != std::string::npos);
  CHECK(text.find("Traceback") == std::string::npos);
  CHECK(text.find("GLHF") == std::string::npos);  // gloo's own advice is not extrap's line
  CHECK(text.find("pair.cc") == std::string::npos);
  REQUIRE(require_checkpoint(d.root / "runs/killed").state.step == 4);

  std::string output;
  REQUIRE(run_cli(d, train_args("runs/killed", {"--nproc", "2", "--resume"}), &output) == 0);
  require_same_run(d, "runs/straight", "runs/killed", 1e-6);

  // The checkpoint of 2 ranks is not continued by 1.
  REQUIRE(run_cli(d, train_args("runs/killed", {"--resume"}), &output) == 2);
  CHECK(output.find("trained by 2 data-parallel rank(s); resuming it with 1") != std::string::npos);
}

TEST_CASE("distributed: a hung rank is named within the timeout", "[distributed]") {
  SweepDir d;
  write_train_config(d);
  const fs::path stops = d.root / "stops";
  const int port = test_port();
  const std::vector<std::string> env = {"EXTRAP_DIST_TIMEOUT=4",
                                        "EXTRAP_TEST_STOP_AT=step@rank 1:3",
                                        "EXTRAP_TEST_STOP_FILE=" + stops.string()};
  const pid_t rank0 = spawn_rank(d, 0, 2, port, train_args("runs/hung"), env);
  const pid_t rank1 = spawn_rank(d, 1, 2, port, train_args("runs/hung"), env);
  const auto start = std::chrono::steady_clock::now();
  const int code = wait_exit(rank0);  // rank 1 is stopped (SIGSTOP), never killed, meanwhile
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::kill(rank1, SIGKILL);
  wait_exit(rank1);
  const std::string text = read_text(d.root / "rank0.log");
  INFO(text);
  REQUIRE(read_stops(stops).size() == 1);
  CHECK(code == 1);
  CHECK(seconds < 60);
  CHECK(text.find("rank 1 stopped responding") != std::string::npos);
}

// Starts rank 0 in `d0` and rank 1 in `d1` (each its own working directory), waits for both, and
// returns rank 0's output; both must fail.
std::string refused_pair(const TempDir& d0, const std::vector<std::string>& args0, const TempDir& d1,
                         const std::vector<std::string>& args1) {
  const int port = test_port();
  const pid_t rank0 = spawn_rank(d0, 0, 2, port, args0, {"EXTRAP_DIST_TIMEOUT=20"});
  const pid_t rank1 = spawn_rank(d1, 1, 2, port, args1, {"EXTRAP_DIST_TIMEOUT=20"});
  CHECK(wait_exit(rank0) != 0);
  CHECK(wait_exit(rank1) != 0);
  return read_text(d0.root / "rank0.log");
}

TEST_CASE("distributed: ranks started with different configs are refused", "[distributed]") {
  SweepDir d, elsewhere;  // elsewhere: another node's disk, the same relative paths
  write_train_config(d);
  std::string other = read_text(d.root / "train.yaml");
  REQUIRE(other.find("lr: 0.003") != std::string::npos);
  write_text(elsewhere.root / "train.yaml", other.replace(other.find("lr: 0.003"), 9, "lr: 0.002"));
  // Another flag on one rank: its command line.
  std::string text = refused_pair(d, train_args("runs/x"), d, train_args("runs/x", {"--set", "train.lr=0.002"}));
  CHECK(text.find("rank 1 was started with another command line than rank 0: first difference at "
                  "'arguments'") != std::string::npos);
  // The same command line on another disk whose config differs: the config.
  text = refused_pair(d, train_args("runs/x"), elsewhere, train_args("runs/x"));
  CHECK(text.find("rank 1 was started with another config or data than rank 0: first difference "
                  "at 'config.train.lr'") != std::string::npos);
  CHECK(!has_checkpoint(d.root / "runs/x"));
  CHECK(!has_checkpoint(elsewhere.root / "runs/x"));
  // Another command (it would wait in a collective the other never reaches).
  REQUIRE(run_cli(d, train_args("runs/one", {"--set", "train.steps=4"})) == 0);
  REQUIRE(run_cli(elsewhere, train_args("runs/one", {"--set", "train.steps=4"})) == 0);
  const std::vector<std::string> eval = {"eval", "--checkpoint", "runs/one", "--length", "16"};
  text = refused_pair(d, train_args("runs/z"), d, eval);
  CHECK(text.find("rank 1 was started with another command line than rank 0: first difference at "
                  "'command': train on rank 0, eval on rank 1") != std::string::npos);
  // One evaluation command over two copies of a run that differ: each rank would score its
  // windows with its own model and the sum would be printed as one run's.
  text = refused_pair(d, eval, elsewhere, eval);
  CHECK(text.find("rank 1 was started with another checkpoint or data than rank 0: first difference "
                  "at 'checkpoint.fingerprint'") != std::string::npos);

  // A micro-batch that 3 ranks cannot share evenly (16 sequences).
  std::string output;
  CHECK(run_cli(d, train_args("runs/y", {"--nproc", "3"}), &output) != 0);
  CHECK(output.find("16 sequences a micro-batch, which 3 ranks cannot share evenly") != std::string::npos);
  CHECK(run_cli(d, {"inspect", "--nproc", "2"}, &output) == 2);
  CHECK(output.find("does not run data-parallel") != std::string::npos);
}

TEST_CASE("distributed: torchrun launches extrap with its agent's store", "[distributed]") {
  const fs::path torchrun = fs::path(EXTRAP_PYTHON).parent_path() / "torchrun";
  if (!fs::exists(torchrun)) {
    skip_test("no torchrun beside " + std::string(EXTRAP_PYTHON));
    return;
  }
  SweepDir d;
  write_train_config(d);
  REQUIRE(run_cli(d, train_args("runs/one", {"--set", "train.steps=8"})) == 0);
  const fs::path log = d.root / "torchrun.log";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::chdir(d.root.c_str()) != 0) ::_exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string port = "--master_port=" + std::to_string(test_port());
    std::vector<std::string> all = {torchrun.string(), "--nproc_per_node=2", port, "--no_python",
                                    EXTRAP_CLI};
    for (const auto& a : train_args("runs/torchrun", {"--set", "train.steps=8"})) all.push_back(a);
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(torchrun.c_str(), argv.data());
    ::_exit(127);
  }
  const int code = wait_exit(pid);
  INFO(read_text(log));
  REQUIRE(code == 0);
  CHECK(require_checkpoint(d.root / "runs/torchrun").state.world_size == 2);
  require_same_run(d, "runs/one", "runs/torchrun", 1e-5);
}

namespace {

// Every point of a results file: (run, mode, length) -> (status, perplexity).
std::map<std::string, std::pair<std::string, double>> points_of(const fs::path& file) {
  std::map<std::string, std::pair<std::string, double>> out;
  const ResultsStore store = ResultsStore::open(file.string());
  for (const auto& p : store.points()) {
    double value = p.perplexity;
    if (is_profile_mode(p.mode)) {  // no perplexity: the entropy summed over layers, heads and bins
      value = 0;
      for (const auto& c : p.attention_profile) value += c.entropy;
    }
    out[p.run_id + " " + p.mode + " " + std::to_string(p.eval_length)] = {p.status, value};
  }
  return out;
}

}  // namespace

TEST_CASE("distributed: a sweep as a Slurm array of data-parallel tasks, run here", "[distributed]") {
  SweepDir d;
  // The emitted scripts run with stand-ins for srun (starts --ntasks copies with Slurm's task
  // variables) and scontrol (this machine is the first node).
  fs::create_directories(d.root / "bin");
  write_text(d.root / "bin" / "srun", R"(#!/bin/bash
n=1
case "$1" in --ntasks=*) n=${1#--ntasks=}; shift ;; esac
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=$n SLURM_TASKS_PER_NODE=$n "$@" & pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || code=$?; done
exit $code
)");
  write_text(d.root / "bin" / "scontrol", "#!/bin/sh\necho 127.0.0.1\n");
  fs::permissions(d.root / "bin" / "srun", fs::perms::owner_all);
  fs::permissions(d.root / "bin" / "scontrol", fs::perms::owner_all);

  const std::vector<std::string> small = {"--set", "base.train.steps=10", "--set",
                                          "grid.train.seed=[1]"};
  std::vector<std::string> args = {"sweep", "tiny.yaml", "--slurm", "--tasks", "2", "--ranks", "2"};
  args.insert(args.end(), small.begin(), small.end());
  std::string output;
  REQUIRE(run_cli(d, args, &output) == 0);
  const fs::path dir = d.root / "results" / "tiny.slurm";
  REQUIRE(fs::exists(dir / "array.sbatch"));
  const std::string array = read_text(dir / "array.sbatch");
  CHECK(array.find("#SBATCH --array=0-1") != std::string::npos);
  CHECK(array.find("#SBATCH --ntasks=2") != std::string::npos);
  CHECK(read_text(dir / "submit.sh").find("--dependency=afterok:") != std::string::npos);

  for (int task = 0; task < 2; ++task) {
    // The script's store listens on 20000 + SLURM_JOB_ID % 40000: a job id whose port is free.
    const int job_id = free_port(20000, 59999) - 20000;
    const std::string command = "cd '" + d.root.string() + "' && PATH='" + (d.root / "bin").string() +
                                ":'\"$PATH\" SLURM_ARRAY_TASK_ID=" + std::to_string(task) +
                                " SLURM_JOB_ID=" + std::to_string(job_id) +
                                " SLURM_JOB_NODELIST=here bash results/tiny.slurm/array.sbatch > task" +
                                std::to_string(task) + ".log 2>&1";
    const int status = std::system(command.c_str());
    INFO(read_text(d.root / ("task" + std::to_string(task) + ".log")));  // what the task printed
    REQUIRE(status == 0);
  }
  REQUIRE(std::system(("cd '" + d.root.string() + "' && bash results/tiny.slurm/merge.sbatch > merge.log 2>&1").c_str()) == 0);

  // The same sweep in one process, into another file and run root.
  std::vector<std::string> plain = {"sweep", "tiny.yaml", "--quiet", "--set", "output.path=plain/tiny.h5",
                                    "--set", "output.run_root=plain/runs"};
  plain.insert(plain.end(), small.begin(), small.end());
  REQUIRE(run_cli(d, plain) == 0);
  const auto merged = points_of(d.root / "results" / "tiny.h5");
  const auto expected = points_of(d.root / "plain" / "tiny.h5");
  REQUIRE(merged.size() == expected.size());
  REQUIRE(merged.size() == 12);  // 2 runs x (4 evaluations + attention profiles at 16 and 32)
  for (const auto& [key, value] : expected) {
    INFO(key);
    REQUIRE(merged.count(key));
    CHECK(merged.at(key).first == value.first);
    if (value.first == "ok") CHECK(relative(merged.at(key).second, value.second) < 1e-5);
  }
}
