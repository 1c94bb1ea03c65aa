// The error every layer throws for what a user can fix (a config key, a command-line value, an
// input file), and the two helpers its messages are written with. Nothing here knows YAML, so
// files, hashing and formats can refuse without the option decoder.
#pragma once

#include <stdexcept>
#include <string>

namespace extrap {

// A user-facing error in a config, a command line or an input file. The message is complete.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A number as messages write it: the shortest form that reads back the same to 15 digits
// ("0.5", "4", "1e-06").
std::string number_text(double value);

// `text` on one line (line breaks become spaces, trailing spaces dropped): for messages that
// are stored (a failed point's status) or printed in a table.
std::string one_line(std::string text);

}  // namespace extrap
