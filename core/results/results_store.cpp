#include "core/results/results_store.h"

#include "core/base/files.h"
#include "core/run/run_dir.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/base/yaml_options.h"

namespace fs = std::filesystem;

namespace extrap {

namespace {

constexpr int64_t kResultsFormat = 1;
constexpr hsize_t kChunkRows = 64;

// HDF5's C++ exceptions are not std::exceptions: every entry point converts them.
[[noreturn]] void rethrow_hdf5(const std::string& path, const H5::Exception& e) {
  throw std::runtime_error(path + ": HDF5 error in " + e.getFuncName() + ": " + e.getDetailMsg());
}

struct QuietHdf5 {
  QuietHdf5() { H5::Exception::dontPrint(); }
};
const QuietHdf5 quiet_hdf5;

H5::StrType string_type() {
  H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
  type.setCset(H5T_CSET_UTF8);
  return type;
}

// --- attributes ----------------------------------------------------------------------------

void set_attribute(const H5::H5Object& object, const std::string& name, const std::string& value) {
  if (object.attrExists(name)) object.removeAttr(name);
  const H5::StrType type = string_type();
  object.createAttribute(name, type, H5::DataSpace(H5S_SCALAR)).write(type, value);
}

void set_attribute(const H5::H5Object& object, const std::string& name, int64_t value) {
  if (object.attrExists(name)) object.removeAttr(name);
  object.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR))
      .write(H5::PredType::NATIVE_INT64, &value);
}

void set_attribute(const H5::H5Object& object, const std::string& name, double value) {
  if (object.attrExists(name)) object.removeAttr(name);
  object.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR))
      .write(H5::PredType::NATIVE_DOUBLE, &value);
}

std::string string_attribute(const H5::H5Object& object, const std::string& name) {
  if (!object.attrExists(name)) return "";
  H5::Attribute attribute = object.openAttribute(name);
  std::string value;
  attribute.read(attribute.getStrType(), value);
  return value;
}

int64_t int_attribute(const H5::H5Object& object, const std::string& name) {
  int64_t value = 0;
  if (object.attrExists(name)) object.openAttribute(name).read(H5::PredType::NATIVE_INT64, &value);
  return value;
}

double double_attribute(const H5::H5Object& object, const std::string& name) {
  double value = NAN;
  if (object.attrExists(name)) object.openAttribute(name).read(H5::PredType::NATIVE_DOUBLE, &value);
  return value;
}

// --- extendable datasets -------------------------------------------------------------------

// An empty dataset of rows of `width` columns (width 0: one value per row), growing along
// the first dimension.
H5::DataSet create_rows(const H5::Group& group, const std::string& name, const H5::DataType& type,
                        hsize_t width = 0) {
  const int rank = width == 0 ? 1 : 2;
  const hsize_t dims[2] = {0, width}, max_dims[2] = {H5S_UNLIMITED, width};
  const hsize_t chunk[2] = {kChunkRows, width};
  H5::DSetCreatPropList properties;
  properties.setChunk(rank, chunk);
  return group.createDataSet(name, type, H5::DataSpace(rank, dims, max_dims), properties);
}

// Appends `count` rows held in `rows` (row-major, `width` values per row; 0: scalars).
void append_rows(H5::DataSet& dataset, const H5::DataType& memory_type, const void* rows,
                 hsize_t count, hsize_t width = 0) {
  if (count == 0) return;
  const int rank = width == 0 ? 1 : 2;
  hsize_t dims[2] = {0, 0};
  dataset.getSpace().getSimpleExtentDims(dims);
  const hsize_t start[2] = {dims[0], 0}, block[2] = {count, width};
  hsize_t grown[2] = {dims[0] + count, width};
  dataset.extend(grown);
  H5::DataSpace file_space = dataset.getSpace();
  file_space.selectHyperslab(H5S_SELECT_SET, block, start);
  H5::DataSpace memory_space(rank, block);
  dataset.write(rows, memory_type, memory_space, file_space);
}

void write_curve(const H5::Group& group, const std::string& name,
                 const std::vector<CurvePoint>& curve) {
  if (group.nameExists(name)) group.unlink(name);
  H5::DataSet dataset = create_rows(group, name, H5::PredType::NATIVE_DOUBLE, 2);
  std::vector<double> rows;
  for (const auto& p : curve) {
    rows.push_back(double(p.step));
    rows.push_back(p.loss);
  }
  append_rows(dataset, H5::PredType::NATIVE_DOUBLE, rows.data(), curve.size(), 2);
}

