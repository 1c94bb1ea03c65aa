# The report pools runs as seeds only when they are one configuration: analysis/report.py's
# method_labels() against labels written out by hand for grids that vary a method's options.
#
# Then what the report says of a results file as a whole, on tiny files written here with h5py:
# runs that failed before their model was built (0 parameters and vocabulary recorded: "not
# recorded", never a second tokenization), methods with different seeds and fewer runs than the
# grid has points (a partial merge of shards), and files it refuses to read; and that no
# function of the report or its checks is longer than 100 lines. Needs no extrap binary.
#
#   python tests/experiments/check_report_labels.py SOURCE_DIR
import ast
import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

source_dir = sys.argv[1]
sys.path.insert(0, os.path.join(source_dir, "analysis"))
import report  # noqa: E402


def run(position, grid):
    return {"position": position, "grid_point": grid}


runs = {
    "00": run("rotary", "{position: {name: rotary}, train.seq_len: 32, train.seed: 1}"),
    "01": run("rotary", "{position: {name: rotary, randomize_max: 512}, train.seq_len: 32, train.seed: 1}"),
    "02": run("rotary", "{position: {name: rotary}, train.seq_len: 32, train.seed: 2}"),
    "03": run("learned", "{position: {name: learned, max_length: 512}, train.seq_len: 32, train.seed: 1}"),
    "04": run("learned", "{position: {name: learned, max_length: 512}, train.seq_len: 32, train.seed: 2}"),
    "05": run("fire", "{position: {name: fire, init_L: 32}, train.seq_len: 32, train.seed: 1}"),
    "06": run("fire", "{position: {name: fire, init_L: 64, mlp_width: 8}, train.seq_len: 32, train.seed: 1}"),
    "07": run("alibi", "{position: alibi, model.layers: 4, train.seed: 1}"),
    # A layers axis: the run's position names its pattern's methods and attention options; two
    # patterns that give one position (their methods' options differ) get their names added.
    "08": run("rotary (sink)", "{layers: {pattern: [rs], kinds: {rs: {position: rotary, attention: {sink: true}}}}, train.seed: 1}"),
    "09": run("rotary (sink)", "{layers: {pattern: [rs], kinds: {rs: {position: rotary, attention: {sink: true}}}}, train.seed: 2}"),
    "10": run("p_rope", "{layers: {pattern: [p50], kinds: {p50: {position: {name: p_rope, keep: 0.5}}}}, train.seed: 1}"),
    "11": run("p_rope", "{layers: {pattern: [p75], kinds: {p75: {position: {name: p_rope, keep: 0.75}}}}, train.seed: 1}"),
    "12": run("rotary (window 8) x3, none", "{layers: {pattern: [swa, swa, swa, nope], kinds: {swa: {position: rotary, attention: {window: 8}}, nope: {position: none}}}, train.seed: 1}"),
}
expected = {
    "00": "rotary", "01": "rotary (randomize_max=512)", "02": "rotary",
    "03": "learned", "04": "learned",  # options shared by every learned run: not in the label
    "05": "fire (init_L=32)", "06": "fire (init_L=64, mlp_width=8)",
    "07": "alibi (layers=4)",
    "08": "rotary (sink)", "09": "rotary (sink)",
    "10": "p_rope (layers=p50)", "11": "p_rope (layers=p75)",
    "12": "rotary (window 8) x3, none",
}
labels = report.method_labels(runs)
assert labels == expected, labels
print("labels ok")


# === what a results file says about itself: tiny files in the documented schema ============
# (docs/formats.md, core/results/results_store.h), written here with h5py, then reported.
STR = h5py.string_dtype("utf-8")
SUMMARY = np.dtype([("run_id", STR), ("position", STR), ("train_length", "<i8"), ("seed", "<i8"),
                    ("mode", STR), ("stride", "<i8"), ("eval_length", "<i8"), ("perplexity", "<f8"),
                    ("nll_sum", "<f8"), ("scored_tokens", "<i8"), ("bits_per_byte", "<f8"),
                    ("seconds", "<f8"), ("status", STR)])
BINS = np.dtype([("summary_row", "<i8"), ("begin", "<i8"), ("end", "<i8"), ("nll_sum", "<f8"),
                 ("scored_tokens", "<i8")])
