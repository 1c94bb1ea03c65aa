// `extrap export --format hf`: a run's model as a Hugging Face checkpoint folder that
// `AutoModelForCausalLM.from_pretrained(DIR)` loads with the family's own class (no remote code):
// config.json, model.safetensors (float32, the class's tensor names) and, for a corpus with a
// Hugging Face tokenizer (an imported run's), tokenizer.json and tokenizer_config.json.
//
// The family is the one whose class computes the model exactly (core/hub/hf_checkpoint.h,
// hf_export_config): an imported model goes back to its own family, and an extrap model with
// the options of one (Llama's: RMSNorm, SwiGLU, no biases, rotary with the half pairing, ...)
// goes there too. An untied model with model.scale_embedding has its input embedding multiplied
// by sqrt(d_model), which the classes do not apply. A model no class computes is refused,
// naming the option, before anything is written. The folder is written as DIR.tmp and renamed
// into place whole.
#pragma once

#include <filesystem>
#include <string>

namespace extrap {

struct HfExportSummary {
  std::filesystem::path dir;
  std::string family;
  size_t tensors = 0;
  bool tokenizer = false;  // tokenizer.json written
};

HfExportSummary export_hf(const std::filesystem::path& run_dir, const std::filesystem::path& out, bool overwrite);

}  // namespace extrap
