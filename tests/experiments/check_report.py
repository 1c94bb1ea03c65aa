# Checks a report written by `extrap report` against the results file it came from, computing
# every expected number here from the HDF5 rows (statistics.stdev, not the report's numpy):
# each table cell of mean ± sample standard deviation over seeds, and what each plot draws
# (axes, one curve per method, the points on each curve).
#
# Then the retrieval section, on two results files written here with h5py in the documented
# schema (core/results/results_store.h), the perplexity part shaped like the sweep's (alibi and learned,
# seeds 1 and 2, L = 16, lengths 16 and 32, non-overlapping and sliding_8, learned failing at
# 32): one with retrieval points (/summary rows of mode "retrieval_..." and their /retrieval
# rows), one without. Each passes the checks above; the retrieval one's accuracy table cells,
# heat maps and failures are computed here from the rows written, its perplexity sections are
# those of the file without retrieval, and the file without has no retrieval section.
#
#   python tests/experiments/check_report.py RESULTS.h5 REPORT_DIR SOURCE_DIR
import collections
import math
import os
import re
import statistics
import sys
import tempfile

import h5py
import matplotlib
import numpy as np
import yaml

matplotlib.use("Agg")
import matplotlib.figure  # noqa: E402

results, report_dir, source_dir = sys.argv[1:4]
sys.path.insert(0, os.path.join(source_dir, "analysis"))
import report  # noqa: E402


def fmt(value):  # the report's documented number format: 2 decimals below 100
    assert math.isfinite(value) and abs(value) < 100, value
    return "%.2f" % value


def is_retrieval(mode):  # a retrieval point's mode, as bytes from /summary
    return mode.startswith(b"retrieval_")


def is_profile(mode):  # an attention-profile point's mode, as bytes from /summary
    return mode == b"attention_profile"


# --- what each figure draws, captured as report.write_report saves it ---------------------
drawn = {}
panels = {}  # the loss-by-position figure: title -> {method: (x, y)}
heat_maps = {}  # retrieval figure name -> {panel title (method): what the panel shows}
original = matplotlib.figure.Figure.savefig


def capture(fig, path, *args, **kwargs):
    ax = fig.axes[0]
    if os.path.basename(path).startswith("position_"):
        for a in fig.axes:
            if a.get_title():
                panels[a.get_title()] = {l.get_label(): l.get_data() for l in a.get_lines()
                                         if not l.get_label().startswith("_")}
                assert a.get_xlabel() == "position in the window" and a.get_ylabel() == "mean NLL (nats)"
    if os.path.basename(path).startswith(("retrieval_", "attention_profile_")):
        heat_maps[os.path.basename(path)] = {
            a.get_title(): {
                "accuracy": a.images[0].get_array(), "clim": a.images[0].get_clim(),
                "lines": [l.get_xdata()[0] for l in a.get_lines()],
                "xticks": [t.get_text() for t in a.get_xticklabels()],
                "yticks": [t.get_text() for t in a.get_yticklabels()],
                "xlabel": a.get_xlabel(), "ylabel": a.get_ylabel(),
                "texts": {tuple(int(round(v)) for v in t.get_position()): t.get_text() for t in a.texts},
                "raw_texts": [(tuple(float(v) for v in t.get_position()), t.get_text()) for t in a.texts],
            } for a in fig.axes if a.get_title() and a.images}
    drawn[os.path.basename(path)] = {
        "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "title": ax.get_title(),
        "curves": {c.get_label(): c.lines[0].get_data() for c in ax.containers},
        "lines": collections.Counter(l.get_label() for l in ax.get_lines()
                                     if not l.get_label().startswith("_")),
        "linestyles": {l.get_label(): l.get_linestyle() for l in ax.get_lines()
                       if not l.get_label().startswith("_")},
        "points": [xy for l in ax.get_lines() for xy in zip(*l.get_data())],
        "ylim": ax.get_ylim(), "yscale": ax.get_yscale(),
    }
    return original(fig, path, *args, **kwargs)


matplotlib.figure.Figure.savefig = capture


def render(results_path, out):
    """Writes the report of results_path into out, capturing its figures."""
    for captured in (drawn, panels, heat_maps):
        captured.clear()
    report.write_report(results_path, out)
    return open(os.path.join(out, "report.md")).read()


def check_longppl(results, md):
    """The LongPPL section against the /longppl rows: which points have one (the ok
    non-overlapping points past K), each cell, and the plot."""
    f = h5py.File(results, "r")
    if "longppl" not in f:
        assert "### LongPPL" not in md
        return
    rows = f["summary"][...]
    table = f["longppl"][...]
    assert table.dtype.names == ("summary_row", "short_length", "candidates", "key_tokens",
                                 "key_nll_sum", "status"), table.dtype.names
    scored = collections.defaultdict(list)
    for t in table:
        r = rows[t["summary_row"]]
        assert r["mode"] == b"nonoverlapping" and r["status"] == b"ok", r
        assert int(r["eval_length"]) > int(t["short_length"]) == int(r["train_length"]), (r, t)
        assert 0 <= t["key_tokens"] <= t["candidates"] < r["scored_tokens"], t
        scored[(int(r["eval_length"]), r["position"].decode())].append(t)
    # Every ok non-overlapping point past K has its row, exactly one.
    for index, r in enumerate(rows):
        if r["mode"] == b"nonoverlapping" and r["status"] == b"ok" and r["eval_length"] > r["train_length"]:
            assert (table["summary_row"] == index).sum() == 1, index
    section = md.split("### LongPPL (non-overlapping windows)\n")[1].split("\n### ")[0]
    assert "last K = 16 tokens" in section and "selected by each model itself" in section, section
    methods = [m for m in ("alibi", "learned") if any(k[1] == m for k in scored)]
    assert "| eval length | %s |" % " | ".join(methods) in section, section
    curves = drawn["longppl_L16.png"]["curves"]
    assert drawn["longppl_L16.png"]["ylabel"] == "LongPPL"
    for length in sorted({k[0] for k in scored}):
        cells = []
        for m in methods:
            ts = scored.get((length, m), [])
            values = [math.exp(t["key_nll_sum"] / t["key_tokens"]) for t in ts if t["key_tokens"] > 0]
            keys = statistics.mean(int(t["key_tokens"]) for t in ts) if ts else 0
            if values:
                text = fmt(statistics.mean(values)) + (" ± " + fmt(statistics.stdev(values)) if len(values) > 1 else "")
                text += " (%s)" % ("%d" % keys if float(keys).is_integer() else "%.1f" % keys)
                if len(values) < len(ts):
                    text += " %d of %d seeds without key tokens" % (len(ts) - len(values), len(ts))
                x, y = curves[m]
                assert length in list(x), (m, length, list(x))
                assert abs(y[list(x).index(length)] - statistics.mean(values)) <= 1e-9 * statistics.mean(values)
            elif ts:
                candidates = statistics.mean(int(t["candidates"]) for t in ts)
                text = "no key token (of %s)" % ("%d" % candidates if float(candidates).is_integer() else "%.1f" % candidates)
            else:
                text = ""
            cells.append(text)
        row = "| %d | %s |" % (length, " | ".join(cells))
        assert row in section, (row, section)


