// `extrap tokenizer train`: a SentencePiece model (BPE or unigram) trained on a corpus's
// training split, for data.tokenizer: sentencepiece; `extrap tokenizer encode`: a text's
// pieces, ids and the bytes each covers, as extrap tokenises it.
#include "core/base/files.h"
#include "core/data/corpus.h"
#include "core/data/sentencepiece.h"
#include "experiments/cli/commands.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace extrap::cli {

namespace {

int tokenizer_train(const Args& args) {
  po::options_description options("extrap tokenizer train");
  std::string data, out;
  CorpusOptions corpus;
  SentencePieceTraining t;
  t.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  options.add_options()
      ("data", po::value(&data)->required(),
       "corpus: a directory of train/valid/test files or one text file (its training split is read)")
      ("vocab-size", po::value(&t.vocab_size)->required(), "pieces in the model (its <unk>, <s>, </s> included)")
      ("out", po::value(&out)->required(), "the .model file to write (data.tokenizer_model)")
      ("type", po::value(&t.model_type), "unigram (default) or bpe")
      ("split-fractions", po::value(&corpus.split_fractions)->multitoken(),
       "a single-file corpus's train, valid and test fractions, as data.split_fractions (default 0.9 0.05 0.05)")
      ("character-coverage", po::value(&t.character_coverage),
       "share of characters the pieces cover (default 1; the rest are written as bytes)")
      ("no-byte-fallback", "write uncovered characters as <unk> instead of their UTF-8 bytes")
      ("no-split-digits", "let pieces hold several digits (default: every digit its own piece)")
      ("seed", po::value(&t.seed), "SentencePiece's random seed (default 1)")
      ("threads", po::value(&t.threads), "training threads (default: all cores)")
      ("overwrite", "replace an existing --out (runs trained with the old model will refuse it)");
  po::variables_map vm;
  if (!parse(args, "extrap tokenizer train --data PATH --vocab-size N --out FILE.model [options]",
             options, vm))
    return 0;
  t.byte_fallback = vm.count("no-byte-fallback") == 0;
  t.split_digits = vm.count("no-split-digits") == 0;
  if (t.threads < 1) throw ConfigError("--threads " + std::to_string(t.threads) + ": must be at least 1");
  if (fs::exists(out) && !vm.count("overwrite"))
    throw ConfigError("--out " + out + " exists (runs trained with it depend on it); --overwrite "
                      "replaces it");
  corpus.path = data;
  const TrainingText train = training_text(corpus);

  const auto start = std::chrono::steady_clock::now();
  const std::string model = train_sentencepiece(train.text, t, train.where);
  write_file_atomic(out, model);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const SentencePieceModel loaded = SentencePieceModel::from_bytes(model, out);
  std::printf("wrote %s: %s, %d pieces (<unk> %d, </s> %d%s), trained on %s (%zu bytes) in %.1f s\n",
              out.c_str(), t.model_type.c_str(), loaded.size(), loaded.unk(), loaded.eos(),
              t.byte_fallback ? ", byte fallback" : "", train.where.c_str(), train.text.size(), seconds);
  std::printf("use it: data: {path: %s, tokenizer: sentencepiece, tokenizer_model: %s}\n",
              data.c_str(), out.c_str());
  return 0;
}

int tokenizer_encode(const Args& args) {
  po::options_description options("extrap tokenizer encode");
  std::string model_path, text, file;
  options.add_options()
      ("model", po::value(&model_path)->required(), "a SentencePiece .model file")
      ("text", po::value(&text), "the text to encode")
      ("file", po::value(&file), "encode this file's text instead");
  po::variables_map vm;
  if (!parse(args, "extrap tokenizer encode --model FILE.model --text TEXT|--file F", options, vm))
    return 0;
  if (vm.count("text") == vm.count("file"))
    throw ConfigError("extrap tokenizer encode: give --text or --file (one of them)");
  if (vm.count("file")) text = read_file(file);
  const SentencePieceModel model = SentencePieceModel::load(model_path);
  const SentencePieceModel::Encoded encoded = model.encode_lines(text);
  std::printf("%-8s %-8s %-6s %s\n", "token", "id", "bytes", "piece");
  for (size_t i = 0; i < encoded.ids.size(); ++i)
    std::printf("%-8zu %-8d %-6d %s\n", i, encoded.ids[i], encoded.bytes[i],
                model.piece(encoded.ids[i]).c_str());
  int64_t bytes = 0;
  for (int32_t b : encoded.bytes) bytes += b;
  std::printf("%zu tokens for %lld bytes of text (%.3f bytes a token)\n", encoded.ids.size(),
              static_cast<long long>(bytes),
              encoded.ids.empty() ? 0.0 : double(bytes) / double(encoded.ids.size()));
  return 0;
}

}  // namespace

int tokenizer(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: extrap tokenizer train|encode [options]   (--help on each)\n"
                 "  train   a SentencePiece model (unigram or BPE) from a corpus's training split\n"
                 "  encode  a text's pieces, ids and bytes, as data.tokenizer: sentencepiece reads it\n";
    return args.empty() ? 2 : 0;
  }
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "train") return tokenizer_train(rest);
  if (args[0] == "encode") return tokenizer_encode(rest);
  std::cerr << "extrap tokenizer: unknown subcommand '" << args[0] << "' (known: train, encode)\n";
  return 2;
}

}  // namespace extrap::cli
