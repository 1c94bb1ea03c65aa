#include "core/config.h"

namespace extrap {

namespace {

// One place that lists every key: used to decode and to document.
void read_config(const OptionReader& root, Config& c) {
  {
    auto r = root.section("data", "the corpus");
    r.read("path", c.data.path, "corpus directory (train/valid/test files) or a single text file");
    r.read_choice("tokenizer", c.data.tokenizer, {"byte", "word"}, "tokenisation");
    r.read("cache_dir", c.data.cache_dir, "where tokenised splits are cached");
    r.read("split_fractions", c.data.split_fractions,
           "train/valid/test fractions when data.path is a single file");
    r.finish();
  }
  {
    auto r = root.section("model", "the transformer");
    auto& m = c.model;
    r.read("layers", m.layers, "number of transformer blocks");
    r.read("d_model", m.d_model, "model width");
    r.read("heads", m.heads, "attention heads (d_model must divide evenly)");
    r.read("d_ffn", m.d_ffn, "feed-forward hidden width");
    r.read("dropout", m.dropout, "dropout on embeddings, residual branches and the FFN");
    r.read("attention_dropout", m.attention_dropout, "dropout on attention probabilities");
    r.read_choice("activation", m.activation, {"gelu", "relu"}, "FFN activation");
    r.read("tie_embeddings", m.tie_embeddings, "share input and output embedding matrices");
    r.read_choice("objective", m.objective, {"causal_lm", "masked_lm"},
                  "causal LM, or bidirectional masked LM");
    r.read_choice("attention", m.attention, {"auto", "reference", "efficient", "fused"},
                  "attention implementation");
    r.read("efficient_threshold", m.efficient_threshold,
           "auto: inference windows with T*T above this use the memory-efficient path");
    r.finish();
    if (root.decoding()) {
      if (m.layers < 1) r.fail("layers", "must be at least 1");
      if (m.heads < 1 || m.d_model % m.heads != 0)
        r.fail("heads", "d_model (" + std::to_string(m.d_model) + ") must be a multiple of heads (" +
                            std::to_string(m.heads) + ")");
      if (m.dropout < 0 || m.dropout >= 1) r.fail("dropout", "must be in [0, 1)");
    }
  }
  {
    // The position section is decoded by the method itself; only `name` is read here.
    root.accept("position", "the position method: {name: NAME, ...its options} (see `extrap positions`)");
    if (root.decoding() && root.has("position")) {
      const YAML::Node p = root.node()["position"];
      if (p.IsScalar()) {
        c.position_name = p.as<std::string>();
        c.position = YAML::Node(YAML::NodeType::Map);
      } else if (p.IsMap()) {
        c.position = YAML::Clone(p);
        if (p["name"]) c.position_name = p["name"].as<std::string>();
        c.position.remove("name");
      } else {
        root.fail("position", "expected a method name or a map with 'name'");
      }
    }
  }
  {
    auto r = root.section("train", "training");
    auto& t = c.train;
    r.read("seq_len", t.seq_len, "training sequence length L");
    r.read("batch_tokens", t.batch_tokens, "tokens per optimiser step");
    r.read("accumulation", t.accumulation, "micro-batches per optimiser step (gradient accumulation)");
    r.read("steps", t.steps, "optimiser steps");
    r.read("lr", t.lr, "peak learning rate");
    r.read("min_lr", t.min_lr, "final learning rate of the cosine schedule");
    r.read("warmup", t.warmup, "linear warm-up steps");
    r.read_choice("schedule", t.schedule, {"cosine", "inverse_sqrt", "constant"}, "decay after warm-up");
    r.read("weight_decay", t.weight_decay, "AdamW weight decay (matrices only)");
    r.read("beta1", t.beta1, "AdamW beta1");
    r.read("beta2", t.beta2, "AdamW beta2");
    r.read("eps", t.eps, "AdamW epsilon");
    r.read("clip", t.clip, "maximum gradient norm (0: no clipping)");
    r.read("seed", t.seed, "random seed (initialisation, data order, dropout)");
    r.read("validate_every", t.validate_every, "steps between validations (0: only at the end)");
    r.read("validate_tokens", t.validate_tokens, "validation tokens per check (0: whole split)");
    r.read("checkpoint_every", t.checkpoint_every, "steps between checkpoints (0: only at the end)");
    r.read("log_every", t.log_every, "steps between log lines when not on a terminal");
    r.read("out_dir", t.out_dir, "run directory (checkpoints, logs)");
    r.read("threads", t.threads, "CPU threads (0: all available cores)");
    r.read_choice("device", t.device, {"cpu", "cuda"}, "where to train");
    r.read("mask_prob", t.mask_prob, "masked_lm: fraction of tokens selected for prediction");
    r.finish();
    if (root.decoding()) {
      if (t.seq_len < 1) r.fail("seq_len", "must be at least 1");
      if (t.accumulation < 1) r.fail("accumulation", "must be at least 1");
      if (t.batch_tokens < t.seq_len * t.accumulation)
        r.fail("batch_tokens", "must be at least seq_len * accumulation (" +
                                   std::to_string(t.seq_len * t.accumulation) + ")");
      if (t.steps < 0) r.fail("steps", "must not be negative");
    }
  }
  {
    auto r = root.section("eval", "evaluation");
    auto& e = c.eval;
    r.read("lengths", e.lengths, "evaluation window lengths");
    r.read("strides", e.strides, "sliding-window strides (non-overlapping is always evaluated)");
    r.read_choice("split", e.split, {"valid", "test"}, "evaluation split");
    r.read("batch_tokens", e.batch_tokens, "tokens per evaluation forward pass");
    r.read("max_tokens", e.max_tokens, "evaluate on the first N tokens only (0: all)");
    r.read("mask_seed", e.mask_seed, "masked_lm: seed of the fixed token selection");
    r.finish();
    if (root.decoding()) {
      for (auto l : e.lengths)
        if (l < 1) r.fail("lengths", "lengths must be at least 1, got " + std::to_string(l));
      for (auto s : e.strides)
        if (s < 1) r.fail("strides", "strides must be at least 1, got " + std::to_string(s));
    }
  }
  root.read("plugins", c.plugins, "position-method plugin libraries (.so) to load");
  root.finish();
}

}  // namespace

Config config_from_yaml(const YAML::Node& root, const std::string& source) {
  Config c;
  c.source = source;
  read_config(OptionReader(root, source), c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node root = path.empty() ? YAML::Node(YAML::NodeType::Map) : load_yaml_file(path);
  for (const auto& o : overrides) apply_override(root, o);
  return config_from_yaml(root, path.empty() ? "(command line)" : path);
}

std::vector<OptionDoc> config_documentation() {
  Config c;
  auto doc = OptionReader::documenter();
  read_config(doc, c);
  return doc.docs();
}

YAML::Node Config::to_yaml() const {
  YAML::Node out(YAML::NodeType::Map);
  Config copy = *this;
  read_config(OptionReader::writer(out), copy);
  YAML::Node p = YAML::Clone(position);
  p["name"] = position_name;
  out["position"] = p;
  return out;
}

}  // namespace extrap
