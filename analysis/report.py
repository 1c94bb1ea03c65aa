#!/usr/bin/env python3
"""A Markdown report, with PNG plots, from the results file of an `extrap sweep`.

    .venv/bin/python analysis/report.py RESULTS.h5 --out DIR      (or: extrap report ...)

Writes DIR/report.md and, next to it:
  ppl_L<train>_<mode>.png   perplexity against evaluation length, one line per method,
                            log-scale x, the training length marked by a vertical line
  curves_L<train>.png       training (solid) and validation (dashed) loss against step
and in report.md: one table per (training length, mode) in the shape of the ALiBi paper's
extrapolation tables (evaluation lengths as rows, methods as columns), the same as ratios to
the perplexity at the training length, and training speed and peak memory per method.
Runs that differ only in train.seed are aggregated: "mean ± sample standard deviation".

Reads only what the file documents (core/results_store.h): the /summary table and the
/runs/<id> attributes and curves. Needs h5py, numpy and matplotlib: the project's environment
(.venv, made by scripts/setup.sh) has them.
"""
import argparse
import collections
import math
import os
import sys

import h5py
import numpy as np
import yaml
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402

# Grid keys that are not part of a method's label: they are the table axes or are aggregated.
AXIS_KEYS = {"position.name", "position", "train.seq_len", "train.seed"}


def text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def attribute(value):
    if isinstance(value, (bytes, str)):
        return text(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def parse_grid_point(flow):
    """The run's grid values, stored as a YAML flow map: {key: value, ...}; values may be maps
    (a grid over `position` holds {name: ..., option: value})."""
    parsed = yaml.safe_load(flow)
    return parsed if isinstance(parsed, dict) else {}


def load(path):
    with h5py.File(path, "r") as f:
        header = {k: attribute(v) for k, v in f.attrs.items()}
        summary = f["summary"][...]
        points = []
        for row in summary:
            point = {name: attribute(row[name]) for name in summary.dtype.names}
            points.append(point)
        runs = {}
        for run_id, group in f["runs"].items():
            run = {k: attribute(v) for k, v in group.attrs.items()}
            for curve in ("train_loss", "valid_loss"):
                run[curve] = group[curve][...] if curve in group else np.zeros((0, 2))
            runs[run_id] = run
    return header, points, runs


def position_options(grid):
    """A grid point's position options other than the name ({} when the grid has none)."""
    value = grid.get("position")
    return {k: v for k, v in value.items() if k != "name"} if isinstance(value, dict) else {}


def method_labels(runs):
    """run_id -> the label its numbers are reported under: the position method, plus any grid
    value other than the training length and the seed, plus the method's options wherever two
    runs of the same method differ in them (e.g. "rotary" and "rotary (randomize_max=512)"), so
    that only runs of one configuration are ever pooled as seeds."""
    grids = {run_id: parse_grid_point(run.get("grid_point", "{}")) for run_id, run in runs.items()}
    options_by_method = collections.defaultdict(list)
    for run_id, run in runs.items():
        options_by_method[run.get("position", "?")].append(position_options(grids[run_id]))
    varying = {}
    for method, options in options_by_method.items():
        keys = set().union(*options)
        varying[method] = sorted(k for k in keys if len({repr(o.get(k)) for o in options}) > 1)
    labels = {}
    for run_id, run in runs.items():
        method, grid = run.get("position", "?"), grids[run_id]
        options = position_options(grid)
        extra = ["%s=%s" % (k, options[k]) for k in varying[method] if k in options]
        for key, value in grid.items():
            if key not in AXIS_KEYS:
                extra.append("%s=%s" % (key.split(".")[-1], value))
        labels[run_id] = method + (" (" + ", ".join(extra) + ")" if extra else "")
    return labels


def mode_order(mode):
    return (0, 0) if mode == "nonoverlapping" else (1, int(mode.split("_", 1)[1]))


def mode_title(mode):
    if mode == "nonoverlapping":
        return "non-overlapping windows"
    return "sliding window, stride %s" % mode.split("_", 1)[1]


def fmt(value):
    if not math.isfinite(value):
        return "nan"
    if abs(value) >= 1000:
        return "%.0f" % value
    if abs(value) >= 100:
        return "%.1f" % value
    return "%.2f" % value


def mean_spread(values):
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    spread = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return mean, spread


def cell(values):
    mean, spread = mean_spread(values)
    return fmt(mean) + (" ± " + fmt(spread) if len(values) > 1 else "")


class Footnotes:
    """Failure reasons, numbered once each."""

    def __init__(self):
        self.reasons = []

    def mark(self, reason):
        if reason not in self.reasons:
            self.reasons.append(reason)
        return "[%d]" % (self.reasons.index(reason) + 1)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# Up to 20 methods get 20 different colours (tab10, then tab20's lighter shades), and each
# colour a marker of its own, so that no two curves of one plot look alike.
MARKERS = "osD^vP*Xh<>p"


def method_style(index):
    """(colour, marker) of the index-th method of a plot."""
    if index < 10:
        color = plt.get_cmap("tab10")(index)
    else:
        color = plt.get_cmap("tab20")(2 * ((index - 10) % 10) + 1)
    return color, MARKERS[index % len(MARKERS)]


def place_legend(ax, count):
    """Inside the axes for a few methods, to the right of them for many."""
    if count > 6:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8)