std::vector<CurvePoint> read_curve(const H5::Group& group, const std::string& name) {
  std::vector<CurvePoint> curve;
  if (!group.nameExists(name)) return curve;
  H5::DataSet dataset = group.openDataSet(name);
  hsize_t dims[2] = {0, 0};
  dataset.getSpace().getSimpleExtentDims(dims);
  std::vector<double> rows(dims[0] * 2);
  if (!rows.empty()) dataset.read(rows.data(), H5::PredType::NATIVE_DOUBLE);
  for (hsize_t i = 0; i < dims[0]; ++i) curve.push_back({int64_t(rows[2 * i]), rows[2 * i + 1]});
  return curve;
}

// --- compound rows -------------------------------------------------------------------------

struct SummaryRow {
  const char* run_id;
  const char* position;
  int64_t train_length;
  int64_t seed;
  const char* mode;
  int64_t stride;
  int64_t eval_length;
  double perplexity;
  double nll_sum;
  int64_t scored_tokens;
  double bits_per_byte;
  double seconds;
  const char* status;
};

H5::CompType summary_type() {
  const H5::StrType text = string_type();
  const auto& i64 = H5::PredType::NATIVE_INT64;
  const auto& f64 = H5::PredType::NATIVE_DOUBLE;
  H5::CompType type(sizeof(SummaryRow));
  type.insertMember("run_id", HOFFSET(SummaryRow, run_id), text);
  type.insertMember("position", HOFFSET(SummaryRow, position), text);
  type.insertMember("train_length", HOFFSET(SummaryRow, train_length), i64);
  type.insertMember("seed", HOFFSET(SummaryRow, seed), i64);
  type.insertMember("mode", HOFFSET(SummaryRow, mode), text);
  type.insertMember("stride", HOFFSET(SummaryRow, stride), i64);
  type.insertMember("eval_length", HOFFSET(SummaryRow, eval_length), i64);
  type.insertMember("perplexity", HOFFSET(SummaryRow, perplexity), f64);
  type.insertMember("nll_sum", HOFFSET(SummaryRow, nll_sum), f64);
  type.insertMember("scored_tokens", HOFFSET(SummaryRow, scored_tokens), i64);
  type.insertMember("bits_per_byte", HOFFSET(SummaryRow, bits_per_byte), f64);
  type.insertMember("seconds", HOFFSET(SummaryRow, seconds), f64);
  type.insertMember("status", HOFFSET(SummaryRow, status), text);
  return type;
}

SummaryRow summary_row(const PointRecord& p) {
  return {p.run_id.c_str(), p.position.c_str(), p.train_length,  p.seed,    p.mode.c_str(),
          p.stride,         p.eval_length,      p.perplexity,    p.nll_sum, p.scored_tokens,
          p.bits_per_byte,  p.seconds,          p.status.c_str()};
}

struct FailureRow {
  int64_t length;
  const char* reason;
};

H5::CompType failure_type() {
  H5::CompType type(sizeof(FailureRow));
  type.insertMember("length", HOFFSET(FailureRow, length), H5::PredType::NATIVE_INT64);
  type.insertMember("reason", HOFFSET(FailureRow, reason), string_type());
  return type;
}

// A row of /position_bins: one bin of the point in row `summary_row` of /summary.
struct BinRow {
  int64_t summary_row;
  int64_t begin;
  int64_t end;
  double nll_sum;
  int64_t scored_tokens;
};

H5::CompType bin_type() {
  const auto& i64 = H5::PredType::NATIVE_INT64;
  H5::CompType type(sizeof(BinRow));
  type.insertMember("summary_row", HOFFSET(BinRow, summary_row), i64);
  type.insertMember("begin", HOFFSET(BinRow, begin), i64);
  type.insertMember("end", HOFFSET(BinRow, end), i64);
  type.insertMember("nll_sum", HOFFSET(BinRow, nll_sum), H5::PredType::NATIVE_DOUBLE);
  type.insertMember("scored_tokens", HOFFSET(BinRow, scored_tokens), i64);
  return type;
}

// A row of /retrieval: one depth of the retrieval point in row `summary_row` of /summary.
struct RetrievalRow {
  int64_t summary_row = 0;
  double depth = 0;
  int64_t trials = 0;
  int64_t correct = 0;
  double answer_nll = 0;
  int64_t answer_tokens = 0;
  double placed_depth = NAN;  // both NaN where the file's /retrieval predates them
  double same_as = NAN;
};

