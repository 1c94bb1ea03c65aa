// core/run/checkpoint.h: what a reader gets while the run that owns the checkpoint saves new
// ones (`extrap eval` of a run still training).
#include "core/run/checkpoint.h"
#include "tests/support/test_support.h"

#include <atomic>
#include <thread>

using namespace extrap;
using namespace extrap::testing;

TEST_CASE("a checkpoint read while the run saves new ones is a whole one, never called corrupt",
          "[checkpoint]") {
  TempDir d("swap");
  const fs::path run = d.root / "run";
  fs::create_directories(run);
  Config config = tiny_config("alibi");
  config.model.d_model = 64;  // model.pt large enough that reading it overlaps a swap
  config.model.d_ffn = 256;
  TransformerLM saved = build_model(config, 257);
  // Checkpoint `step` holds every parameter equal to `step`: a reader can tell which one it got.
  const auto save = [&](int64_t step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : saved->parameters()) p.fill_(double(step));
    }
    CheckpointManifest manifest;
    manifest.step = step;
    manifest.fingerprint = "f";
    manifest.vocabulary = "v";
    CheckpointState state;
    state.step = step;
    save_checkpoint(run, config, manifest, state, saved, nullptr);
  };
  save(1);

  std::atomic<bool> writing{true};
  std::thread writer([&] {
    for (int64_t step = 2; step <= 60; ++step) save(step);
    writing = false;
  });
  TransformerLM loaded = build_model(config, 257);
  int64_t reads = 0, last = 0;
  std::string failure;
  while (writing && failure.empty()) {
    try {
      const auto checkpoint = find_checkpoint(run);
      if (!checkpoint) {
        failure = "no checkpoint found";
        break;
      }
      load_model(*checkpoint, loaded);
      const int64_t step = checkpoint->manifest.step;
      // The manifest, the state and the weights all of one checkpoint, and never an older one.
      const auto weights = torch::cat([&] {
        std::vector<torch::Tensor> flat;
        for (const auto& p : loaded->parameters()) flat.push_back(p.detach().flatten());
        return flat;
      }());
      if (checkpoint->state.step != step || !(weights == double(step)).all().item<bool>() || step < last)
        failure = "checkpoint of step " + std::to_string(step) + " read with state step " +
                  std::to_string(checkpoint->state.step) + " after step " + std::to_string(last);
      last = step;
      ++reads;
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  writer.join();
  INFO("after " << reads << " reads: " << failure);
  CHECK(failure.empty());
  CHECK(reads > 0);
  CHECK(find_checkpoint(run)->manifest.step == 60);
  CHECK_FALSE(fs::exists(run / "checkpoint.old"));
  CHECK_FALSE(fs::exists(run / "checkpoint.tmp"));
}
