#include "core/base/environment.h"

#include "core/base/errors.h"

#include <cstdlib>

namespace extrap {

bool environment_switch(const char* name, const std::string& off, const std::string& on) {
  const char* flag = std::getenv(name);
  if (!flag || std::string(flag) == "1") return true;
  if (std::string(flag) == "0") return false;
  throw ConfigError("environment variable " + std::string(name) + "=" + flag + ": expected 0 (" + off +
                    ") or 1 (" + on + ")");
}

bool environment_opt_in(const char* name, const std::string& off, const std::string& on) {
  const char* flag = std::getenv(name);
  if (!flag || std::string(flag) == "0") return false;
  if (std::string(flag) == "1") return true;
  throw ConfigError("environment variable " + std::string(name) + "=" + flag + ": expected 0 (" + off +
                    ", the default) or 1 (" + on + ")");
}

}  // namespace extrap