// The columns of /retrieval; `placement` adds placed_depth and same_as, which older
// files lack: read without them, those rows keep NaN.
H5::CompType retrieval_type(bool placement = true) {
  const auto& i64 = H5::PredType::NATIVE_INT64;
  const auto& f64 = H5::PredType::NATIVE_DOUBLE;
  H5::CompType type(sizeof(RetrievalRow));
  type.insertMember("summary_row", HOFFSET(RetrievalRow, summary_row), i64);
  type.insertMember("depth", HOFFSET(RetrievalRow, depth), f64);
  type.insertMember("trials", HOFFSET(RetrievalRow, trials), i64);
  type.insertMember("correct", HOFFSET(RetrievalRow, correct), i64);
  type.insertMember("answer_nll", HOFFSET(RetrievalRow, answer_nll), f64);
  type.insertMember("answer_tokens", HOFFSET(RetrievalRow, answer_tokens), i64);
  if (placement) {
    type.insertMember("placed_depth", HOFFSET(RetrievalRow, placed_depth), f64);
    type.insertMember("same_as", HOFFSET(RetrievalRow, same_as), f64);
  }
  return type;
}

// Whether the file's /retrieval has the placement columns.
bool retrieval_has_placement(const H5::DataSet& dataset) {
  const H5::CompType stored = dataset.getCompType();
  for (int i = 0; i < stored.getNmembers(); ++i)
    if (stored.getMemberName(unsigned(i)) == "placed_depth") return true;
  return false;
}

// /retrieval of an older file, rewritten with the placement columns (its rows NaN there), so that
// the rows appended next keep theirs.
void add_retrieval_placement(H5::H5File& file) {
  H5::DataSet old = file.openDataSet("retrieval");
  if (retrieval_has_placement(old)) return;
  hsize_t count = 0;
  old.getSpace().getSimpleExtentDims(&count);
  std::vector<RetrievalRow> rows(count);
  if (count > 0) old.read(rows.data(), retrieval_type(false));
  old.close();
  file.unlink("retrieval");
  H5::DataSet dataset = create_rows(file, "retrieval", retrieval_type());
  append_rows(dataset, retrieval_type(), rows.data(), rows.size());
}

// A row of /longppl: LongPPL of the non-overlapping point in row `summary_row` of /summary.
struct LongPplRow {
  int64_t summary_row;
  int64_t short_length;
  int64_t candidates;
  int64_t key_tokens;
  double key_nll_sum;
  const char* status;
};

H5::CompType longppl_type() {
  const auto& i64 = H5::PredType::NATIVE_INT64;
  H5::CompType type(sizeof(LongPplRow));
  type.insertMember("summary_row", HOFFSET(LongPplRow, summary_row), i64);
  type.insertMember("short_length", HOFFSET(LongPplRow, short_length), i64);
  type.insertMember("candidates", HOFFSET(LongPplRow, candidates), i64);
  type.insertMember("key_tokens", HOFFSET(LongPplRow, key_tokens), i64);
  type.insertMember("key_nll_sum", HOFFSET(LongPplRow, key_nll_sum), H5::PredType::NATIVE_DOUBLE);
  type.insertMember("status", HOFFSET(LongPplRow, status), string_type());
  return type;
}

// A row of /attention_profile: one layer, head and distance bin of the attention-profile point
// in row `summary_row` of /summary.
struct ProfileRow {
  int64_t summary_row;
  int64_t layer;
  int64_t head;
  int64_t begin;
  int64_t end;
  double mass;
  double entropy;
  double sink;
};

H5::CompType profile_type() {
  const auto& i64 = H5::PredType::NATIVE_INT64;
  const auto& f64 = H5::PredType::NATIVE_DOUBLE;
  H5::CompType type(sizeof(ProfileRow));
  type.insertMember("summary_row", HOFFSET(ProfileRow, summary_row), i64);
  type.insertMember("layer", HOFFSET(ProfileRow, layer), i64);
  type.insertMember("head", HOFFSET(ProfileRow, head), i64);
  type.insertMember("begin", HOFFSET(ProfileRow, begin), i64);
  type.insertMember("end", HOFFSET(ProfileRow, end), i64);
  type.insertMember("mass", HOFFSET(ProfileRow, mass), f64);
  type.insertMember("entropy", HOFFSET(ProfileRow, entropy), f64);
  type.insertMember("sink", HOFFSET(ProfileRow, sink), f64);
  return type;
}

// A row of /inputs: what the point in row `summary_row` of /summary was computed from.
struct InputsRow {
  int64_t summary_row;
  const char* model;
  const char* data_key;
  const char* corpus;
  const char* tokens;
  const char* reference;
};

H5::CompType inputs_type() {
  const H5::StrType text = string_type();
  H5::CompType type(sizeof(InputsRow));
  type.insertMember("summary_row", HOFFSET(InputsRow, summary_row), H5::PredType::NATIVE_INT64);
  type.insertMember("model", HOFFSET(InputsRow, model), text);
  type.insertMember("data_key", HOFFSET(InputsRow, data_key), text);
  type.insertMember("corpus", HOFFSET(InputsRow, corpus), text);
  type.insertMember("tokens", HOFFSET(InputsRow, tokens), text);
  type.insertMember("reference", HOFFSET(InputsRow, reference), text);
  return type;
}

