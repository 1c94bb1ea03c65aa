#include "core/base/environment.h"

#include "core/base/errors.h"

#include <cstdlib>

namespace extrap {

namespace {

// "1" on, "0" off, unset `unset`; anything else refused, naming the default.
bool environment_flag(const char* name, bool unset, const std::string& off, const std::string& on) {
  const char* flag = std::getenv(name);
  if (!flag) return unset;
  if (std::string(flag) == "1") return true;
  if (std::string(flag) == "0") return false;
  throw ConfigError("environment variable " + std::string(name) + "=" + flag + ": expected 0 (" + off +
                    (unset ? "" : ", the default") + ") or 1 (" + on + ")");
}

}  // namespace

bool environment_switch(const char* name, const std::string& off, const std::string& on) {
  return environment_flag(name, true, off, on);
}

bool environment_opt_in(const char* name, const std::string& off, const std::string& on) {
  return environment_flag(name, false, off, on);
}

bool gpu_new_routes_on() {
  return environment_opt_in("EXTRAP_GPU_NEW_ROUTES", "the GPU paths that have run on a GPU",
                            "also SDPA, cuDNN's attention, the offsets kernels, extrap's attention writing "
                            "the projections' layouts, the CUDA residual add and LayerNorm and the CUDA loss, "
                            "not yet run on a GPU");
}

}  // namespace extrap