def check_profile(results, md):
    """The attention-profile section against the /attention_profile rows: every ok profile point
    has its rows (each query's weights sum to 1: a row's bins sum to 1), the tables of mass past
    L and of entropy, and the heat map's values, computed here with loops."""
    f = h5py.File(results, "r")
    rows = f["summary"][...]
    if "attention_profile" not in f:
        assert "### Where the models look" not in md
        return
    table = f["attention_profile"][...]
    L = int(rows[0]["train_length"])  # one training length in this sweep
    assert all(int(r["train_length"]) == L for r in rows)
    assert table.dtype.names == ("summary_row", "layer", "head", "begin", "end", "mass", "entropy",
                                 "sink"), table.dtype.names
    # (eval_length, method) -> each seed's {(layer, head): [(begin, end, mass, entropy)]}
    seeds = collections.defaultdict(list)
    for index, r in enumerate(rows):
        mine = table[table["summary_row"] == index]
        if not is_profile(r["mode"]) or r["status"] != b"ok":
            assert len(mine) == 0, r
            continue
        heads = collections.defaultdict(list)
        for t in mine:
            heads[(int(t["layer"]), int(t["head"]))].append((int(t["begin"]), int(t["end"]),
                                                             float(t["mass"]), float(t["entropy"])))
        for bins in heads.values():
            bins.sort()
            assert bins[0][0] == 0 and bins[-1][1] == int(r["eval_length"]), bins
            assert all(a[1] == b[0] for a, b in zip(bins, bins[1:])), bins
            assert int(r["train_length"]) in [b[0] for b in bins] or int(r["eval_length"]) <= int(r["train_length"]), bins
            assert abs(sum(b[2] for b in bins) - 1.0) < 1e-4, bins  # no sink in this sweep
        seeds[(int(r["eval_length"]), r["position"].decode())].append(heads)
    assert seeds, "no attention profile recorded"
    section = md.split("### Where the models look (attention by query-key distance)\n")[1].split("\n### ")[0]
    methods = [m for m in ("alibi", "learned") if any(k[1] == m for k in list(seeds) + [
        (int(r["eval_length"]), r["position"].decode()) for r in rows if is_profile(r["mode"])])]
    assert "| eval length | %s |" % " | ".join(methods) in section, section

    def share(values):
        mean = statistics.mean(values)
        return "%.3g" % mean + (" ± %.2g" % statistics.stdev(values) if len(values) > 1 else "")

    lengths = sorted({int(r["eval_length"]) for r in rows if is_profile(r["mode"])})
    for length in lengths:
        past_cells, entropy_cells = [], []
        for m in methods:
            runs = seeds.get((length, m), [])
            if not runs:
                past_cells.append(r"failed \[\d+\]")
                entropy_cells.append(r"failed \[\d+\]")
                continue
            past = [statistics.mean(sum(b[2] for b in bins if b[0] >= L) for bins in heads.values()) for heads in runs]
            entropy = [statistics.mean(sum(b[3] for b in bins) for bins in heads.values()) for heads in runs]
            past_cells.append(re.escape(share(past)))
            entropy_cells.append(re.escape(fmt(statistics.mean(entropy)) + (
                " ± " + fmt(statistics.stdev(entropy)) if len(entropy) > 1 else "")))
        label = "%d (= L)" % length if length == L else "%d" % length
        entropy_table = section.split("Attention entropy")[1]
        assert re.search("\\| %s \\| %s \\|" % (re.escape(label), " \\| ".join(entropy_cells)), entropy_table), (
            label, entropy_cells, entropy_table)
        if length > L:
            past_table = section.split("Attention mass at distances")[1].split("Attention entropy")[0]
            assert re.search("\\| %s \\| %s \\|" % (label, " \\| ".join(past_cells)), past_table), (
                past_cells, past_table)
    # The heat map at the longest length: per method, layer by bin, the mean over heads and seeds.
    longest = lengths[-1]
    panels_ = heat_maps["attention_profile_L%d.png" % L]
    assert sorted(panels_) == sorted(m for m in methods if seeds.get((longest, m))), sorted(panels_)
    for m, panel in panels_.items():
        runs = seeds[(longest, m)]
        layers = 1 + max(k[0] for k in runs[0])
        heads = 1 + max(k[1] for k in runs[0])
        edges = [b[0] for b in runs[0][(0, 0)]] + [longest]
        expected = np.zeros((layers, len(edges) - 1))
        for run in runs:
            for (layer, head), bins in run.items():
                for b, bin_ in enumerate(bins):
                    expected[layer, b] += bin_[2] / heads / len(runs)
        image = np.ma.filled(panel["accuracy"], 0.0)
        assert image.shape == expected.shape and np.allclose(image, expected, rtol=0, atol=1e-12), (m, image, expected)
        assert panel["xticks"] == [("%d" % a if c - a == 1 else "%d-%d" % (a, c - 1)) for a, c in zip(edges, edges[1:])]
        assert panel["lines"] == [edges.index(L) - 0.5], panel["lines"]  # the training length
        assert panel["xlabel"] == "query-key distance (tokens)" and panel["ylabel"] == "layer"


