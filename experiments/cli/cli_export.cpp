// `extrap export`: a trained run's model as a safetensors file for Python (core/export/model_export.h).
#include "core/export/hf_export.h"
#include "core/export/model_export.h"
#include "experiments/cli/commands.h"

#include <iostream>
#include <map>

namespace po = boost::program_options;

namespace extrap::cli {

int export_model(const Args& args) {
  po::options_description options("extrap export");
  std::string run_dir, out, format = "safetensors", hf_class = "auto";
  options.add_options()
      ("checkpoint", po::value(&run_dir)->required(), "run directory written by extrap train (or extrap import)")
      ("out,o", po::value(&out)->required(), "the .safetensors file to write (--format hf: the folder)")
      ("format", po::value(&format),
       "safetensors (extrap's, for analysis/extrap_model.py) or hf (a folder transformers loads: with the family's "
       "own class, or with the folder's remote code where no class computes the model)")
      ("hf-class", po::value(&hf_class),
       "--format hf: auto (the family's class where one computes the model, else remote code), native (the "
       "family's class or a refusal naming the option) or remote (remote code whatever the model)")
      ("overwrite", "replace --out if it exists");
  po::variables_map vm;
  if (!parse(args,
             "extrap export --checkpoint DIR --out FILE.safetensors|DIR [--format safetensors|hf] "
             "[--hf-class auto|native|remote] [--overwrite]",
             options, vm))
    return 0;
  if (vm.count("hf-class") && format != "hf") throw ConfigError("--hf-class: only with --format hf");
  if (format == "hf") {
    const std::map<std::string, HfClass> classes = {
        {"auto", HfClass::automatic}, {"native", HfClass::native}, {"remote", HfClass::remote}};
    if (!classes.count(hf_class)) throw ConfigError("--hf-class " + hf_class + ": not one of auto, native, remote");
    const HfExportSummary s = export_hf(run_dir, out, vm.count("overwrite") > 0, classes.at(hf_class));
    const bool remote = s.family == "extrap";
    std::cout << "wrote " << s.dir.string() << ": "
              << (remote ? "remote code (modeling_extrap.py; " + s.remote_reason + ")" : s.family + "'s own class")
              << ", " << s.tensors << " tensors"
              << (s.tokenizer ? ", a tokenizer" : ", no tokenizer (the corpus is pre-tokenised ids)")
              << "\nload it in Python: transformers." << (s.masked ? "AutoModelForMaskedLM" : "AutoModelForCausalLM")
              << ".from_pretrained(\"" << s.dir.string() << "\"" << (remote ? ", trust_remote_code=True" : "")
              << ")\n";
    return 0;
  }
  if (format != "safetensors") throw ConfigError("--format " + format + ": not one of safetensors, hf");
  ExportOptions export_options;
  export_options.overwrite = vm.count("overwrite") > 0;
  const ExportSummary summary = export_run(run_dir, out, export_options);
  std::cout << "wrote " << summary.file.string() << ": " << summary.tensors << " tensors, "
            << summary.bytes << " bytes, step " << summary.step;
  if (!summary.vocabulary_file.empty())
    std::cout << "; " << (summary.vocabulary_file.extension() == ".model" ? "tokenizer" : "vocabulary")
              << " in " << summary.vocabulary_file.string();
  std::cout << "\nload it in Python: analysis/extrap_model.py (docs/formats.md: Using the model from Python)\n";
  return 0;
}

}  // namespace extrap::cli
