// `extrap export`: a trained run's model as a safetensors file for Python (core/export/model_export.h).
#include "core/export/model_export.h"
#include "experiments/cli/commands.h"

#include <iostream>

namespace po = boost::program_options;

namespace extrap::cli {

int export_model(const Args& args) {
  po::options_description options("extrap export");
  std::string run_dir, out;
  options.add_options()
      ("checkpoint", po::value(&run_dir)->required(), "run directory written by extrap train")
      ("out,o", po::value(&out)->required(), "the .safetensors file to write")
      ("overwrite", "replace --out if it exists");
  po::variables_map vm;
  if (!parse(args, "extrap export --checkpoint DIR --out FILE.safetensors [--overwrite]", options, vm))
    return 0;
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