def plot_perplexity(path, train_length, mode, methods, series):
    """series[method] = list of (eval_length, mean, spread)."""
    fig, ax = plt.subplots(figsize=(6.4 if len(methods) <= 6 else 8.4, 4.2))
    finite = []
    for index, method in enumerate(methods):
        data = sorted(series.get(method, []))
        if not data:
            continue
        x = [d[0] for d in data]
        y = [d[1] for d in data]
        e = [d[2] for d in data]
        finite += y
        color, marker = method_style(index)
        ax.errorbar(x, y, yerr=e, marker=marker, markersize=4, capsize=3, label=method, color=color)
    lengths = sorted({d[0] for m in methods for d in series.get(m, [])} | {train_length})
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlim(lengths[0] / 1.25, lengths[-1] * 1.25)
    if finite and max(finite) / max(min(finite), 1e-12) > 5:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.axvline(train_length, color="grey", linestyle="--", linewidth=1)
    ax.annotate("training length", xy=(train_length, 0.02), xycoords=("data", "axes fraction"),
                ha="left", va="bottom", fontsize=8, color="grey", xytext=(3, 0), textcoords="offset points")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("trained at L = %d, %s" % (train_length, mode_title(mode)))
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        place_legend(ax, len(methods))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(path, train_length, methods, runs_by_method):
    fig, ax = plt.subplots(figsize=(6.4 if len(methods) <= 6 else 8.4, 4.2))
    for i, method in enumerate(methods):
        color, marker = method_style(i)
        for j, run in enumerate(runs_by_method.get(method, [])):
            train, valid = run["train_loss"], run["valid_loss"]
            label = method if j == 0 else None
            if len(train):
                ax.plot(train[:, 0], train[:, 1], color=color, linewidth=1, alpha=0.8, label=label)
            if len(valid):
                ax.plot(valid[:, 0], valid[:, 1], color=color, linestyle="--", marker=marker, markersize=3)
    valid_losses = [float(v) for runs in runs_by_method.values() for r in runs for v in r["valid_loss"][:, 1]]
    if valid_losses:  # the first steps' loss would squash the rest of the curves
        ax.set_ylim(top=max(valid_losses) * 1.4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("training (solid) and validation (dashed) loss, L = %d" % train_length)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        place_legend(ax, len(methods))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results_path, out_dir):
    header, points, runs = load(results_path)
    os.makedirs(out_dir, exist_ok=True)
    labels = method_labels(runs)
    # Method order: as the grid lists them (by the first run's point index).
    first_index = {}
    for run_id, run in runs.items():
        label = labels[run_id]
        first_index[label] = min(first_index.get(label, 1 << 62), run.get("point_index", 0))
    methods = sorted(first_index, key=lambda m: first_index[m])
    notes = Footnotes()

    # (train_length, mode, eval_length, method) -> perplexities (over seeds), failures
    values = collections.defaultdict(list)
    failures = collections.defaultdict(list)
    for p in points:
        method = labels.get(p["run_id"], p["position"])
        key = (p["train_length"], p["mode"], p["eval_length"], method)
        if p["status"] == "ok":
            values[key].append(p["perplexity"])
        else:
            failures[key].append(p["status"][len("failed: "):] if p["status"].startswith("failed: ") else p["status"])

    name = header.get("sweep_name", "?")
    complete = sum(1 for r in runs.values() if r.get("status") == "complete")
    failed = sum(1 for r in runs.values() if str(r.get("status", "")).startswith("failed"))
    seeds = sorted({r.get("seed") for r in runs.values()})
    machines = sorted({r.get("machine", "") for r in runs.values() if r.get("machine")})
    md = ["# Sweep `%s`" % name, ""]
    md.append("Results file `%s` (spec hash `%s`), written by extrap %s (commit %s), created %s."
              % (results_path, header.get("spec_hash", "?"), header.get("extrap_version", "?"),
                 header.get("git_commit", "?"), header.get("created", "?")))
    md.append("")
    if len(seeds) > 1:
        seed_text = "Seeds %s: values are the mean ± sample standard deviation over seeds." % ", ".join(str(s) for s in seeds)
    else:
        seed_text = "One seed (%s)." % ", ".join(str(s) for s in seeds)
    md.append("%d runs (%d complete, %d failed, %d unfinished); %d evaluation points. %s"
              % (len(runs), complete, failed, len(runs) - complete - failed, len(points), seed_text))
    if machines:
        md.append("Machine: " + "; ".join(machines) + ".")
    md.append("")

    train_lengths = sorted({k[0] for k in list(values) + list(failures)})
    for train_length in train_lengths:
        md += ["## Trained at L = %d" % train_length, ""]
        modes = sorted({k[1] for k in list(values) + list(failures) if k[0] == train_length}, key=mode_order)
        for mode in modes:
            keys = [k for k in list(values) + list(failures) if k[0] == train_length and k[1] == mode]
            lengths = sorted({k[2] for k in keys})
            present = [m for m in methods if any(k[3] == m for k in keys)]
            image = "ppl_L%d_%s.png" % (train_length, mode)
            series = {m: [(l,) + mean_spread(values[(train_length, mode, l, m)])
                          for l in lengths if values.get((train_length, mode, l, m))] for m in present}
            plot_perplexity(os.path.join(out_dir, image), train_length, mode, present, series)
            md += ["### Perplexity, %s" % mode_title(mode), "", "![perplexity, L = %d, %s](%s)" % (train_length, mode, image), ""]
            rows, ratio_rows = [], []
            for l in lengths:
                row, ratio_row = ["%d" % l + (" (= L)" if l == train_length else "")], ["%d" % l]
                for m in present:
                    v = values.get((train_length, mode, l, m))
                    f = failures.get((train_length, mode, l, m))
                    if v:
                        row.append(cell(v) + (" " + notes.mark(f[0]) if f else ""))
                    elif f:
                        row.append("failed " + notes.mark(f[0]))
                    else:
                        row.append("")
                    base = values.get((train_length, mode, train_length, m))
                    ratio_row.append("×%.2f" % (np.mean(v) / np.mean(base)) if v and base else "")
                rows.append(row)
                ratio_rows.append(ratio_row)
            md += [markdown_table(["eval length"] + present, rows), ""]
            if any(values.get((train_length, mode, train_length, m)) for m in present):
                md += ["Perplexity relative to the perplexity at the training length:", "",
                       markdown_table(["eval length"] + present, ratio_rows), ""]

    md += ["## Training", ""]
    for train_length in sorted({r.get("train_length") for r in runs.values()}):
        by_method = collections.defaultdict(list)
        for run_id, run in runs.items():
            if run.get("train_length") == train_length:
                by_method[labels[run_id]].append(run)
        present = [m for m in methods if m in by_method]
        image = "curves_L%d.png" % train_length
        plot_curves(os.path.join(out_dir, image), train_length, present, by_method)
        md += ["![training curves, L = %d](%s)" % (train_length, image), ""]
        rows = []
        for m in present:
            group = by_method[m]
            speed = [r["tokens_per_second"] for r in group
                     if isinstance(r.get("tokens_per_second"), float) and math.isfinite(r["tokens_per_second"])]
            memory = [r["peak_memory_bytes"] / 2**20 for r in group if r.get("peak_memory_bytes")]
            final_valid = [float(r["valid_loss"][-1, 1]) for r in group if len(r["valid_loss"])]
            status = collections.Counter(str(r.get("status")) for r in group)
            rows.append([m, cell(speed) if speed else "", cell(memory) if memory else "",
                         "%d" % group[0].get("num_parameters", 0),
                         cell(final_valid) if final_valid else "",
                         ", ".join("%s ×%d" % (s, c) if c > 1 else s for s, c in status.items())])
        md += ["Training speed and memory at L = %d (tokens/s of training, validation excluded; "
               "peak resident memory of the process during the run):" % train_length, "",
               markdown_table(["method", "tokens/s", "peak memory (MiB)", "parameters",
                               "final valid loss", "status"], rows), ""]

    if notes.reasons:
        md += ["## Failures", ""]
        md += ["[%d] %s" % (i + 1, reason) + "  " for i, reason in enumerate(notes.reasons)]
        md.append("")

    with open(os.path.join(out_dir, "report.md"), "w") as out:
        out.write("\n".join(md))
    return os.path.join(out_dir, "report.md")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="results file written by extrap sweep")
    parser.add_argument("--out", required=True, help="directory for report.md and the plots")
    args = parser.parse_args()
    try:
        path = write_report(args.results, args.out)
    except (OSError, KeyError) as e:
        print("report: cannot read %s: %s" % (args.results, e), file=sys.stderr)
        return 1
    print("report: " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