def check_perplexity_tables(md, values, failed, methods, modes):
    """Each perplexity table: the exact row for every evaluation length, per mode, a failure's
    footnote naming its reason."""
    sections = {}
    for part in md.split("### Perplexity, ")[1:]:
        title, body = part.split("\n", 1)
        sections[title] = body
    titles = {"nonoverlapping": "non-overlapping windows", "sliding_8": "sliding window, stride 8"}
    for mode in modes:
        body = sections[titles[mode]]
        table = body[body.index("| eval length |"):].split("\n\n")[0]
        for length in (16, 32):
            cells = []
            for m in methods:
                v = values.get((mode, length, m))
                if v:
                    assert len(v) == 2, (mode, length, m, v)  # two seeds
                    cells.append(fmt(statistics.mean(v)) + " ± " + fmt(statistics.stdev(v)))
                else:
                    assert failed.get((mode, length, m)), (mode, length, m)
                    cells.append(None)  # "failed [k]", k a footnote naming the reason
            label = "16 (= L)" if length == 16 else "32"
            pattern = "\\| " + " \\| ".join([re.escape(label)] + [
                re.escape(c) if c is not None else r"failed \[(\d+)\]" for c in cells]) + " \\|"
            found = [re.fullmatch(pattern, line) for line in table.split("\n")]
            found = [m for m in found if m]
            assert len(found) == 1, "%s: expected one row matching %r in\n%s" % (mode, pattern, table)
            for note in found[0].groups():  # the footnote gives the reason: past max_length
                reason = md[md.index("## Failures"):].split("\n[%s] " % note)[1].split("\n")[0]
                assert "max_length" in reason, reason
        # Only those lengths: one row each, besides the header and its rule.
        assert len(table.split("\n")) == 2 + 2, table


def check_by_position(results, rows, md):
    """Loss by position: each panel's curves from the HDF5 bins, the seeds' tokens pooled, and
    the table of the mean NLL below and past L."""
    f = h5py.File(results, "r")
    pooled = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0]))
    all_bins = f["position_bins"][...]
    for index, r in enumerate(rows):
        if r["status"] != b"ok" or r["mode"] != b"nonoverlapping":
            continue
        length = int(r["eval_length"])
        for b in all_bins[all_bins["summary_row"] == index]:
            cell_ = pooled[(length, r["position"].decode())][(int(b["begin"]), int(b["end"]))]
            cell_[0] += float(b["nll_sum"])
            cell_[1] += int(b["scored_tokens"])
    assert sorted(panels) == ["eval length 16", "eval length 32"], sorted(panels)
    for (length, m), by_bin in pooled.items():
        x, y = panels["eval length %d" % length][m]
        ranges = sorted(by_bin)
        assert list(x) == [(b + e - 1) / 2 + 1 for b, e in ranges], (length, m, list(x))
        for yi, r_ in zip(y, ranges):
            expected = by_bin[r_][0] / by_bin[r_][1]
            assert abs(yi - expected) <= 1e-12 * expected, (length, m, r_, yi, expected)
    assert "learned" not in panels["eval length 32"]  # failed there: no curve
    # The table of the mean NLL below and past L at length 32 (alibi only: learned failed).
    by_bin = pooled[(32, "alibi")]
    below = [v for r_, v in by_bin.items() if r_[1] <= 16]
    past = [v for r_, v in by_bin.items() if r_[0] >= 16]
    nb = sum(v[0] for v in below) / sum(v[1] for v in below)
    np_ = sum(v[0] for v in past) / sum(v[1] for v in past)
    row = "| alibi | %.4f | %.4f | %+.4f |" % (nb, np_, np_ - nb)
    assert row in md, row


def check_early_tokens(md, values):
    """The early-token curse: non-overlapping against sliding, from L = 16 to 32 (alibi only:
    learned failed at 32)."""
    mean = lambda mode, l, m: statistics.mean(values[(mode, l, m)])
    d_no = mean("nonoverlapping", 32, "alibi") - mean("nonoverlapping", 16, "alibi")
    d_sl = mean("sliding_8", 32, "alibi") - mean("sliding_8", 16, "alibi")
    share = "%.0f%%" % (100 * (d_no - d_sl) / d_no) if d_no < 0 else "no gain"
    row = "| alibi | 32 | %+.3f | %+.3f | %s |" % (d_no, d_sl, share)
    assert row in md, (row, md[md.index("### Early-token"):])
    assert "| learned | 32 |" not in md


def check_curves(values, methods, modes):
    """The perplexity figures (one curve per method, each point the mean over seeds) and the
    training curves."""
    for mode in modes:
        fig = drawn["ppl_L16_%s.png" % mode]
        assert fig["xlabel"] == "evaluation length (tokens)" and fig["ylabel"] == "perplexity", fig
        assert "L = 16" in fig["title"], fig["title"]
        assert sorted(fig["curves"]) == methods, fig["curves"].keys()  # one curve per method
        for m in methods:
            x, y = fig["curves"][m]
            lengths = sorted(l for (md_, l, mm) in values if md_ == mode and mm == m)
            assert list(x) == lengths, (mode, m, list(x), lengths)
            for xi, yi in zip(x, y):
                expected = statistics.mean(values[(mode, int(xi), m)])
                assert abs(yi - expected) <= 1e-9 * expected, (mode, m, xi, yi, expected)
    curves = drawn["curves_L16.png"]
    assert curves["xlabel"] == "step" and curves["ylabel"] == "loss (nats per token)", curves
    assert curves["lines"] == collections.Counter({m: 1 for m in methods}), curves["lines"]
    # Every point of every curve inside the axes (the first steps' loss is not cut off), and
    # overlapping methods told apart by their line pattern, not only their colour.
    low, high = curves["ylim"]
    assert curves["yscale"] == "log" and curves["points"], curves["yscale"]
    assert all(low <= y <= high for _, y in curves["points"]), (curves["ylim"], max(y for _, y in curves["points"]))
    assert len(set(curves["linestyles"].values())) == len(methods), curves["linestyles"]


