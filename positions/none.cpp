// `none`: no position information at all (causal attention alone can still infer order).
#include "positions/position.h"

namespace extrap {
namespace {

class NoPosition : public PositionMethod {};

PositionInfo make_none_info() {
  PositionInfo info;
  info.name = "none";
  info.description = "no position information (NoPE)";
  info.modes = kCausal | kBidirectional;
  info.factory = [](const PositionContext&, const OptionReader&) {
    return std::make_shared<NoPosition>();
  };
  return info;
}

}  // namespace
}  // namespace extrap

EXTRAP_REGISTER_POSITION(none, extrap::make_none_info);
