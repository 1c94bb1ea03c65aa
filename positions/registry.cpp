// The position-method registry: built-ins register statically, plugins through dlopen.
#include "positions/position.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

namespace extrap {

namespace detail {
std::vector<PositionInfo>& pending_registrations() {
  static std::vector<PositionInfo> pending;
  return pending;
}
}  // namespace detail

PositionRegistry& PositionRegistry::instance() {
  static PositionRegistry* registry = [] {
    auto* r = new PositionRegistry();
    r->drain_pending("built-in");
    return r;
  }();
  return *registry;
}

void PositionRegistry::drain_pending(const std::string& origin) {
  auto pending = std::move(detail::pending_registrations());
  detail::pending_registrations().clear();
  std::string error;
  for (auto& info : pending) {
    info.origin = origin;
    try {
      add(std::move(info));
    } catch (const ConfigError& e) {
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) throw ConfigError(error);
}

void PositionRegistry::add(PositionInfo info) {
  if (info.name.empty()) throw ConfigError(info.origin + ": a position method has an empty name");
  if (!info.factory)
    throw ConfigError(info.origin + ": position method '" + info.name + "' has no factory");
  for (const auto& m : methods_)
    if (m.name == info.name)
      throw ConfigError("position method '" + info.name + "' is registered twice (" + m.origin +
                        " and " + info.origin + ")");
  methods_.push_back(std::move(info));
}

bool PositionRegistry::contains(const std::string& name) const {
  return std::any_of(methods_.begin(), methods_.end(),
                     [&](const PositionInfo& m) { return m.name == name; });
}

std::vector<std::string> PositionRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& m : methods_) out.push_back(m.name);
  std::sort(out.begin(), out.end());
  return out;
}

torch::Tensor TokenPositions::values(torch::TensorOptions options) const {
  if (!options.has_dtype()) options = options.dtype(torch::kFloat32);
  if (is_sampled()) {
    TORCH_CHECK(sampled.dim() == 1 && sampled.size(0) == length, "sampled positions ",
                sampled.sizes(), " for a window of ", length, " tokens");
    return sampled.to(options.device(), options.dtype_opt().value());
  }
  return torch::arange(offset, offset + length, options);
}

TokenPositions TokenPositions::grouped(bool queries) const {
  TORCH_CHECK(group_size >= 1 && neighbor_window >= 1, "self-extend: group size ", group_size, " and neighbour window ",
              neighbor_window, " must be at least 1");
  const auto p = values(torch::TensorOptions().dtype(torch::kLong));
  auto g = p.div(group_size, "floor");
  if (queries) g = g + (neighbor_window - neighbor_window / group_size);
  TokenPositions out = TokenPositions::window(length, offset);
  out.sampled = g;
  // One centre for both sets (xpos scales q and k from it, and the two must cancel): the
  // middle of the grouped range, from the first key to the last query.
  const int64_t shift = neighbor_window - neighbor_window / group_size;
  out.centre = centre >= 0 ? centre
                           : (p[0].item<int64_t>() / group_size + p[-1].item<int64_t>() / group_size + shift) / 2;
  return out;
}

std::string PositionRegistry::randomizable_names() const {
  std::string out;
  for (const auto& n : names())
    if (get(n).randomizable) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const PositionInfo& PositionRegistry::get(const std::string& name) const {
  for (const auto& m : methods_)
    if (m.name == name) return m;
  std::string known;
  for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown position method '" + name + "' (known: " + known + ")");
}

std::shared_ptr<PositionMethod> PositionRegistry::create(const std::string& name,
                                                         const PositionContext& context,
                                                         const OptionReader& options) const {
  const PositionInfo& info = get(name);
  const unsigned mode = context.causal ? kCausal : kBidirectional;
  if (!(info.modes & mode)) {
    const std::string& alternative =
        context.causal ? info.causal_alternative : info.bidirectional_alternative;
    throw ConfigError("position method '" + name + "' does not support " +
                      (context.causal ? "causal" : "bidirectional") + " attention" +
                      (info.mode_reason.empty() ? std::string() : " (" + info.mode_reason + ")") +
                      (alternative.empty() ? std::string()
                                           : "; use '" + alternative + "' instead"));
  }
  options.accept("name", "the method's name");  // the section's own key, read by the config
  PositionContext with_options = context;
  with_options.sampling = read_sampling(options);
  if (with_options.sampling.active() && !info.randomizable)
    options.fail(with_options.sampling.key().substr(std::string("position.").size()),
                 "position method '" + name + "' does not take sampled positions (randomized "
                 "positions and PoSE apply to methods that use absolute positions: " +
                 randomizable_names() + ")");
  auto method = info.factory(with_options, options);
  method->sampling_ = with_options.sampling;
  options.finish();
  return method;
}

namespace {
// Plugins whose registrations already ran, by canonical path: "" if they loaded, else the
// error they gave. dlopen() runs a library's static registrations only the first time, so a
// second load of the same file must not look for them again.
std::map<std::string, std::string>& loaded_plugins() {
  static std::map<std::string, std::string> loaded;
  return loaded;
}
}  // namespace

void PositionRegistry::load_plugin(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw ConfigError("plugin '" + path + "': no such file");
  const std::string canonical = std::filesystem::canonical(path).string();
  if (auto seen = loaded_plugins().find(canonical); seen != loaded_plugins().end()) {
    if (seen->second.empty()) return;  // loaded before: nothing to do
    throw ConfigError(seen->second);
  }
  const auto before = detail::pending_registrations().size();
  if (before != 0) drain_pending("built-in");
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) throw ConfigError("plugin '" + path + "': cannot load: " + dlerror());
  if (!dlsym(handle, "extrap_plugin_abi")) {
    detail::pending_registrations().clear();
    throw ConfigError("plugin '" + path +
                      "': not an extrap plugin (symbol extrap_plugin_abi is missing; add "
                      "EXTRAP_PLUGIN() to one of its files)");
  }
  if (detail::pending_registrations().empty())
    throw ConfigError("plugin '" + path + "': registers no position method");
  try {
    drain_pending(path);
  } catch (const ConfigError& e) {
    const std::string error = "plugin '" + path + "': " + e.what();
    loaded_plugins()[canonical] = error;
    throw ConfigError(error);
  }
  loaded_plugins()[canonical] = "";
}

}  // namespace extrap