def check_trained(results, md, methods):
    """What was trained: each method's row from its runs' attributes and configs."""
    trained = md.split("## What was trained", 1)[1].split("\n## ", 1)[0]
    with h5py.File(results, "r") as f:
        for m in methods:
            group = [g for g in f["runs"].values() if g.attrs["position"] == m]
            config = yaml.safe_load(group[0].attrs["config"])
            row = next(line for line in trained.splitlines() if line.startswith("| %s |" % m))
            cells = [c.strip() for c in row.strip("|").split("|")]
            # 0 parameters: not recorded (a run that failed before its model was built).
            recorded = ["{:,}".format(int(g.attrs["num_parameters"])) for g in group if g.attrs["num_parameters"]]
            assert cells[1] == (" / ".join(dict.fromkeys(recorded)) or "not recorded"), (m, cells)
            mc = config["model"]
            assert cells[2] == "%d layer%s, d_model %d, %d heads, d_ffn %d" % (
                mc["layers"], "" if mc["layers"] == 1 else "s", mc["d_model"], mc["heads"], mc["d_ffn"]), (m, cells)
            assert cells[4] == str(config["train"]["steps"]), (m, cells)
            assert cells[5] == "{:,}".format(int(group[0].attrs["train_tokens"])), (m, cells)
            assert cells[7] == config["train"].get("precision", "fp32"), (m, cells)
            corpus = "Corpus `%s`, %s tokens (vocabulary {:,})".format(int(group[0].attrs["vocab_size"])) % (
                config["data"]["path"], config["data"]["tokenizer"])
            assert corpus in trained, (corpus, trained)