SPEC = "name: tiny\ngrid:\n  position: [{name: alibi}, {name: rotary}]\n  train.seed: [1, 2]\n"
FAILED = "failed: validation needs 17 tokens; the validation split has 0"


def tiny_run(position, seed, status="complete", tokenizer="tokenizer: byte"):
    """A run's attributes as a sweep records them; a failed run's model was never built: its
    num_parameters, vocab_size and train_tokens are 0."""
    done = status == "complete"
    return {"config": "data: {path: corpus, %s}\nmodel: {layers: 1, d_model: 32, heads: 2, d_ffn: 64}\n"
                      "train: {seq_len: 16, batch_tokens: 256, steps: 40}\n" % tokenizer,
            "grid_point": "{position: {name: %s}, train.seed: %d}" % (position, seed),
            "point_index": (2 if position == "rotary" else 0) + seed - 1, "position": position,
            "train_length": 16, "seed": seed, "extrap_version": "0.11.0", "git_commit": "synthetic",
            "tokens_per_second": 90000.0 if done else math.nan, "peak_memory_bytes": 2**27 if done else 0,
            "num_parameters": 16832 if done else 0, "vocab_size": 257 if done else 0,
            "train_tokens": 10240 if done else 0, "status": status}


def write_tiny(path, runs, spec=SPEC):
    """A results file of `runs` (run_id -> attributes), each evaluated at 16 and 32 with
    non-overlapping windows (a failed run's points failed with it)."""
    rows = []
    for run_id, run in runs.items():
        for length in (16, 32):
            ok = run["status"] == "complete"
            ppl = 20.0 + run["seed"] + length / 16.0
            rows.append((run_id, run["position"], 16, run["seed"], "nonoverlapping", length, length,
                         ppl if ok else math.nan, math.log(ppl) * 512 if ok else math.nan, 512 if ok else 0,
                         4.5 if ok else math.nan, 0.01, "ok" if ok else run["status"]))
    with h5py.File(path, "w") as f:
        for key, value in {"format_version": 1, "sweep_name": "tiny", "sweep_spec": spec,
                           "spec_hash": "0123456789abcdef", "extrap_version": "0.11.0",
                           "git_commit": "synthetic", "created": "2026-01-01T00:00:00Z"}.items():
            f.attrs[key] = value
        group = f.create_group("runs")
        for run_id, run in runs.items():
            g = group.create_group(run_id)
            for key, value in run.items():
                g.attrs[key] = value
            curve = np.array([[20.0, 3.5], [40.0, 3.1]]) if run["status"] == "complete" else np.zeros((0, 2))
            g["train_loss"], g["valid_loss"] = curve, curve
        f.create_dataset("summary", data=np.array(rows, dtype=SUMMARY), maxshape=(None,), chunks=(64,))


def report_of(work, name, runs, spec=SPEC):
    """report.md of a tiny file of `runs`."""
    path = os.path.join(work, name + ".h5")
    write_tiny(path, runs, spec)
    with open(report.write_report(path, os.path.join(work, name))) as f:
        return f.read()


def table_row(md, section, method):
    """The cells of `method`'s row in the first table of `section` ("## What was trained")."""
    part = md.split(section + "\n", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in part.splitlines() if line.startswith("| %s |" % method))
    return [c.strip() for c in row.strip("|").split("|")]


FAILED_RUNS = {"alibi-seed1": tiny_run("alibi", 1), "alibi-seed2": tiny_run("alibi", 2, FAILED),
               "rotary-seed1": tiny_run("rotary", 1, FAILED), "rotary-seed2": tiny_run("rotary", 2, FAILED)}


def check_failed_parameters(work):
    """A run that failed before its model was built recorded 0 parameters: not a number of
    the model. Its method's parameters are the recorded ones, or "not recorded" (empty in the
    Training table)."""
    md = report_of(work, "failed", FAILED_RUNS)
    assert table_row(md, "## What was trained", "alibi")[1] == "16,832", md
    assert table_row(md, "## What was trained", "rotary")[1] == "not recorded", md
    assert table_row(md, "## Training", "alibi")[3] == "16832", md
    assert table_row(md, "## Training", "rotary")[3] == "", md