const char* const kEvalColumns[] = {"length",        "perplexity",    "nll_sum",
                                    "scored_tokens", "bits_per_byte", "seconds"};
const char* const kRetrievalColumns[] = {"length", "accuracy", "correct", "trials", "seconds"};
const char* const kProfileColumns[] = {"length", "queries", "seconds"};

// /runs/<id>/eval/<mode>, created with its empty columns on first use.
H5::Group eval_group(const H5::Group& run, const std::string& mode) {
  if (!run.nameExists("eval")) run.createGroup("eval");
  H5::Group eval = run.openGroup("eval");
  if (eval.nameExists(mode)) return eval.openGroup(mode);
  H5::Group group = eval.createGroup(mode);
  const std::vector<std::string> columns =
      is_retrieval_mode(mode) ? std::vector<std::string>(std::begin(kRetrievalColumns), std::end(kRetrievalColumns))
      : is_profile_mode(mode) ? std::vector<std::string>(std::begin(kProfileColumns), std::end(kProfileColumns))
                              : std::vector<std::string>(std::begin(kEvalColumns), std::end(kEvalColumns));
  for (const auto& column : columns) {
    const bool integer = column == "length" || column == "scored_tokens" || column == "correct" ||
                         column == "trials" || column == "queries";
    create_rows(group, column, integer ? H5::PredType::NATIVE_INT64 : H5::PredType::NATIVE_DOUBLE);
  }
  create_rows(group, "failures", failure_type());
  return group;
}

void write_point(H5::H5File& file, const PointRecord& p) {
  H5::DataSet summary = file.openDataSet("summary");
  hsize_t summary_rows = 0;
  summary.getSpace().getSimpleExtentDims(&summary_rows);
  const SummaryRow row = summary_row(p);
  append_rows(summary, summary_type(), &row, 1);
  if (!p.by_position.empty()) {  // one dataset for the whole file: a few bytes a bin
    if (!file.nameExists("position_bins")) create_rows(file, "position_bins", bin_type());
    std::vector<BinRow> rows;
    for (const auto& b : p.by_position)
      rows.push_back({int64_t(summary_rows), b.begin, b.end, b.nll_sum, b.scored_tokens});
    H5::DataSet dataset = file.openDataSet("position_bins");
    append_rows(dataset, bin_type(), rows.data(), rows.size());
  }
  if (!p.retrieval.empty()) {
    if (!file.nameExists("retrieval")) create_rows(file, "retrieval", retrieval_type());
    add_retrieval_placement(file);
    std::vector<RetrievalRow> rows;
    for (const auto& c : p.retrieval)
      rows.push_back({int64_t(summary_rows), c.depth, c.trials, c.correct, c.answer_nll,
                      c.answer_tokens, c.placed_depth, c.same_as});
    H5::DataSet dataset = file.openDataSet("retrieval");
    append_rows(dataset, retrieval_type(), rows.data(), rows.size());
  }
  if (p.longppl) {
    if (!file.nameExists("longppl")) create_rows(file, "longppl", longppl_type());
    const LongPplRecord& l = *p.longppl;
    const LongPplRow row{int64_t(summary_rows), l.short_length, l.candidates,
                         l.key_tokens, l.key_nll_sum, l.status.c_str()};
    H5::DataSet dataset = file.openDataSet("longppl");
    append_rows(dataset, longppl_type(), &row, 1);
  }
  if (!p.attention_profile.empty()) {
    if (!file.nameExists("attention_profile")) create_rows(file, "attention_profile", profile_type());
    std::vector<ProfileRow> rows;
    for (const auto& c : p.attention_profile)
      rows.push_back({int64_t(summary_rows), c.layer, c.head, c.begin, c.end, c.mass, c.entropy, c.sink});
    H5::DataSet dataset = file.openDataSet("attention_profile");
    append_rows(dataset, profile_type(), rows.data(), rows.size());
  }

  if (p.inputs.recorded()) {
    if (!file.nameExists("inputs")) create_rows(file, "inputs", inputs_type());
    const EvalInputs& i = p.inputs;
    const InputsRow row{int64_t(summary_rows), i.model.c_str(), i.data_key.c_str(), i.corpus.c_str(),
                        i.tokens.c_str(), i.reference.c_str()};
    H5::DataSet dataset = file.openDataSet("inputs");
    append_rows(dataset, inputs_type(), &row, 1);
  }

  H5::Group group = eval_group(file.openGroup("runs").openGroup(p.run_id), p.mode);
  if (!p.ok()) {
    const FailureRow failure{p.eval_length, p.status.c_str()};
    H5::DataSet failures = group.openDataSet("failures");
    append_rows(failures, failure_type(), &failure, 1);
    return;
  }
  const auto append_int = [&](const char* name, int64_t value) {
    H5::DataSet dataset = group.openDataSet(name);
    append_rows(dataset, H5::PredType::NATIVE_INT64, &value, 1);
  };
  const auto append_double = [&](const char* name, double value) {
    H5::DataSet dataset = group.openDataSet(name);
    append_rows(dataset, H5::PredType::NATIVE_DOUBLE, &value, 1);
  };
  append_int("length", p.eval_length);
  if (is_retrieval_mode(p.mode)) {
    const RetrievalCell total = retrieval_totals(p.retrieval);
    append_double("accuracy", total.trials > 0 ? double(total.correct) / double(total.trials) : NAN);
    append_int("correct", total.correct);
    append_int("trials", total.trials);
    append_double("seconds", p.seconds);
    return;
  }
  if (is_profile_mode(p.mode)) {
    append_int("queries", p.scored_tokens);
    append_double("seconds", p.seconds);
    return;
  }
  append_double("perplexity", p.perplexity);
  append_double("nll_sum", p.nll_sum);
  append_int("scored_tokens", p.scored_tokens);
  append_double("bits_per_byte", p.bits_per_byte);
  append_double("seconds", p.seconds);
}

