// On/off switches in the environment, for A/B runs of an optimisation
// (EXTRAP_BF16_ATTENTION_KERNEL, EXTRAP_MALLOC_TUNING, EXTRAP_ONEDNN_LINEAR,
// EXTRAP_FUSED_ADAMW, EXTRAP_FUSED_GELU, EXTRAP_FUSED_LAYER_NORM).
#pragma once

#include <string>

namespace extrap {

// The switch called `name`: unset or "1" on, "0" off. Anything else is a ConfigError naming the
// variable and its value, "environment variable NAME=VALUE: expected 0 (OFF) or 1 (ON)": a
// benchmark that meant "off" must not silently measure "on".
bool environment_switch(const char* name, const std::string& off, const std::string& on);

}  // namespace extrap
