// `--nproc N`: N data-parallel ranks on this machine, started the way torchrun starts them
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each running the
// same command without --nproc. The launcher waits for them; when one fails the others are
// given the process-group timeout to notice and exit on their own, then killed. Its exit code is
// the first failing rank's (0 when all succeed). Ctrl-C and SIGTERM are passed on to the ranks.
#include "core/runtime/distributed.h"
#include "experiments/cli/commands.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <thread>

namespace extrap::cli {

namespace {

// A TCP port free on 127.0.0.1 now (the kernel's choice); rank 0's store binds it next.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("--nproc: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("--nproc: cannot find a free port on 127.0.0.1: " + error);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

volatile sig_atomic_t forwarded_signal = 0;
void remember_signal(int signal) { forwarded_signal = signal; }

}  // namespace

int launch_local_ranks(int nproc, const std::string& command, const Args& args) {
  if (nproc < 1 || nproc > 1024)
    throw ConfigError("--nproc " + std::to_string(nproc) + ": expected 1 to 1024 ranks");
  if (ProcessGroup::environment())
    throw ConfigError("--nproc starts ranks itself, but this process already is rank " +
                      std::to_string(ProcessGroup::environment()->rank) +
                      " of a launch (RANK or SLURM_PROCID is set): drop --nproc");
  const std::string port = std::to_string(free_port());
  std::vector<std::string> argv{"extrap", command};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);

  std::signal(SIGINT, remember_signal);
  std::signal(SIGTERM, remember_signal);
  const pid_t launcher = ::getpid();
  std::vector<pid_t> ranks;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("--nproc: fork: ") + std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the launcher
      if (::getppid() != launcher) ::_exit(1);
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      ::execv("/proc/self/exe", raw.data());
      std::fprintf(stderr, "extrap --nproc: cannot start rank %d: %s\n", r, std::strerror(errno));
      ::_exit(127);
    }
    ranks.push_back(pid);
  }

  // The survivors of a failed rank notice it within the process group's timeout.
  const double grace = distributed_timeout_seconds() + 15.0;
  int exit_code = 0;
  int running = nproc;
  std::chrono::steady_clock::time_point failed_at;
  bool killed = false;
  while (running > 0) {
    if (forwarded_signal) {
      for (pid_t pid : ranks) if (pid > 0) ::kill(pid, forwarded_signal);
      forwarded_signal = 0;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (int r = 0; r < nproc; ++r) {
        if (ranks[size_t(r)] != done) continue;
        ranks[size_t(r)] = -1;
        --running;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code != 0 && exit_code == 0) {
          exit_code = code;
          failed_at = std::chrono::steady_clock::now();
          if (!WIFEXITED(status))
            std::cerr << "extrap --nproc: rank " << r << " was killed by signal "
                      << WTERMSIG(status) << "\n";
        }
      }
      continue;
    }
    if (exit_code != 0 && !killed &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - failed_at).count() > grace) {
      for (int r = 0; r < nproc; ++r) {
        if (ranks[size_t(r)] <= 0) continue;
        std::cerr << "extrap --nproc: rank " << r << " did not exit " << int(grace)
                  << " s after another failed: killing it\n";
        ::kill(ranks[size_t(r)], SIGKILL);
      }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return exit_code;
}

}  // namespace extrap::cli