// The rows of a per-point table (/position_bins, /retrieval) by their /summary row, each made
// into a record by `record`; empty when the file has no such table (written before it existed).
template <typename Row, typename Record>
std::map<int64_t, std::vector<Record>> read_by_summary_row(H5::H5File& file, const char* name,
                                                           const H5::CompType& type,
                                                           Record (*record)(const Row&)) {
  std::map<int64_t, std::vector<Record>> out;
  if (!file.nameExists(name)) return out;
  H5::DataSet dataset = file.openDataSet(name);
  hsize_t count = 0;
  dataset.getSpace().getSimpleExtentDims(&count);
  std::vector<Row> rows(count);
  if (count > 0) dataset.read(rows.data(), type);
  for (const auto& r : rows) out[r.summary_row].push_back(record(r));
  // Variable-length strings (/longppl's status) were allocated by the read.
  if (count > 0) H5::DataSet::vlenReclaim(rows.data(), type, dataset.getSpace());
  return out;
}

PositionBin bin_record(const BinRow& r) { return {r.begin, r.end, r.nll_sum, r.scored_tokens}; }

RetrievalCell retrieval_record(const RetrievalRow& r) {
  return {r.depth, r.trials, r.correct, r.answer_nll, r.answer_tokens, r.placed_depth, r.same_as};
}

ProfileCell profile_record(const ProfileRow& r) {
  return {r.layer, r.head, r.begin, r.end, r.mass, r.entropy, r.sink};
}

LongPplRecord longppl_record(const LongPplRow& r) {
  return {r.short_length, r.candidates, r.key_tokens, r.key_nll_sum, r.status};
}

EvalInputs inputs_record(const InputsRow& r) { return {r.model, r.data_key, r.corpus, r.tokens, r.reference}; }

void write_run(H5::H5File& file, const RunRecord& r) {
  H5::Group runs = file.openGroup("runs");
  if (!runs.nameExists(r.run_id)) runs.createGroup(r.run_id);
  H5::Group run = runs.openGroup(r.run_id);
  set_attribute(run, "config", r.config);
  set_attribute(run, "grid_point", r.grid_point);
  set_attribute(run, "point_index", r.point_index);
  set_attribute(run, "position", r.position);
  set_attribute(run, "train_length", r.train_length);
  set_attribute(run, "seed", r.seed);
  set_attribute(run, "extrap_version", r.extrap_version);
  set_attribute(run, "git_commit", r.git_commit);
  set_attribute(run, "machine", r.machine);
  set_attribute(run, "runtime", r.runtime);
  set_attribute(run, "start_time", r.start_time);
  set_attribute(run, "end_time", r.end_time);
  set_attribute(run, "tokens_per_second", r.tokens_per_second);
  set_attribute(run, "peak_memory_bytes", r.peak_memory_bytes);
  set_attribute(run, "num_parameters", r.num_parameters);
  set_attribute(run, "train_tokens", r.train_tokens);
  set_attribute(run, "vocab_size", r.vocab_size);
  set_attribute(run, "status", r.status);
  if (!r.released.empty()) set_attribute(run, "released", r.released);
  write_curve(run, "train_loss", r.train_loss);
  write_curve(run, "valid_loss", r.valid_loss);
}

