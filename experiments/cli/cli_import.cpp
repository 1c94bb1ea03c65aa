// `extrap import`: a Hugging Face checkpoint folder as an extrap run directory (core/run/import_run.h).
#include "core/hub/hf_checkpoint.h"
#include "core/run/import_run.h"
#include "experiments/cli/commands.h"

#include <iostream>

namespace po = boost::program_options;

namespace extrap::cli {

int import_model(const Args& args) {
  std::string families;
  for (const auto& name : hf_families()) families += (families.empty() ? "" : ", ") + name;
  po::options_description options("extrap import (families: " + families + ")");
  std::string folder, out;
  ImportOptions import_options;
  options.add_options()
      ("folder", po::value(&folder)->required(), "the checkpoint folder: config.json, safetensors weights, tokenizer.json")
      ("out,o", po::value(&out)->required(), "the run directory to write")
      ("data", po::value(&import_options.data)->required(), "the corpus evaluations read (data.path)")
      ("train-length", po::value(&import_options.train_length),
       "the model's training length (default: config.json's max_position_embeddings)")
      ("alibi-bias", po::value(&import_options.alibi_bias),
       "an ALiBi family's bias: family (its own rule: Falcon rounds to bfloat16; BLOOM and MPT exact), exact, or "
       "bfloat16 / float16 (m j rounded to that dtype, as BLOOM in a half-precision run)")
      ("overwrite", "replace --out if it holds a run");
  po::positional_options_description positional;
  positional.add("folder", 1);
  po::variables_map vm;
  if (!parse(args, "extrap import DIR --out RUN --data CORPUS [--train-length N] [--alibi-bias B] [--overwrite]", options, vm,
             &positional))
    return 0;
  import_options.overwrite = vm.count("overwrite") > 0;
  const ImportSummary s = import_checkpoint(folder, out, import_options);
  std::cout << "imported " << folder << " (" << s.family << ", " << s.parameters << " parameters, " << s.position
            << ", training length " << s.train_length << ", vocabulary " << s.vocab_size << ", weights "
            << s.weights_digest << ") as " << s.run.string() << "\n"
            << "the weights stay in " << folder << " (checked at every load); evaluate it with: extrap eval --checkpoint "
            << s.run.string() << " --length " << s.train_length << "\n";
  return 0;
}

}  // namespace extrap::cli