def check_unrecorded_vocabulary(work):
    """Such a run's vocabulary of 0 is not recorded either: one byte-level corpus stays one
    tokenization (one corpus, no bits-per-byte table); another tokenizer is another
    tokenization, its vocabulary recorded or not."""
    md = report_of(work, "vocabulary", FAILED_RUNS)
    assert "tokenise the text differently" not in md, md
    assert "Corpus `corpus`, byte tokens (vocabulary 257). Trained on" in md, md
    pieces = tiny_run("rotary", 1, FAILED, tokenizer="tokenizer: sentencepiece, tokenizer_model: spm.model")
    md = report_of(work, "pieces", {"alibi-seed1": tiny_run("alibi", 1), "alibi-seed2": tiny_run("alibi", 2, FAILED),
                                     "rotary-seed1": pieces})
    assert ("The runs tokenise the text differently (byte, 257 tokens; sentencepiece `spm.model`, ? tokens)"
            in md), md


def check_seeds_and_grid(work):
    """After merging some shards only, the methods' seeds differ and the file holds fewer runs
    than the grid has points: the header says so, per method; a whole file says neither."""
    runs = {"alibi-seed1": tiny_run("alibi", 1), "alibi-seed2": tiny_run("alibi", 2),
            "rotary-seed1": tiny_run("rotary", 1), "rotary-seed2": tiny_run("rotary", 2)}
    md = report_of(work, "whole", runs)
    assert ("\n4 runs (4 complete, 0 failed, 0 unfinished); 8 evaluation points. Seeds 1, 2: values are the "
            "mean ± sample standard deviation over seeds.\n") in md, md
    del runs["rotary-seed2"]
    md = report_of(work, "partial", runs)
    assert ("\n3 runs of the sweep's 4 grid points (3 complete, 0 failed, 0 unfinished; 1 not in this file: "
            "a shard not merged yet?); 6 evaluation points. Seeds differ between methods: alibi 1, 2; "
            "rotary 1 — each cell is the mean over the seeds its method has") in md, md
    assert "values are the mean ± sample standard deviation over seeds" not in md, md
    # A spec without a grid (or none at all) says nothing of grid points.
    assert "\n3 runs (3 complete" in report_of(work, "nogrid", runs, spec="name: tiny\n")


def check_refusals(work):
    """What is not a results file of this format is refused in one line naming it, before
    anything is read or written."""
    empty, text, other, future, tables, folder, missing = (os.path.join(work, n) for n in (
        "empty.h5", "text.h5", "other.h5", "future.h5", "tables.h5", "folder.h5", "missing.h5"))
    open(empty, "w").close()
    os.mkdir(folder)
    with open(text, "w") as f:
        f.write("run_id,perplexity\n")
    with h5py.File(other, "w") as f:
        f.create_group("summary")
    write_tiny(future, {"alibi-seed1": tiny_run("alibi", 1)})
    with h5py.File(future, "r+") as f:
        f.attrs["format_version"] = 2
    write_tiny(tables, {"alibi-seed1": tiny_run("alibi", 1)})
    with h5py.File(tables, "r+") as f:
        del f["summary"]
    for path, reason in ((empty, "the file is empty (0 bytes), not a results file"),
                         (text, "not an extrap results file (not an HDF5 file)"),
                         (other, "not an extrap results file (no format_version)"),
                         (future, "results format 2, this report reads format 1 (written by extrap 0.11.0)"),
                         (tables, "not an extrap results file (no /summary)"),
                         (folder, "it is a directory, not a results file"),
                         (missing, "no such file")):
        assert_refused(work, path, reason)