RunRecord read_run(const H5::Group& run, const std::string& id) {
  RunRecord r;
  r.run_id = id;
  r.config = string_attribute(run, "config");
  r.grid_point = string_attribute(run, "grid_point");
  r.point_index = int_attribute(run, "point_index");
  r.position = string_attribute(run, "position");
  r.train_length = int_attribute(run, "train_length");
  r.seed = int_attribute(run, "seed");
  r.extrap_version = string_attribute(run, "extrap_version");
  r.git_commit = string_attribute(run, "git_commit");
  r.machine = string_attribute(run, "machine");
  r.runtime = string_attribute(run, "runtime");
  r.start_time = string_attribute(run, "start_time");
  r.end_time = string_attribute(run, "end_time");
  r.tokens_per_second = double_attribute(run, "tokens_per_second");
  r.peak_memory_bytes = int_attribute(run, "peak_memory_bytes");
  r.num_parameters = int_attribute(run, "num_parameters");
  r.train_tokens = int_attribute(run, "train_tokens");
  r.vocab_size = int_attribute(run, "vocab_size");
  r.status = string_attribute(run, "status");
  r.released = string_attribute(run, "released");
  r.train_loss = read_curve(run, "train_loss");
  r.valid_loss = read_curve(run, "valid_loss");
  return r;
}

void write_header(H5::H5File& file, const SweepHeader& h) {
  set_attribute(file, "format_version", kResultsFormat);
  set_attribute(file, "sweep_name", h.sweep_name);
  set_attribute(file, "sweep_spec", h.sweep_spec);
  set_attribute(file, "spec_hash", h.spec_hash);
  set_attribute(file, "sweep_file", h.sweep_file);
  set_attribute(file, "shard", h.shard);
  set_attribute(file, "extrap_version", h.extrap_version);
  set_attribute(file, "git_commit", h.git_commit);
  set_attribute(file, "created", h.created);
  set_attribute(file, "spec_time", h.spec_time.empty() ? h.created : h.spec_time);
}

}  // namespace

std::string eval_mode_name(int64_t length, int64_t stride, const std::string& variant) {
  const std::string window =
      stride <= 0 || stride >= length ? "nonoverlapping" : "sliding_" + std::to_string(stride);
  return variant.empty() ? window : window + "+" + variant;
}

std::string retrieval_mode_name(RetrievalTask task, const std::string& variant) {
  const std::string mode = "retrieval_" + enum_name(task);
  return variant.empty() ? mode : mode + "+" + variant;
}

bool is_retrieval_mode(const std::string& mode) { return mode.rfind("retrieval_", 0) == 0; }

bool is_profile_mode(const std::string& mode) { return mode == kProfileMode; }

std::string streaming_mode_name(int64_t sinks, int64_t cache) {
  return "streaming_" + std::to_string(sinks) + "_" + std::to_string(cache);
}

// --- the lock ------------------------------------------------------------------------------

