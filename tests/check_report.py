# Checks a report written by `extrap report` against the results file it came from, computing
# every expected number here from the HDF5 rows (statistics.stdev, not the report's numpy):
# each table cell of mean ± sample standard deviation over seeds, and what each plot draws
# (axes, one curve per method, the points on each curve).
#
#   python tests/check_report.py RESULTS.h5 REPORT_DIR SOURCE_DIR
import collections
import math
import os
import re
import statistics
import sys
import tempfile

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.figure  # noqa: E402

results, report_dir, source_dir = sys.argv[1:4]


def fmt(value):  # the report's documented number format: 2 decimals below 100
    assert math.isfinite(value) and abs(value) < 100, value
    return "%.2f" % value


# (mode, eval_length, position) -> perplexities over seeds; failures likewise.
rows = h5py.File(results, "r")["summary"][...]
values, failed = collections.defaultdict(list), collections.defaultdict(list)
for r in rows:
    key = (r["mode"].decode(), int(r["eval_length"]), r["position"].decode())
    (values if r["status"] == b"ok" else failed)[key].append(float(r["perplexity"]))
methods = ["alibi", "learned"]
modes = sorted({k[0] for k in list(values) + list(failed)})
assert modes == ["nonoverlapping", "sliding_8"], modes

# --- tables: the exact row for every evaluation length, per mode -------------------------
md = open(os.path.join(report_dir, "report.md")).read()
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

# --- plots: what each figure draws -------------------------------------------------------
sys.path.insert(0, os.path.join(source_dir, "analysis"))
import report  # noqa: E402

drawn = {}
panels = {}  # the loss-by-position figure: title -> {method: (x, y)}
original = matplotlib.figure.Figure.savefig


def capture(fig, path, *args, **kwargs):
    ax = fig.axes[0]
    if os.path.basename(path).startswith("position_"):
        for a in fig.axes:
            if a.get_title():
                panels[a.get_title()] = {l.get_label(): l.get_data() for l in a.get_lines()
                                         if not l.get_label().startswith("_")}
                assert a.get_xlabel() == "position in the window" and a.get_ylabel() == "mean NLL (nats)"
    drawn[os.path.basename(path)] = {
        "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "title": ax.get_title(),
        "curves": {c.get_label(): c.lines[0].get_data() for c in ax.containers},
        "lines": collections.Counter(l.get_label() for l in ax.get_lines()
                                     if not l.get_label().startswith("_")),
    }
    return original(fig, path, *args, **kwargs)


matplotlib.figure.Figure.savefig = capture
with tempfile.TemporaryDirectory() as out:
    report.write_report(results, out)
assert sorted(drawn) == ["curves_L16.png", "position_L16.png", "ppl_L16_nonoverlapping.png",
                         "ppl_L16_sliding_8.png"], sorted(drawn)

# --- loss by position: each panel's curves from the HDF5 bins, the seeds' tokens pooled ----
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

# --- the early-token curse: non-overlapping against sliding, from L = 16 to 32 --------------
mean = lambda mode, l, m: statistics.mean(values[(mode, l, m)])
d_no = mean("nonoverlapping", 32, "alibi") - mean("nonoverlapping", 16, "alibi")
d_sl = mean("sliding_8", 32, "alibi") - mean("sliding_8", 16, "alibi")
share = "%.0f%%" % (100 * (d_no - d_sl) / d_no) if d_no < 0 else "no gain"
row = "| alibi | 32 | %+.3f | %+.3f | %s |" % (d_no, d_sl, share)
assert row in md, (row, md[md.index("### Early-token"):])
assert "| learned | 32 |" not in md
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
# The PNGs written by `extrap report` are real images of the size the report asks for.
for name in [n for n in drawn if not n.startswith("position_")]:
    with open(os.path.join(report_dir, name), "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", name
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, height) == (704, 462), (name, width, height)  # 6.4 x 4.2 in at 110 dpi
print("report ok")