def assert_refused(work, path, reason):
    """report.py refuses `path` with exit 1 and the one line "report: cannot read PATH: REASON",
    writing nothing."""
    out = os.path.join(work, "refused")
    done = subprocess.run([sys.executable, os.path.join(source_dir, "analysis", "report.py"), path,
                           "--out", out], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "", (path, done)
    assert done.stderr == "report: cannot read %s: %s\n" % (path, reason), (path, done.stderr)
    assert not os.path.exists(out), path


def tampered(work, name, edit):
    """A tiny file of one run, alibi-seed1 at 16 and 32, whose /summary rows `edit` changed."""
    path = os.path.join(work, name + ".h5")
    write_tiny(path, {"alibi-seed1": tiny_run("alibi", 1)})
    with h5py.File(path, "r+") as f:
        rows = f["summary"][...]
        rows = edit(rows)
        del f["summary"]
        f.create_dataset("summary", data=rows, maxshape=(None,), chunks=(64,))
    return path


def set_cell(row, column, value):
    def edit(rows):
        rows[row][column] = value
        return rows
    return edit


def as_words(rows):
    """The rows with their perplexity written as a string."""
    words = np.empty(len(rows), dtype=[(n, STR if n == "perplexity" else rows.dtype[n]) for n in rows.dtype.names])
    for n in rows.dtype.names:
        words[n] = [repr(float(v)) for v in rows[n]] if n == "perplexity" else rows[n]
    return words


def check_tampered(work):
    """A file whose rows extrap cannot have written (changed by hand, merged by hand) is refused
    in one line naming the row, rather than pooled or tabled in silence."""
    nll = math.log(23.0) * 512  # row 1: perplexity 23 over 512 tokens
    cases = [
        (tampered(work, "edited", set_cell(1, "perplexity", 30.0)),
         "row 1 of /summary (run alibi-seed1, nonoverlapping at 32): perplexity 30.0 is not exp(nll_sum / "
         "scored_tokens) = %r; the file was changed after extrap wrote it" % math.exp(nll / 512)),
        (tampered(work, "tokenless", set_cell(1, "scored_tokens", 0)),
         "row 1 of /summary (run alibi-seed1, nonoverlapping at 32): status ok but nll_sum %r over "
         "scored_tokens 0" % nll),
        (tampered(work, "status", set_cell(1, "status", "fine")),
         "row 1 of /summary (run alibi-seed1, nonoverlapping at 32): status 'fine'; extrap writes 'ok' or "
         "'failed: <reason>'"),
        (tampered(work, "stranger", set_cell(1, "run_id", "alibi-seed3")),
         "row 1 of /summary is of run alibi-seed3, which /runs does not have"),
        (tampered(work, "twice", lambda rows: np.concatenate([rows, rows[1:2]])),
         "rows 1 and 2 of /summary are both run alibi-seed1, nonoverlapping at 32; the file was changed "
         "after extrap wrote it"),
        (tampered(work, "zero", set_cell(1, "eval_length", 0)),
         "row 1 of /summary (run alibi-seed1, nonoverlapping): lengths 16 and 0; both are at least 1"),
        (tampered(work, "words", as_words),
         "column perplexity of /summary holds object, not numbers"),
    ]
    binned = os.path.join(work, "binned.h5")
    write_tiny(binned, {"alibi-seed1": tiny_run("alibi", 1)})
    with h5py.File(binned, "r+") as f:  # row 0's bins hold its 512 tokens but 3/4 of its NLL
        nll = float(f["summary"][0]["nll_sum"])
        f["position_bins"] = np.array([(0, 0, 8, nll / 2, 256), (0, 8, 16, nll / 4, 256)], dtype=BINS)
    cases.append((binned, "row 0 of /summary (run alibi-seed1, nonoverlapping at 16): its /position_bins add "
                  "up to nll_sum %r over 512 tokens, the row says %r over 512; the file was changed after "
                  "extrap wrote it" % (nll / 2 + nll / 4, nll)))
    for path, reason in cases:
        assert_refused(work, path, reason)


def check_function_lengths():
    """No function of the report or of its checks is longer than 100 lines (a reader skips
    between named steps)."""
    for name in ("analysis/report.py", "tests/experiments/check_report.py",
                 "tests/experiments/check_report_labels.py"):
        with open(os.path.join(source_dir, name)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 100, (name, node.name, node.end_lineno - node.lineno + 1)


with tempfile.TemporaryDirectory() as work:
    check_failed_parameters(work)
    check_unrecorded_vocabulary(work)
    check_seeds_and_grid(work)
    check_refusals(work)
    check_tampered(work)
check_function_lengths()
print("report header ok")