namespace {

// The file a results path names, its symbolic links followed (a dangling link names the file it
// would make): what is written and locked.
std::string results_target(const std::string& path) {
  fs::path p = path;
  std::error_code error;
  for (int hops = 0; hops < 40 && fs::is_symlink(p, error); ++hops) {
    const fs::path target = fs::read_symlink(p, error);
    if (error) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return p.lexically_normal().string();
}

// The file a results path names (results_target), refused before its lock file is made beside
// it: a directory, a file in a run directory (whose own files it could overwrite:
// RUN/metrics.jsonl), an existing non-empty file that HDF5 does not recognise as its own.
std::string checked_results_target(const std::string& path) {
  std::string target = results_target(path);
  std::error_code error;
  if (fs::is_directory(target, error)) throw ConfigError(path + ": is a directory; give a results file name");
  if (const fs::path run = enclosing_run_directory(target); !run.empty())
    throw ConfigError(path + ": lies inside the run directory " + run.string() +
                      ", whose own files it could overwrite; write results outside the run");
  if (fs::exists(target, error) && fs::file_size(target, error) > 0 && H5Fis_hdf5(target.c_str()) <= 0)
    throw ConfigError(path + ": exists and is not an HDF5 results file; it is left as it is: remove it or "
                      "choose another --out");
  return target;
}

}  // namespace

ResultsLock::ResultsLock(const std::string& results_path)
    : lock_(checked_results_target(results_path) + ".lock", results_path, "written",
            "wait for it to finish or choose another --out") {}

// --- the store -----------------------------------------------------------------------------

ResultsStore ResultsStore::open(const std::string& path) {
  if (!fs::exists(path)) throw ConfigError(path + ": no such results file");
  ResultsStore store(results_target(path));
  store.load();
  return store;
}

namespace {

// The bytes of an in-memory (core driver) HDF5 file, as they would be on disk.
std::vector<char> file_image(H5::H5File& file, const std::string& path) {
  const ssize_t size = H5Fget_file_image(file.getId(), nullptr, 0);
  if (size <= 0) throw std::runtime_error(path + ": HDF5 gave no file image");
  std::vector<char> image(static_cast<size_t>(size));
  if (H5Fget_file_image(file.getId(), image.data(), image.size()) != size)
    throw std::runtime_error(path + ": HDF5 file image changed size");
  return image;
}

}  // namespace

ResultsStore ResultsStore::open_or_create(const std::string& given, const SweepHeader& header) {
  const std::string path = results_target(given);
  const fs::path tmp = path + ".tmp";
  fs::remove(tmp);  // a writer killed mid-change; the file itself is whole
  if (!fs::exists(path)) {
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
    // Made in memory and written as commit() writes a change: HDF5 never writes to disk, so
    // a full disk is an ordinary write error naming the file.
    std::vector<char> image;
    try {
      H5::FileAccPropList access;
      access.setCore(1 << 16, false);
      H5::H5File file(tmp.string(), H5F_ACC_TRUNC, H5::FileCreatPropList::DEFAULT, access);
      write_header(file, header);
      file.createGroup("runs");
      create_rows(file, "summary", summary_type());
      file.flush(H5F_SCOPE_GLOBAL);
      image = file_image(file, path);
      file.close();
    } catch (const H5::Exception& e) {
      rethrow_hdf5(path, e);
    }
    write_file_atomic(path, std::string_view(image.data(), image.size()), tmp);
  }
  return open(path);
}

void ResultsStore::load() {
  try {
    H5::H5File file(path_, H5F_ACC_RDONLY);
    if (!file.attrExists("format_version") || !file.nameExists("summary") ||
        !file.nameExists("runs"))
      throw ConfigError(path_ +
                        ": not an extrap results file (no format_version, /runs or /summary)");
    const int64_t version = int_attribute(file, "format_version");
    if (version != kResultsFormat)
      throw ConfigError(path_ + ": results format version " + std::to_string(version) +
                        ", this extrap reads version " + std::to_string(kResultsFormat));
    header_.sweep_name = string_attribute(file, "sweep_name");
    header_.sweep_spec = string_attribute(file, "sweep_spec");
    header_.spec_hash = string_attribute(file, "spec_hash");
    header_.sweep_file = string_attribute(file, "sweep_file");
    header_.shard = string_attribute(file, "shard");
    header_.extrap_version = string_attribute(file, "extrap_version");
    header_.git_commit = string_attribute(file, "git_commit");
    header_.created = string_attribute(file, "created");
    header_.spec_time = string_attribute(file, "spec_time");
    if (header_.spec_time.empty()) header_.spec_time = header_.created;  // extrap 0.11 and before

    runs_.clear();
    H5::Group runs = file.openGroup("runs");
    for (hsize_t i = 0; i < runs.getNumObjs(); ++i) {
      const std::string id = runs.getObjnameByIdx(i);
      runs_[id] = read_run(runs.openGroup(id), id);
    }

    points_.clear();
    point_keys_.clear();
    H5::DataSet summary = file.openDataSet("summary");
    H5::DataSpace space = summary.getSpace();
    hsize_t count = 0;
    space.getSimpleExtentDims(&count);
    std::vector<SummaryRow> rows(count);
    const H5::CompType type = summary_type();
    if (count > 0) {
      summary.read(rows.data(), type);
      const auto bins = read_by_summary_row(file, "position_bins", bin_type(), bin_record);
      const bool placement = !file.nameExists("retrieval") || retrieval_has_placement(file.openDataSet("retrieval"));
      const auto retrieval =
          read_by_summary_row(file, "retrieval", retrieval_type(placement), retrieval_record);
      const auto longppl = read_by_summary_row(file, "longppl", longppl_type(), longppl_record);
      const auto profiles =
          read_by_summary_row(file, "attention_profile", profile_type(), profile_record);
      const auto inputs = read_by_summary_row(file, "inputs", inputs_type(), inputs_record);
      for (const auto& r : rows) {
        PointRecord p;
        p.run_id = r.run_id;
        p.position = r.position;
        p.train_length = r.train_length;
        p.seed = r.seed;
        p.mode = r.mode;
        p.stride = r.stride;
        p.eval_length = r.eval_length;
        p.perplexity = r.perplexity;
        p.nll_sum = r.nll_sum;
        p.scored_tokens = r.scored_tokens;
        p.bits_per_byte = r.bits_per_byte;
        p.seconds = r.seconds;
        p.status = r.status;
        const auto found = bins.find(int64_t(points_.size()));
        if (found != bins.end()) p.by_position = found->second;
        const auto cells = retrieval.find(int64_t(points_.size()));
        if (cells != retrieval.end()) p.retrieval = cells->second;
        const auto scored = longppl.find(int64_t(points_.size()));
        if (scored != longppl.end()) {
          if (scored->second.size() != 1)
            throw ConfigError(path_ + ": /longppl has " + std::to_string(scored->second.size()) +
                              " rows for row " + std::to_string(points_.size()) +
                              " of /summary; a point has at most one");
          p.longppl = scored->second.front();
        }
        const auto profile = profiles.find(int64_t(points_.size()));
        if (profile != profiles.end()) p.attention_profile = profile->second;
        if (const auto from = inputs.find(int64_t(points_.size())); from != inputs.end()) {
          if (from->second.size() != 1)
            throw ConfigError(path_ + ": /inputs has " + std::to_string(from->second.size()) + " rows for row " +
                              std::to_string(points_.size()) + " of /summary; a point has one");
          p.inputs = from->second.front();
        }
        point_keys_[{p.run_id, p.mode, p.eval_length}] = points_.size();
        points_.push_back(std::move(p));
      }
      H5::DataSet::vlenReclaim(rows.data(), type, space);
    }
  } catch (const H5::FileIException& e) {
    throw ConfigError(path_ + ": cannot read it as HDF5 (" + e.getDetailMsg() + ")");
  } catch (const H5::Exception& e) {
    rethrow_hdf5(path_, e);
  }
}

const RunRecord* ResultsStore::run(const std::string& run_id) const& {
  const auto found = runs_.find(run_id);
  return found == runs_.end() ? nullptr : &found->second;
}

bool ResultsStore::has_point(const std::string& run_id, const std::string& mode,
                             int64_t eval_length) const {
  return point_keys_.count({run_id, mode, eval_length}) > 0;
}

const PointRecord* ResultsStore::point(const std::string& run_id, const std::string& mode,
                                       int64_t eval_length) const& {
  const auto found = point_keys_.find({run_id, mode, eval_length});
  return found == point_keys_.end() ? nullptr : &points_[found->second];
}

void ResultsStore::commit(const std::function<void(H5::H5File&)>& change) {
  // The change is made to an in-memory copy (HDF5's core driver, no backing store), whose image
  // is then written by write_file_atomic: HDF5 itself never writes to disk, so a full disk is
  // an ordinary write error naming the file, and PATH keeps every earlier result.
  // No backing store: PATH is only read. HDF5's own file lock is off for this open, so that
  // readers holding PATH open do not block the writer (ResultsLock is the writers' lock).
  std::vector<char> image;
  try {
    H5::FileAccPropList access;
    access.setCore(1 << 20, false);
    if (H5Pset_file_locking(access.getId(), false, true) < 0)
      throw std::runtime_error(path_ + ": cannot turn off HDF5's file locking for the writer");
    H5::H5File file(path_, H5F_ACC_RDWR, H5::FileCreatPropList::DEFAULT, access);
    change(file);
    file.flush(H5F_SCOPE_GLOBAL);
    image = file_image(file, path_);
    file.close();
  } catch (const H5::Exception& e) {
    rethrow_hdf5(path_, e);
  }
  write_file_atomic(path_, std::string_view(image.data(), image.size()), path_ + ".tmp");
}

void ResultsStore::write(const std::vector<RunRecord>& runs,
                         const std::vector<PointRecord>& points) {
  std::set<std::tuple<std::string, std::string, int64_t>> adding;
  for (const auto& p : points) {
    const bool run_known = runs_.count(p.run_id) > 0 ||
                           std::any_of(runs.begin(), runs.end(),
                                       [&](const RunRecord& r) { return r.run_id == p.run_id; });
    if (!run_known) throw std::logic_error("results: point for unknown run '" + p.run_id + "'");
    if (has_point(p.run_id, p.mode, p.eval_length) ||
        !adding.insert({p.run_id, p.mode, p.eval_length}).second)
      throw std::logic_error("results: point (" + p.run_id + ", " + p.mode + ", " +
                             std::to_string(p.eval_length) + ") is already recorded");
  }
  commit([&](H5::H5File& file) {
    for (const auto& r : runs) write_run(file, r);
    for (const auto& p : points) write_point(file, p);
  });
  for (const auto& r : runs) runs_[r.run_id] = r;
  for (const auto& p : points) {
    point_keys_[{p.run_id, p.mode, p.eval_length}] = points_.size();
    points_.push_back(p);
  }
}

void ResultsStore::grow(const SweepHeader& header, const std::vector<RunRecord>& runs) {
  commit([&](H5::H5File& file) {
    set_attribute(file, "sweep_spec", header.sweep_spec);
    set_attribute(file, "spec_hash", header.spec_hash);
    set_attribute(file, "sweep_file", header.sweep_file);
    set_attribute(file, "spec_time", header.spec_time);
    for (const auto& r : runs) write_run(file, r);
  });
  header_.sweep_spec = header.sweep_spec;
  header_.spec_hash = header.spec_hash;
  header_.sweep_file = header.sweep_file;
  header_.spec_time = header.spec_time;
  for (const auto& r : runs) runs_[r.run_id] = r;
}

}  // namespace extrap