def check_images(report_dir, rows, md):
    """The PNGs written by `extrap report` are real images of the size the report asks for; a
    file without retrieval points has no retrieval section and no heat map."""
    for name in [n for n in drawn if not n.startswith(("position_", "retrieval_", "attention_profile_"))]:
        with open(os.path.join(report_dir, name), "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        assert (width, height) == (704, 462), (name, width, height)  # 6.4 x 4.2 in at 110 dpi
    if not any(is_retrieval(r["mode"]) for r in rows):
        assert "Retrieval" not in md and "retrieval" not in md, md
        assert not [n for n in os.listdir(report_dir) if n.startswith("retrieval_")], os.listdir(report_dir)


def check_sweep_report(results, report_dir):
    """The perplexity tables, curves, loss by position and early-token table of the report in
    report_dir against the results file (the figures from a report written again here)."""
    # (mode, eval_length, position) -> perplexities over seeds; failures likewise. Retrieval
    # points are not part of any of these.
    rows = h5py.File(results, "r")["summary"][...]
    values, failed = collections.defaultdict(list), collections.defaultdict(list)
    for r in rows:
        if is_retrieval(r["mode"]) or is_profile(r["mode"]):
            continue
        key = (r["mode"].decode(), int(r["eval_length"]), r["position"].decode())
        (values if r["status"] == b"ok" else failed)[key].append(float(r["perplexity"]))
    methods = ["alibi", "learned"]
    modes = sorted({k[0] for k in list(values) + list(failed)})
    assert modes == ["nonoverlapping", "sliding_8"], modes
    md = open(os.path.join(report_dir, "report.md")).read()
    check_perplexity_tables(md, values, failed, methods, modes)

    # The figures: what each one draws, captured from a report written again here.
    with tempfile.TemporaryDirectory() as out:
        render(results, out)
    has_longppl = "longppl" in h5py.File(results, "r")
    has_profile = "attention_profile" in h5py.File(results, "r")
    assert sorted(n for n in drawn if not n.startswith("retrieval_")) == sorted(
        ["curves_L16.png", "position_L16.png", "ppl_L16_nonoverlapping.png", "ppl_L16_sliding_8.png"]
        + (["longppl_L16.png"] if has_longppl else [])
        + (["attention_profile_L16.png"] if has_profile else [])), sorted(drawn)
    check_longppl(results, md)
    check_profile(results, md)
    check_by_position(results, rows, md)
    check_early_tokens(md, values)
    check_curves(values, methods, modes)
    check_trained(results, md, methods)
    check_images(report_dir, rows, md)
    return md


check_sweep_report(results, report_dir)

# === retrieval: synthetic results files ===================================================
L = 16
SEEDS = (1, 2)
RUNS = [("%02d-%s-seed%d" % (2 * i + s - 1, m, s), i, m, s)
        for i, m in enumerate(["alibi", "learned"]) for s in SEEDS]
DEPTHS = (0.0, 50.0, 100.0)
TRIALS = 5  # instances per depth
ANSWER_TOKENS = 6  # " 12345" at byte level
RETRIEVAL_LENGTHS = (32, 64)  # 64: no perplexity row at all
LEARNED_FAILS = "eval length 32 is past the learned table's max_length 16"
PASSKEY_FAILS = "instance of 64 tokens past the learned positions"
YARN_FAILS = "non-finite logit in a retrieval instance of 64 tokens"
# (mode, method) -> the runs' retrieval points: (eval_length, seed) -> status
RETRIEVAL = {("retrieval_passkey", "alibi"): {}, ("retrieval_passkey", "learned"): {},
             ("retrieval_passkey+yarn", "learned"): {}}
for (mode, m), points in RETRIEVAL.items():
    for length in RETRIEVAL_LENGTHS:
        for s in SEEDS:
            points[(length, s)] = "ok"
RETRIEVAL[("retrieval_passkey", "learned")][(64, 1)] = "failed: " + PASSKEY_FAILS
RETRIEVAL[("retrieval_passkey", "learned")][(64, 2)] = "failed: " + PASSKEY_FAILS
RETRIEVAL[("retrieval_passkey+yarn", "learned")][(64, 2)] = "failed: " + YARN_FAILS


# (mode, method, eval_length, seed) -> exact matches out of TRIALS at each of DEPTHS
CORRECT = {("retrieval_passkey", "alibi", 32, 1): (5, 4, 5), ("retrieval_passkey", "alibi", 32, 2): (5, 5, 3),
           ("retrieval_passkey", "alibi", 64, 1): (2, 0, 1), ("retrieval_passkey", "alibi", 64, 2): (3, 1, 0),
           ("retrieval_passkey", "learned", 32, 1): (4, 2, 1), ("retrieval_passkey", "learned", 32, 2): (3, 3, 0),
           ("retrieval_passkey+yarn", "learned", 32, 1): (5, 3, 4),
           ("retrieval_passkey+yarn", "learned", 32, 2): (4, 4, 2),
           ("retrieval_passkey+yarn", "learned", 64, 1): (1, 0, 2)}


STR = h5py.string_dtype("utf-8")
SUMMARY = np.dtype([("run_id", STR), ("position", STR), ("train_length", "<i8"), ("seed", "<i8"),
                    ("mode", STR), ("stride", "<i8"), ("eval_length", "<i8"), ("perplexity", "<f8"),
                    ("nll_sum", "<f8"), ("scored_tokens", "<i8"), ("bits_per_byte", "<f8"),
                    ("seconds", "<f8"), ("status", STR)])
BINS = np.dtype([("summary_row", "<i8"), ("begin", "<i8"), ("end", "<i8"), ("nll_sum", "<f8"),
                 ("scored_tokens", "<i8")])
RETRIEVAL_ROW = np.dtype([("summary_row", "<i8"), ("depth", "<f8"), ("trials", "<i8"), ("correct", "<i8"),
                          ("answer_nll", "<f8"), ("answer_tokens", "<i8")])  # extrap 0.11's columns
# With where each depth's keys went (placed_depth) and which asked depth places them alike (same_as).
PLACED_ROW = np.dtype(RETRIEVAL_ROW.descr + [("placed_depth", "<f8"), ("same_as", "<f8")])
# At 32 tokens depths 0 and 50 put the key at one boundary (3% of the filler): one measurement.
PLACEMENT = {32: {0.0: (0.0, 3.0), 50.0: (0.0, 3.0), 100.0: (100.0, 100.0)},
             64: {0.0: (0.0, 0.0), 50.0: (50.0, 48.0), 100.0: (100.0, 100.0)}}
FAILURE = np.dtype([("length", "<i8"), ("reason", STR)])


def rows_dataset(group, name, array):
    """An extendable 1-D dataset, as the store writes them."""
    group.create_dataset(name, data=array, maxshape=(None,), chunks=(64,))


def add_perplexity_points(run_id, index, m, s, summary, bins, eval_rows):
    """A run's perplexity points (and their loss-by-position bins) appended to /summary's
    rows; learned fails at 32 (past max_length)."""
    for mode in ("nonoverlapping", "sliding_8"):
        for length in (16, 32):
            stride = length if mode == "nonoverlapping" else 8
            eval_rows[(run_id, mode)].append(len(summary))
            if m == "learned" and length == 32:
                summary.append((run_id, m, L, s, mode, stride, length, math.nan, math.nan, 0, math.nan,
                                0.01, "failed: " + LEARNED_FAILS))
                continue
            ppl = (7.0 + index) * (1.0 + 0.25 * (length / L - 1.0)) * (0.9 if mode == "sliding_8" else 1.0) \
                + 0.4 * s + 0.01 * length
            tokens = 512
            nll = math.log(ppl) * tokens
            summary.append((run_id, m, L, s, mode, stride, length, ppl, nll, tokens,
                            nll / math.log(2) / tokens, 0.05, "ok"))
            count = length // 8  # bins [0, 8), [8, 16), ...: their NLL adds up to the point's
            for b in range(count):
                shift = 0.03 * (b - (count - 1) / 2.0) * (1 if s == 1 else -0.5)
                bins.append((len(summary) - 1, 8 * b, 8 * b + 8, (math.log(ppl) + shift) * tokens / count,
                             tokens // count))


def add_retrieval_points(run_id, m, s, summary, cells, written, eval_rows):
    """A run's retrieval points (RETRIEVAL) appended to /summary's rows, their counts by depth
    to /retrieval's, each recorded in `written`."""
    for (mode, method), points in RETRIEVAL.items():
        if method != m:
            continue
        for length in RETRIEVAL_LENGTHS:
            status = points[(length, s)]
            eval_rows[(run_id, mode)].append(len(summary))
            if status != "ok":
                summary.append((run_id, m, L, s, mode, length, length, math.nan, math.nan, 0, math.nan,
                                0.02, status))
                written[(mode, m, length, s)] = (status, [], None)
                continue
            # An answer perplexity no other number of the report can be: over 4000.
            ppl = 4321.0 + 37.123 * len(written) + 0.0071 * length
            depth_rows = [(d, TRIALS, c) for d, c in zip(DEPTHS, CORRECT[(mode, m, length, s)])]
            for d, trials, correct in depth_rows:
                same_as, placed = PLACEMENT[length][d]
                cells.append((len(summary), d, trials, correct, math.log(ppl) * trials * ANSWER_TOKENS,
                              trials * ANSWER_TOKENS, placed, same_as))
            tokens = len(DEPTHS) * TRIALS * ANSWER_TOKENS
            summary.append((run_id, m, L, s, mode, length, length, ppl, math.log(ppl) * tokens, tokens,
                            math.nan, 0.3, "ok"))
            written[(mode, m, length, s)] = (status, depth_rows, ppl)


def write_run(g, run_id, index, m, s, summary, eval_rows, written):
    """/runs/<run_id>: the run's attributes, curves and eval groups (its rows of /summary
    arranged by mode)."""
    for key, value in {
            "config": ("data: {path: corpus, tokenizer: byte, split_fractions: [0.9, 0.05, 0.05]}\n"
                       "model: {layers: 2, d_model: 64, heads: 4, d_ffn: 256}\n"
                       "position:\n  name: %s\n"
                       "train: {seq_len: 16, batch_tokens: 4096, steps: 40, precision: bf16, device: cpu}\n"
                       "eval: {split: test, max_tokens: 2048}" % m),
            "grid_point": "{position: {name: %s}, train.seed: %d}" % (m, s),
            "point_index": 2 * index + s - 1, "position": m, "train_length": L, "seed": s,
            "extrap_version": "0.4.0", "git_commit": "synthetic", "machine": "synthetic machine",
            "runtime": "synthetic", "start_time": "2026-01-01T00:00:00Z",
            "end_time": "2026-01-01T00:01:00Z", "tokens_per_second": 20000.0 + 1000.0 * s,
            "peak_memory_bytes": 2**27, "num_parameters": 1000 + index, "train_tokens": 163840,
            "vocab_size": 257, "status": "complete"}.items():
        g.attrs[key] = value
    steps = np.array([10.0, 20.0, 30.0, 40.0])
    g["train_loss"] = np.stack([steps, 5.0 - 0.5 * steps / 10.0 - 0.1 * index], axis=1)
    g["valid_loss"] = np.stack([steps[1::2], 4.5 - 0.4 * steps[1::2] / 10.0 - 0.1 * index], axis=1)
    ev = g.create_group("eval")
    for (rid, mode), indices in eval_rows.items():
        if rid != run_id:
            continue
        e = ev.create_group(mode)
        ok = [summary[i] for i in indices if summary[i]["status"] == "ok"]
        bad = [summary[i] for i in indices if summary[i]["status"] != "ok"]
        rows_dataset(e, "length", np.array([r["eval_length"] for r in ok], dtype="<i8"))
        if mode.startswith("retrieval_"):
            counts = [written[(mode, m, int(r["eval_length"]), s)][1] for r in ok]
            correct = [sum(c for _, _, c in depth_rows) for depth_rows in counts]
            trials = [sum(t for _, t, _ in depth_rows) for depth_rows in counts]
            rows_dataset(e, "accuracy", np.array([c / t for c, t in zip(correct, trials)], dtype="<f8"))
            rows_dataset(e, "correct", np.array(correct, dtype="<i8"))
            rows_dataset(e, "trials", np.array(trials, dtype="<i8"))
        else:
            for column in ("perplexity", "nll_sum", "bits_per_byte"):
                rows_dataset(e, column, np.array([r[column] for r in ok], dtype="<f8"))
            rows_dataset(e, "scored_tokens", np.array([r["scored_tokens"] for r in ok], dtype="<i8"))
        rows_dataset(e, "seconds", np.array([r["seconds"] for r in ok], dtype="<f8"))
        rows_dataset(e, "failures", np.array(
            [(r["eval_length"], r["status"][len("failed: "):]) for r in bad], dtype=FAILURE))


def write_results(path, with_retrieval, placement=False):
    """A results file in the documented schema: each run's perplexity points (and its retrieval
    points), runs interleaved in /summary as a sweep finishes them. Returns the retrieval
    points written: (mode, method, eval_length, seed) -> (status, [(depth, trials, correct)],
    answer perplexity)."""
    summary, bins, cells, written = [], [], [], {}
    eval_rows = collections.defaultdict(list)  # (run_id, mode) -> (length, summary row)
    for run_id, index, m, s in RUNS:
        add_perplexity_points(run_id, index, m, s, summary, bins, eval_rows)
        if with_retrieval:
            add_retrieval_points(run_id, m, s, summary, cells, written, eval_rows)
    summary = np.array(summary, dtype=SUMMARY)
    with h5py.File(path, "w") as f:
        for key, value in {"format_version": 1, "sweep_name": "synthetic", "sweep_spec": "{}",
                           "spec_hash": "0123456789abcdef", "sweep_file": "", "shard": "",
                           "extrap_version": "0.4.0", "git_commit": "synthetic",
                           "created": "2026-01-01T00:00:00Z"}.items():
            f.attrs[key] = value
        runs = f.create_group("runs")
        for run_id, index, m, s in RUNS:
            write_run(runs.create_group(run_id), run_id, index, m, s, summary, eval_rows, written)
        rows_dataset(f, "summary", summary)
        rows_dataset(f, "position_bins", np.array(bins, dtype=BINS))
        if with_retrieval:
            rows = np.array(cells, dtype=PLACED_ROW)
            rows_dataset(f, "retrieval", rows if placement else rows[list(RETRIEVAL_ROW.names)].astype(RETRIEVAL_ROW))
    return written


def footnote(md, note):
    """The reason behind footnote [note] of the report's Failures section."""
    return md[md.index("## Failures"):].split("\n[%s] " % note)[1].split("\n")[0].rstrip()


def retrieval_table(md, title):
    """The accuracy table of the report's retrieval section `title`."""
    part = md.split("\n### Retrieval accuracy, %s\n" % title)[1].split("\n### ")[0]
    return part[part.index("| method |"):].split("\n\n")[0]


def without_retrieval(md):
    """The report less its retrieval sections (each from its heading to the next heading of its
    level or above), its first paragraphs (the file name, the number of points) and its
    Failures section."""
    body = md[md.index("\n## "):]
    body = re.sub(r"\n### Retrieval accuracy, .*?(?=\n##? |\n### |\Z)", "", body, flags=re.S)
    return body.split("\n## Failures")[0]


# A model's architecture keys in the "What was trained" table; d_ffn 0 as its rule's width
# (Llama's: 2/3 of 4 x 4096 = 10922.67, rounded up to a multiple of 256: 11008; the mlp: 4 d_model).
assert report.model_shape({"layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8, "ffn": "swiglu", "d_ffn": 0,
                           "norm": "rmsnorm", "bias": False, "tie_embeddings": False}) == (
    "32 layers, d_model 4096, 32 heads (8 key and value), swiglu 11008, rmsnorm, no biases, untied head")
assert report.model_shape({"layers": 1, "d_model": 64, "heads": 4, "d_ffn": 0, "block": "parallel_shared",
                           "qk_norm": True, "embedding_norm": True}) == (
    "1 layer, d_model 64, 4 heads, d_ffn 256, parallel shared block, QK-norm, embedding norm")

with tempfile.TemporaryDirectory() as work:
    plain_h5, mixed_h5 = os.path.join(work, "plain.h5"), os.path.join(work, "mixed.h5")
    plain_dir, mixed_dir = os.path.join(work, "plain"), os.path.join(work, "mixed")
    assert write_results(plain_h5, with_retrieval=False) == {}
    written = write_results(mixed_h5, with_retrieval=True)
    with h5py.File(mixed_h5, "r") as f:  # the schema as documented
        assert f["retrieval"].dtype == RETRIEVAL_ROW and f["retrieval"].maxshape == (None,)
    plain_md = render(plain_h5, plain_dir)
    mixed_md = render(mixed_h5, mixed_dir)
    mixed_heat_maps = dict(heat_maps)

    # Both files pass the sweep's checks: the retrieval rows change no perplexity table,
    # curve or panel.
    check_sweep_report(plain_h5, plain_dir)
    check_sweep_report(mixed_h5, mixed_dir)

    # The file without retrieval points has no retrieval section and no heat map.
    assert "etrieval" not in plain_md, plain_md
    assert not [n for n in os.listdir(plain_dir) if n.startswith("retrieval_")], os.listdir(plain_dir)

    # With them: the report less its retrieval sections is the report without them, but for
    # the number of points and the further footnotes.
    assert without_retrieval(mixed_md) == without_retrieval(plain_md), (without_retrieval(mixed_md),
                                                                       without_retrieval(plain_md))
    total = len(h5py.File(mixed_h5, "r")["summary"])
    assert "; %d evaluation points (%d of retrieval). " % (total, len(written)) in mixed_md, mixed_md
    plain_failures = plain_md[plain_md.index("## Failures"):].rstrip("\n")
    assert mixed_md[mixed_md.index("## Failures"):].startswith(plain_failures + "\n"), mixed_md
    # No answer perplexity (nor its mean NLL) anywhere; the instance lengths past the
    # perplexity rows nowhere among them.
    body = mixed_md[mixed_md.index("\n## "):]
    for status, _, ppl in written.values():
        if ppl is not None:
            for number in ["%.0f" % ppl, "%.1f" % ppl, "%.2f" % ppl, "%.4f" % math.log(ppl)]:
                assert number not in body, (number, body)
    perplexity_part = body[:body.index("### Retrieval accuracy")]
    assert not re.search(r"^\| 64 ", perplexity_part, flags=re.M), perplexity_part
    assert "eval length 64" not in perplexity_part and "eval length 64" not in panels, perplexity_part

    # --- each retrieval section: its table, sentence and heat map, from the rows written -----
    sections = {"retrieval_passkey": ("passkey", ["alibi", "learned"]),
                "retrieval_passkey+yarn": ("passkey + yarn", ["learned + yarn"])}
    assert mixed_md.count("### Retrieval accuracy, ") == len(sections), mixed_md
    assert sorted(mixed_heat_maps) == ["retrieval_L16_retrieval_passkey.png",
                                       "retrieval_L16_retrieval_passkey_yarn.png"], sorted(mixed_heat_maps)
    lengths_text = ["%d (%dx)" % (l, l // L) for l in RETRIEVAL_LENGTHS]
    for mode, (title, labels) in sections.items():
        image = "retrieval_L16_%s.png" % mode.replace("+", "_")
        with open(os.path.join(mixed_dir, image), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", image
        part = mixed_md.split("\n### Retrieval accuracy, %s\n" % title)[1].split("\n## ")[0].split("\n### ")[0]
        assert "](%s)" % image in part, part
        table = part[part.index("| method |"):].split("\n\n")[0].split("\n")
        assert table[0] == "| " + " | ".join(["method"] + lengths_text) + " |", table
        assert len(table) == 2 + len(labels), table
        for label, line in zip(labels, table[2:]):
            m = label.split(" + ")[0]
            cells = []
            for length in RETRIEVAL_LENGTHS:
                points = [written[(mode, m, length, s)] for s in SEEDS]
                correct = sum(c for status, depth_rows, _ in points for _, _, c in depth_rows)
                trials = sum(t for status, depth_rows, _ in points for _, t, _ in depth_rows)
                reasons = [status[len("failed: "):] for status, _, _ in points if status != "ok"]
                if trials:
                    cells.append((re.escape("%d%% (%d/%d)" % (round(100.0 * correct / trials), correct, trials))
                                  + (r" \[(\d+)\]" if reasons else ""), reasons))
                else:
                    cells.append((r"failed \[(\d+)\]", reasons))
            found = re.fullmatch(r"\| " + re.escape(label) + "".join(r" \| " + c for c, _ in cells) + r" \|", line)
            assert found, (line, [c for c, _ in cells])
            notes = iter(found.groups())
            for _, reasons in cells:  # every failure shown, its reason in its footnote
                if reasons:
                    assert footnote(mixed_md, next(notes)) == reasons[0], (label, reasons)
        assert ("the counts are summed over seeds" in part) and ("5 instances per length and depth" in part), part
        assert "exact match of greedy decoding" in part and "over all depths (0, 50, 100%)" in part, part
        assert "the same instances for every method" in part, part

        # The heat map: one panel per method, accuracy pooled over seeds in each (length,
        # depth) cell, the scale 0 to 1, the value in each cell, "failed" where nothing finished.
        figure = mixed_heat_maps[os.path.basename(image)]
        assert sorted(figure) == sorted(labels), figure.keys()
        for label in labels:
            m, panel = label.split(" + ")[0], figure[label]
            assert panel["clim"] == (0.0, 1.0), panel["clim"]
            assert panel["xticks"] == ["0", "50", "100"] and panel["yticks"] == lengths_text, panel
            assert panel["xlabel"] == "depth of the key asked (%)" and panel["ylabel"] == "instance length (tokens)"
            accuracy = panel["accuracy"]
            assert accuracy.shape == (len(RETRIEVAL_LENGTHS), len(DEPTHS)), accuracy.shape
            for i, length in enumerate(RETRIEVAL_LENGTHS):
                for j, depth in enumerate(DEPTHS):
                    ok = [written[(mode, m, length, s)][1] for s in SEEDS]
                    correct = sum(depth_rows[j][2] for depth_rows in ok if depth_rows)
                    trials = sum(depth_rows[j][1] for depth_rows in ok if depth_rows)
                    if trials:
                        assert abs(float(accuracy[i, j]) - correct / trials) <= 1e-12, (label, length, depth)
                        assert panel["texts"][(j, i)] == "%.2f" % (correct / trials), (label, panel["texts"])
                    else:
                        assert np.ma.is_masked(accuracy[i, j]), (label, length, depth)
                        assert panel["texts"][(j, i)] == "failed", (label, panel["texts"])
    # The failed points of this file are all there: a whole cell, and one seed of two.
    assert "| learned | " in mixed_md and "| failed [" in mixed_md, mixed_md
    assert "place the key alike" not in mixed_md and "one measurement" not in mixed_md, mixed_md

    # --- depths that place the key alike: one measurement, never shown as two ---------------
    # The same rows with /retrieval's placement columns: at 32 tokens depths 0 and 50 are one
    # cell of the heat map (their seeds' and depths' instances pooled) spanning both columns, with
    # one value and where the key went, and the section says so; at 64 every depth stands alone.
    placed_h5, placed_dir = os.path.join(work, "placed.h5"), os.path.join(work, "placed")
    assert write_results(placed_h5, with_retrieval=True, placement=True) == written
    heat_maps.clear()
    placed_md = render(placed_h5, placed_dir)
    part = placed_md.split("\n### Retrieval accuracy, passkey\n")[1].split("\n### ")[0]
    assert "At 32 (2x) depths 0 and 50 (at 3% of the filler) place it alike." in part, part
    assert "At 64" not in part, part
    assert "Depths that place the key alike are one measurement" in part, part
    # The accuracy over all depths is the same table: placement changes no count.
    assert retrieval_table(placed_md, "passkey") == retrieval_table(mixed_md, "passkey")
    figure = heat_maps["retrieval_L16_retrieval_passkey.png"]
    for m in ("alibi", "learned"):
        panel = figure[m]
        ok = [written[("retrieval_passkey", m, 32, s)][1] for s in SEEDS]
        correct = sum(rows[j][2] for rows in ok if rows for j in (0, 1))
        trials = sum(rows[j][1] for rows in ok if rows for j in (0, 1))
        assert float(panel["accuracy"][0, 0]) == float(panel["accuracy"][0, 1]) == correct / trials, (m, panel)
        # One value over columns 0 and 1 (drawn at 0.5), and what it is; column 2 its own.
        row0 = sorted((x, -y, t) for (x, y), t in panel["raw_texts"] if abs(y) < 0.5)
        assert [t for x, y, t in row0 if x == 0.5] == ["%.2f" % (correct / trials), "one cell, key at 3%"], row0
        assert not [t for x, y, t in row0 if x in (0.0, 1.0)], row0
        assert panel["lines"] == [-0.5, 1.5], panel["lines"]  # the cell's two edges

    # --- runs of different tokenizations: a bits-per-byte table, from /summary ---------------
    # One vocabulary (the files above): no such table. Then learned's runs on a SentencePiece
    # model of 1,001 tokens: after each perplexity table, one of bits per byte, each cell the
    # mean ± sample standard deviation over seeds of the rows' bits_per_byte.
    assert "tokenise the text differently" not in plain_md, plain_md
    pieces_h5, pieces_dir = os.path.join(work, "pieces.h5"), os.path.join(work, "pieces")
    write_results(pieces_h5, with_retrieval=False)
    with h5py.File(pieces_h5, "r+") as f:
        for run_id, _, m, _ in RUNS:
            if m == "learned":
                run = f["runs"][run_id]
                run.attrs["config"] = run.attrs["config"].replace(
                    "tokenizer: byte", "tokenizer: sentencepiece, tokenizer_model: spm1k.model")
                run.attrs["vocab_size"] = 1001
        rows = f["summary"][...]
    pieces_md = render(pieces_h5, pieces_dir)
    assert "sentencepiece (`spm1k.model`) tokens (vocabulary 1,001)" in pieces_md, pieces_md
    for mode, title in (("nonoverlapping", "non-overlapping windows"), ("sliding_8", "sliding window, stride 8")):
        part = pieces_md.split("\n### Perplexity, %s\n" % title)[1].split("\n### ")[0]
        sentence = ("The runs tokenise the text differently (byte, 257 tokens; sentencepiece `spm1k.model`, "
                    "1,001 tokens)")
        assert sentence in part, part
        table = part[part.index(sentence):].split("\n\n")[1].split("\n")
        assert table[0] == "| eval length | alibi | learned |", table
        for line, length in zip(table[2:], (16, 32)):
            expected = ["%d" % length + (" (= L)" if length == L else "")]
            for m in ("alibi", "learned"):
                bits = [float(r["bits_per_byte"]) for r in rows if r["position"].decode() == m
                        and r["mode"].decode() == mode and r["eval_length"] == length and r["status"] == b"ok"]
                expected.append("" if not bits else fmt(statistics.mean(bits)) + (
                    " ± " + fmt(statistics.stdev(bits)) if len(bits) > 1 else ""))
            assert line == "| " + " | ".join(expected) + " |", (line, expected)
print("report ok")
