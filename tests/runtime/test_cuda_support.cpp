// extrap's CUDA half (libextrap_cuda.so with LibTorch's libtorch_cuda) loads only where CUDA can
// run, or when EXTRAP_LOAD_CUDA=1 asks for it (core/runtime/cuda_support.h).
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // Catch2's event listeners, for LoadCudaSupportFirst
#include "core/runtime/cuda_support.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
using extrap::testing::read_text;
using extrap::testing::ScopedVariable;
using extrap::testing::SweepDir;

namespace {

// As every extrap executable's main() does, before any test asks LibTorch about CUDA.
struct LoadCudaSupportFirst : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo&) override { extrap::load_cuda_support(); }
};

// The test's own view of "a machine with an NVIDIA driver": its device nodes or its /proc entry.
bool nvidia_driver_here() {
  return fs::exists("/dev/nvidiactl") || fs::exists("/dev/dxg") ||
         fs::exists("/proc/driver/nvidia/version");
}

}  // namespace

CATCH_REGISTER_LISTENER(LoadCudaSupportFirst)

TEST_CASE("a process on a machine without an NVIDIA driver maps no part of LibTorch's CUDA",
          "[cuda_support]") {
  if (nvidia_driver_here()) return extrap::testing::skip_test("this machine has an NVIDIA driver");
  REQUIRE(std::getenv("EXTRAP_LOAD_CUDA") == nullptr);
  CHECK(extrap::load_cuda_support().state == extrap::CudaSupport::State::no_driver);
  const std::string maps = read_text("/proc/self/maps");
  for (const char* library : {"libtorch_cuda", "libextrap_cuda", "libcudnn", "libcublas", "libnccl"}) {
    INFO(library);
    CHECK(maps.find(library) == std::string::npos);
  }
  CHECK_THAT(extrap::cuda_unavailable_reason(),
             Catch::Contains("extrap's CUDA half is not loaded: no NVIDIA driver on this machine"));

  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("\ncuda: not loaded: no NVIDIA driver on this machine "
                                  "(EXTRAP_LOAD_CUDA=1 loads it anyway)\n"));
  // A CUDA run is refused before any work, with the reason.
  REQUIRE(run_cli(d, extrap::testing::one_step_bench({"--set", "train.device=cuda"}), &out) == 2);
  CHECK_THAT(out, Catch::Contains("train.device is cuda but extrap's CUDA half is not loaded: "
                                  "no NVIDIA driver on this machine"));
}

TEST_CASE("EXTRAP_LOAD_CUDA: 1 loads extrap's CUDA half anywhere, 0 never, anything else is refused",
          "[cuda_support]") {
  if (!fs::exists(fs::path(EXTRAP_BINARY_DIR) / "libextrap_cuda.so"))
    return extrap::testing::skip_test("this build has no CUDA half (no nvcc or a CPU-only LibTorch)");
  SweepDir d;
  std::string out;
  {
    // The independent reference: the CUDA runtime of the project's torch package.
    const fs::path py_out = d.root / "cuda_version.txt";
    REQUIRE(std::system((std::string(EXTRAP_PYTHON) + " -c 'import torch; print(torch.version.cuda)' > " +
                         py_out.string())
                            .c_str()) == 0);
    std::istringstream version(read_text(py_out));
    std::string cuda_version;
    version >> cuda_version;
    const ScopedVariable load("EXTRAP_LOAD_CUDA", "1");
    REQUIRE(run_cli(d, {"--version"}, &out) == 0);
    CHECK_THAT(out, Catch::Contains("\ncuda: CUDA " + cuda_version + ", "));
    CHECK_THAT(out, Catch::Contains("libextrap_cuda.so)\n"));
    // The library registered the fused attention with libextrap when it loaded.
    CHECK_THAT(out, Catch::Contains("\nfused cuda attention: registered\n"));
  }
  {
    const ScopedVariable never("EXTRAP_LOAD_CUDA", "0");
    REQUIRE(run_cli(d, {"--version"}, &out) == 0);
    CHECK_THAT(out, Catch::Contains("\ncuda: not loaded: EXTRAP_LOAD_CUDA=0\n"));
  }
  {
    const ScopedVariable bad("EXTRAP_LOAD_CUDA", "yes");
    REQUIRE(run_cli(d, {"positions"}, &out) == 2);
    CHECK_THAT(out, Catch::Contains("environment variable EXTRAP_LOAD_CUDA=yes: expected auto"));
  }
}
