// `extrap export --format hf`: a run's model as a Hugging Face checkpoint folder that
// transformers loads: `AutoModelForCausalLM.from_pretrained(DIR)` (a masked LM:
// AutoModelForMaskedLM), with `trust_remote_code=True` where the folder ships its own code.
//
// Native: where a family's own class computes the model exactly (core/hub/hf_checkpoint.h,
// hf_export_config), the folder is that family's: config.json and model.safetensors (float32,
// the class's tensor names). An imported model goes back to its own family, and an extrap model
// with the options of one (Llama's: RMSNorm, SwiGLU, no biases, rotary with the half pairing,
// ...) goes there too. An untied model with model.scale_embedding has its input embedding
// multiplied by sqrt(d_model), which the classes do not apply.
//
// Remote code: any other model (a method or option no class has, a layer pattern, a masked LM,
// adaptive bands, extrap's scaled tied embedding) ships its code: model.safetensors is extrap's
// own export (core/export/model_export.h; analysis/extrap_model.py reads it as well),
// extrap_model.py is that reader and modeling_extrap.py gives it transformers' classes
// (analysis/modeling_extrap.py; both embedded in the binary at build time, so that a folder holds
// the code of the extrap that wrote it). config.json carries the file's metadata as
// extrap_metadata. What the reader does not compute (RoPE scaling built in, a released family's
// ALiBi rounding) is refused, naming it.
//
// Tokenizer (tokenizer_config.json and): a Hugging Face tokenizer's own tokenizer.json; for byte
// level a tokenizer.json of a byte-level BPE without merges whose ids are the bytes (with <mask>
// for a masked LM); for word level and SentencePiece, whose lines each end in an end-of-sentence
// token that no tokenizer.json adds exactly, tokenization_extrap.py (analysis/, embedded too) with
// vocabulary.json or tokenizer.model (AutoTokenizer with trust_remote_code=True).
//
// Everything is refused, naming the option, before anything is written. The folder is written
// as DIR.tmp and renamed into place whole.
#pragma once

#include <filesystem>
#include <string>

namespace extrap {

// --hf-class: the family's own class where one computes the model, else remote code (auto); a
// family's class or a refusal naming the option (native); remote code whatever the model (remote).
enum class HfClass { automatic, native, remote };

struct HfExportSummary {
  std::filesystem::path dir;
  std::string family;         // the native family, or "extrap" (remote code)
  std::string remote_reason;  // remote code: why (the option no class computes, or --hf-class remote)
  size_t tensors = 0;
  bool masked = false;     // a masked LM (AutoModelForMaskedLM)
  bool tokenizer = false;  // a tokenizer written
};

HfExportSummary export_hf(const std::filesystem::path& run_dir, const std::filesystem::path& out, bool overwrite,
                          HfClass hf_class = HfClass::automatic);

}  // namespace extrap
