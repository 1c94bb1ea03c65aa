// On/off switches in the environment, for A/B runs of an optimisation
// (EXTRAP_BF16_ATTENTION_KERNEL, EXTRAP_BLOCK_CACHE, EXTRAP_MALLOC_TUNING, EXTRAP_ONEDNN_LINEAR,
// EXTRAP_FUSED_ADAMW, EXTRAP_FUSED_GELU, EXTRAP_FUSED_GLU, EXTRAP_FUSED_LAYER_NORM, EXTRAP_FUSED_ROTATION), and opt-ins for paths not yet
// proven where they run (EXTRAP_GPU_NEW_ROUTES).
#pragma once

#include <string>

namespace extrap {

// The switch called `name`: unset or "1" on, "0" off. Anything else is a ConfigError naming the
// variable and its value, "environment variable NAME=VALUE: expected 0 (OFF) or 1 (ON)": a
// benchmark that meant "off" must not silently measure "on".
bool environment_switch(const char* name, const std::string& off, const std::string& on);

// The same for a switch that is off unless asked for: unset or "0" off, "1" on, anything else the
// same ConfigError. For paths that have not yet run where they are meant to (EXTRAP_GPU_NEW_ROUTES).
bool environment_opt_in(const char* name, const std::string& off, const std::string& on);

// EXTRAP_GPU_NEW_ROUTES, an opt-in for the GPU paths written without a GPU and not yet run on one
// (the attention routes of core/attention/gpu_routes.h: SDPA, cuDNN, the offsets kernels; the
// CUDA residual add and LayerNorm of core/kernels/residual_norm.h; the CUDA loss of
// core/kernels/fused_cpu_loss.h; extrap's CUDA attention writing its output and gradients in the
// projections' layouts, core/kernels/qkv_heads.h). Unset or 0: every call goes where it went
// before them. Read at every call (tests set it).
bool gpu_new_routes_on();

}  // namespace extrap
