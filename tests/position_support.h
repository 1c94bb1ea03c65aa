// Building one position method on its own, outside a model, for the position-method tests.
#pragma once

#include <catch2/catch.hpp>

#include "positions/position.h"

#include <memory>
#include <string>

namespace extrap::testing {

// `name` with its YAML options, for `heads` heads of size d_head in a model of `layers` layers.
inline std::shared_ptr<PositionMethod> make_method(const std::string& name, int64_t heads,
                                                   bool causal, const std::string& yaml = "{}",
                                                   int64_t d_head = 8, int64_t layers = 2) {
  PositionContext context;
  context.num_layers = layers;
  context.num_heads = heads;
  context.d_head = d_head;
  context.d_model = heads * d_head;
  context.causal = causal;
  return PositionRegistry::instance().create(name, context,
                                             OptionReader(YAML::Load(yaml), "test options"));
}

// The method's parameter `name` (the test fails if it has none of that name).
inline torch::Tensor parameter(const PositionMethod& method, const std::string& name) {
  auto* found = method.named_parameters().find(name);
  REQUIRE(found != nullptr);
  return *found;
}

}  // namespace extrap::testing
