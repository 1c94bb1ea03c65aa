// The subcommands of the `extrap` command line. Each takes the arguments after its name,
// parses them with Boost.Program_options and returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace extrap::cli {

using Args = std::vector<std::string>;

int train(const Args& args);
int eval(const Args& args);
int positions(const Args& args);
int inspect(const Args& args);
int config_keys(const Args& args);
int bench_train(const Args& args);
int bench_attention(const Args& args);

}  // namespace extrap::cli
