// The model's weights digest (TransformerLMImpl::weights_digest), which names the weights a
// recorded evaluation was computed with: it sees a change of any parameter's or buffer's last
// element, the size kept (a hash of part of each tensor, a byte count taken as an element count,
// would not), and nothing else changes it.
#include "core/model/model.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace extrap;

TEST_CASE("the weights digest sees a same-size edit of the last element of every parameter and buffer",
          "[model]") {
  for (const std::string method : {"alibi", "t5_bias", "rotary"}) {
    CAPTURE(method);
    torch::manual_seed(2);
    TransformerLM model = build_model(testing::tiny_config(method), 257);
    const std::string digest = model->weights_digest();
    torch::manual_seed(2);
    CHECK(build_model(testing::tiny_config(method), 257)->weights_digest() == digest);  // deterministic
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (const auto& p : model->named_parameters()) tensors.emplace_back(p.key(), p.value());
    for (const auto& b : model->named_buffers()) tensors.emplace_back("buffer " + b.key(), b.value());
    REQUIRE(tensors.size() > 10);
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : tensors) {
      CAPTURE(name);
      auto flat = tensor.view(-1);
      auto last = flat[flat.numel() - 1];
      const auto kept = last.clone();
      if (tensor.is_floating_point())
        last.copy_(torch::nextafter(kept, kept + 1));  // one unit in the last place
      else
        last.add_(1);
      CHECK(model->weights_digest() != digest);
      last.copy_(kept);
      CHECK(model->weights_digest() == digest);
    }
  }
}
