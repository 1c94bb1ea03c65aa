#!/usr/bin/env python3
"""A Markdown report, with PNG plots, from the results file of an `extrap sweep`.

    .venv/bin/python analysis/report.py RESULTS.h5 --out DIR      (or: extrap report ...)

Writes DIR/report.md and, next to it:
  ppl_L<train>_<mode>.png   perplexity against evaluation length, one line per method,
                            log-scale x, the training length marked by a vertical line
  longppl_L<train>.png      (files with LongPPL) LongPPL against evaluation length, one line
                            per method
  position_L<train>.png     loss against position in the window (non-overlapping windows),
                            one panel per evaluation length, one line per method
  curves_L<train>.png       training (solid) and validation (dashed) loss against step
  attention_profile_L<train>.png  (files with attention profiles) attention mass as a heat
                            map of layer (rows) by query-key distance bin (columns) at the
                            longest profiled window, the mean over heads and seeds, one panel
                            per method, log colour scale 1e-4 to 1
  retrieval_L<train>_<mode>.png   (files with retrieval points; '+' in the mode written as
                            '_', e.g. retrieval_L16_retrieval_passkey_yarn.png) exact-match
                            accuracy as a heat map of instance length (rows, also as a
                            multiple of L) by depth of the key (columns, percent), one panel
                            per method, colour scale 0 to 1, the accuracy written in each cell;
                            depths that place the key alike at a length (a filler of few
                            sentences: /retrieval's same_as) are one cell spanning their
                            columns, their instances pooled, with where the key went
and in report.md: one table per (training length, mode) in the shape of the ALiBi paper's
extrapolation tables (evaluation lengths as rows, methods as columns), the same as ratios to
the perplexity at the training length, LongPPL by evaluation length (with the number of key
tokens and which model selected them), the loss at window positions below and past the
training length, the early-token-curse table wherever both non-overlapping and sliding
windows were evaluated, for each retrieval mode ("retrieval_<task>[+<variant>]") a section
"Retrieval accuracy, <task>[ + <variant>]" with the heat map and a table of the accuracy over
all depths per method (rows) and instance length (columns): "85% (17/20)", the percentage
rounded to a whole number, then correct/trials; where the models look (attention
profiles: the mass at distances of at least L and the attention entropy by window length,
and the sink's share where a method has one); and training speed and peak memory per method.
Runs that differ only in train.seed are aggregated: "mean ± sample standard deviation" (the
loss by position pools the seeds' tokens; retrieval accuracy sums the seeds' correct and
trials); where the methods have different seeds (only some shards merged), the header says
which each has, and how many of the sweep's grid points the file lacks. A parameter count or
vocabulary size of 0 (a run that failed before its model was built) is "not recorded", never
a number of the model. An evaluation with RoPE scaling (mode "<window>+<variant>") is drawn and tabled as its
own method, "<method> + <variant>". Retrieval points (their perplexity is the answer tokens',
not the text's) are only in the retrieval sections, attention-profile points (mode
"attention_profile") only in theirs; a file without them has none.

Reads only what the file documents (core/results/results_store.h): the /summary table, the
/position_bins, /retrieval, /longppl and /attention_profile tables, and the /runs/<id> attributes and curves. Needs h5py,
numpy and matplotlib: the project's environment (.venv, made by scripts/setup.sh) has them.
An empty file, a file that is not a results file and one of another format version are
refused in one line before anything is read, as is a file whose numbers disagree with each
other (a perplexity that is not exp(nll_sum / scored_tokens), loss-by-position bins that do not
add up to their point): a file changed after extrap wrote it.
"""
import argparse
import collections
import errno
import math
import os
import sys
import types

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
        check_summary_rows(summary, f["runs"])
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
        # Each point's loss-by-position bins (begin, end, nll_sum, scored_tokens), by its row of
        # /summary; absent in files written before extrap 0.3.
        if "position_bins" in f:
            for index, group in rows_by_summary_row(f["position_bins"][...], len(points)):
                points[index]["by_position"] = group
        # Each retrieval point's exact-match counts by depth (depth, trials, correct, ...), by
        # its row of /summary; absent in files without retrieval points (before extrap 0.4).
        if "retrieval" in f:
            for index, group in rows_by_summary_row(f["retrieval"][...], len(points)):
                points[index]["retrieval"] = group
        # LongPPL of a non-overlapping point (short_length, candidates, key_tokens, key_nll_sum,
        # status), one row a point; absent in files without LongPPL (extrap 0.11 and before).
        if "longppl" in f:
            for index, group in rows_by_summary_row(f["longppl"][...], len(points)):
                if len(group) != 1:
                    raise ReadError("/longppl has %d rows for row %d of /summary; a point has at most one"
                                    % (len(group), index))
                points[index]["longppl"] = {name: attribute(group[0][name]) for name in group.dtype.names}
        # An attention-profile point's rows (layer, head, begin, end, mass, entropy, sink); absent
        # in files without profiles (extrap 0.11 and before).
        if "attention_profile" in f:
            for index, group in rows_by_summary_row(f["attention_profile"][...], len(points)):
                points[index]["attention_profile"] = group
    check_point_numbers(points)
    return header, points, runs


# The largest mean NLL whose exp is a finite double: past it, extrap records perplexity inf.
LARGEST_FINITE_LOG = math.log(sys.float_info.max)


def point_name(index, p):
    return "row %d of /summary (run %s, %s at %s)" % (index, p["run_id"], p["mode"], p["eval_length"])


NUMBER_COLUMNS = ("train_length", "seed", "stride", "eval_length", "perplexity", "nll_sum", "scored_tokens",
                  "bits_per_byte", "seconds")


def check_summary_rows(summary, runs):
    """Refuses a /summary that extrap cannot have written, in one line naming the row or column:
    a number column that holds something else, a row of a run /runs does not have, two rows of
    one (run, mode, length), a length below 1, a status other than ok or failed. Such rows would
    be pooled as seeds, or tabled as failures, in silence."""
    for column in NUMBER_COLUMNS:
        if column in summary.dtype.names and summary.dtype[column].kind not in "iuf":
            raise ReadError("column %s of /summary holds %s, not numbers" % (column, summary.dtype[column]))
    seen = {}
    for index, row in enumerate(summary):
        run_id, mode, length = text(row["run_id"]), text(row["mode"]), int(row["eval_length"])
        if run_id not in runs:
            raise ReadError("row %d of /summary is of run %s, which /runs does not have" % (index, run_id))
        if length < 1 or int(row["train_length"]) < 1:
            raise ReadError("row %d of /summary (run %s, %s): lengths %d and %d; both are at least 1"
                            % (index, run_id, mode, int(row["train_length"]), length))
        status = text(row["status"])
        if status != "ok" and not status.startswith("failed: "):
            raise ReadError("row %d of /summary (run %s, %s at %d): status '%s'; extrap writes 'ok' or "
                            "'failed: <reason>'" % (index, run_id, mode, length, status))
        key = (run_id, mode, length)
        if key in seen:
            raise ReadError("rows %d and %d of /summary are both run %s, %s at %d; the file was changed "
                            "after extrap wrote it" % (seen[key], index, run_id, mode, length))
        seen[key] = index


def check_point_numbers(points):
    """Refuses a file whose numbers disagree with each other, in one line naming the row: a
    point recorded ok (text or retrieval) has a positive token count, a finite NLL sum and the
    perplexity exp(nll_sum / scored_tokens) (inf only where the mean NLL overflows a double),
    and its loss-by-position bins add up to its NLL sum and token count. extrap writes each
    from the same sums; a file where they differ was changed after it was written."""
    for index, p in enumerate(points):
        if p["status"] != "ok" or is_profile_mode(p["mode"]):
            continue
        name = point_name(index, p)
        nll, tokens, ppl = p["nll_sum"], p["scored_tokens"], p["perplexity"]
        if not tokens > 0 or not math.isfinite(nll):
            raise ReadError("%s: status ok but nll_sum %r over scored_tokens %r" % (name, nll, tokens))
        mean = nll / tokens
        expected = math.exp(mean) if mean <= LARGEST_FINITE_LOG else math.inf
        if not (ppl == expected or (math.isfinite(ppl) and math.isfinite(expected)
                                    and abs(ppl - expected) <= 1e-9 * expected)):
            raise ReadError("%s: perplexity %r is not exp(nll_sum / scored_tokens) = %r; the file was "
                            "changed after extrap wrote it" % (name, ppl, expected))
        bins = p.get("by_position")
        if bins is not None and len(bins):
            bin_nll, bin_tokens = float(np.sum(bins["nll_sum"])), int(np.sum(bins["scored_tokens"]))
            if bin_tokens != tokens or abs(bin_nll - nll) > 1e-9 * max(abs(nll), 1.0):
                raise ReadError("%s: its /position_bins add up to nll_sum %r over %d tokens, the row "
                                "says %r over %d; the file was changed after extrap wrote it"
                                % (name, bin_nll, bin_tokens, nll, tokens))


def rows_by_summary_row(table, count):
    """(index, the rows of `table` whose summary_row is index) for each row of /summary that
    has rows there, the rows in file order."""
    table = table[np.argsort(table["summary_row"], kind="stable")]
    starts = np.searchsorted(table["summary_row"], np.arange(count), side="left")
    ends = np.searchsorted(table["summary_row"], np.arange(count), side="right")
    return [(index, table[starts[index]:ends[index]]) for index in range(count) if ends[index] > starts[index]]


def is_profile_mode(mode):
    """An attention-profile point's mode (where the model looks, not a perplexity)."""
    return mode == "attention_profile"


def is_retrieval_mode(mode):
    """A retrieval point's mode: "retrieval_<task>", then "+<variant>" for RoPE scaling."""
    return mode.startswith("retrieval_")


def split_mode(mode):
    """("nonoverlapping", "yarn") for "nonoverlapping+yarn"; the variant is "" without one."""
    window, _, variant = mode.partition("+")
    return window, variant


def position_options(grid):
    """A grid point's position options other than the name ({} when the grid has none)."""
    value = grid.get("position")
    return {k: v for k, v in value.items() if k != "name"} if isinstance(value, dict) else {}


def pattern_label(layers):
    """A grid's `layers` value as the sweep names it in run ids: the kinds over one period,
    repeats counted ("rope_swa3+nope")."""
    pattern = layers.get("pattern", []) if isinstance(layers, dict) else []
    parts, i = [], 0
    while i < len(pattern):
        j = i
        while j < len(pattern) and pattern[j] == pattern[i]:
            j += 1
        parts.append("%s%s" % (pattern[i], j - i if j - i > 1 else ""))
        i = j
    return "+".join(parts) if parts else repr(layers)


def method_labels(runs):
    """run_id -> the label its numbers are reported under: the position method, plus any grid
    value other than the training length and the seed, plus the method's options wherever two
    runs of the same method differ in them (e.g. "rotary" and "rotary (randomize_max=512)"), so
    that only runs of one configuration are ever pooled as seeds. A run's position is the
    label of its layer pattern where it has one ("rotary (window 8) x3, none"); a grid's
    `layers` values (whole patterns, which name their methods' options only in the grid) add
    the pattern's name wherever two runs of one label differ in them."""
    grids = {run_id: parse_grid_point(run.get("grid_point", "{}")) for run_id, run in runs.items()}
    options_by_method = collections.defaultdict(list)
    for run_id, run in runs.items():
        options_by_method[run.get("position", "?")].append(position_options(grids[run_id]))
    layers_by_method = collections.defaultdict(set)
    for run_id, run in runs.items():
        if "layers" in grids[run_id]:
            layers_by_method[run.get("position", "?")].add(repr(grids[run_id]["layers"]))
    varying = {}
    for method, options in options_by_method.items():
        keys = set().union(*options)
        varying[method] = sorted(k for k in keys if len({repr(o.get(k)) for o in options}) > 1)
    labels = {}
    for run_id, run in runs.items():
        method, grid = run.get("position", "?"), grids[run_id]
        if run.get("released"):  # a released checkpoint: its name, and the method it was mapped to
            labels[run_id] = "%s (%s)" % (grid.get("released", run_id), method)
            continue
        options = position_options(grid)
        extra = ["%s=%s" % (k, options[k]) for k in varying[method] if k in options]
        for key, value in grid.items():
            if key == "layers":
                if len(layers_by_method[method]) > 1:
                    extra.append("layers=" + pattern_label(value))
            elif key not in AXIS_KEYS:
                extra.append("%s=%s" % (key.split(".")[-1], value))
        labels[run_id] = method + (" (" + ", ".join(extra) + ")" if extra else "")
    return labels


def window_start_bin(begin, end):
    """Where a bin of window positions [begin, end) is drawn: its middle position, counted
    from 1 (so that position 0 sits at 1 on the log axis)."""
    return (begin + end - 1) / 2.0 + 1.0


def failure_reason(status):
    """The reason of a failed point's status, "failed: <reason>"."""
    return status[len("failed: "):] if status.startswith("failed: ") else status


def streaming_cache(mode):
    """(sinks, cache) of a StreamingLLM mode "streaming_<sinks>_<cache>", else None."""
    if not mode.startswith("streaming_"):
        return None
    sinks, cache = mode[len("streaming_"):].split("_")
    return int(sinks), int(cache)


def mode_order(mode):
    if mode == "nonoverlapping":
        return (0, 0, 0)
    streaming = streaming_cache(mode)
    if streaming:
        return (2, streaming[1], streaming[0])
    return (1, int(mode.split("_", 1)[1]), 0)


def mode_title(mode):
    if mode == "nonoverlapping":
        return "non-overlapping windows"
    streaming = streaming_cache(mode)
    if streaming:
        return "StreamingLLM, a cache of %d tokens with %d sinks (each window one stream)" % (streaming[1], streaming[0])
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


# Line styles cycle with a period prime to the colours' and markers', so that two methods
# whose curves overlap still differ in pattern, not only in colour.
LINESTYLES = ["-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (8, 3))]


def method_style(index):
    """(colour, marker) of the index-th method of a plot."""
    if index < 10:
        color = plt.get_cmap("tab10")(index)
    else:
        color = plt.get_cmap("tab20")(2 * ((index - 10) % 10) + 1)
    return color, MARKERS[index % len(MARKERS)]


def method_linestyle(index):
    return LINESTYLES[index % len(LINESTYLES)]


def place_legend(ax, count):
    """Inside the axes for a few methods, to the right of them for many."""
    if count > 6:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8)


def plot_perplexity(path, train_length, mode, methods, series, ylabel="perplexity", title=None):
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
    ax.set_ylabel(ylabel)
    ax.set_title("trained at L = %d, %s" % (train_length, title or mode_title(mode)))
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        place_legend(ax, len(methods))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_by_position(path, train_length, lengths, methods, series):
    """series[(eval_length, method)] = (x, mean NLL) arrays: one panel per evaluation length."""
    columns = min(3, len(lengths))
    rows = (len(lengths) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns + (2.0 if len(methods) > 6 else 0), 3.4 * rows),
                             squeeze=False)
    for panel, length in enumerate(lengths):
        ax = axes[panel // columns][panel % columns]
        for index, method in enumerate(methods):
            data = series.get((length, method))
            if data is None:
                continue
            color, marker = method_style(index)
            ax.plot(data[0], data[1], marker=marker, markersize=3, linewidth=1, color=color, label=method)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        if length > train_length:
            ax.axvline(train_length, color="grey", linestyle="--", linewidth=1)
        ax.set_title("eval length %d" % length, fontsize=10)
        ax.set_xlabel("position in the window")
        ax.set_ylabel("mean NLL (nats)")
        ax.grid(True, which="both", alpha=0.3)
    for panel in range(len(lengths), rows * columns):
        axes[panel // columns][panel % columns].axis("off")
    handles, names = axes[0][0].get_legend_handles_labels()
    if handles:
        axes[0][0].legend(fontsize=7)
    fig.suptitle("loss against position in the window, trained at L = %d (dashed: L)" % train_length, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pooled_bins(bin_arrays):
    """The seeds' bins pooled: (x, mean NLL, begin, end, nll_sum, tokens) per bin range."""
    sums = collections.OrderedDict()
    for bins in bin_arrays:
        for b in bins:
            key = (int(b["begin"]), int(b["end"]))
            nll, tokens = sums.get(key, (0.0, 0))
            sums[key] = (nll + float(b["nll_sum"]), tokens + int(b["scored_tokens"]))
    keys = sorted(sums)
    x = np.array([window_start_bin(b, e) for b, e in keys])
    y = np.array([sums[k][0] / sums[k][1] for k in keys])
    return x, y, keys, sums


def plot_curves(path, train_length, methods, runs_by_method):
    """Every point of every curve is drawn: the loss axis is logarithmic, so the first steps'
    loss (ln V and more) does not squash the rest; each method has its own colour and line
    pattern (training loss), and its validation losses are its markers."""
    fig, ax = plt.subplots(figsize=(6.4 if len(methods) <= 6 else 8.4, 4.2))
    for i, method in enumerate(methods):
        color, marker = method_style(i)
        for j, run in enumerate(runs_by_method.get(method, [])):
            train, valid = run["train_loss"], run["valid_loss"]
            label = method if j == 0 else None
            if len(train):
                ax.plot(train[:, 0], train[:, 1], color=color, linewidth=1.2, alpha=0.85,
                        linestyle=method_linestyle(i), label=label)
            if len(valid):
                ax.plot(valid[:, 0], valid[:, 1], color=color, linestyle="none", marker=marker,
                        markersize=5, markerfacecolor="none", markeredgewidth=1.2)
    losses = [float(v) for runs in runs_by_method.values() for r in runs
              for curve in ("train_loss", "valid_loss") for v in r[curve][:, 1] if v > 0]
    if losses:
        ax.set_yscale("log")
        ax.set_ylim(min(losses) / 1.05, max(losses) * 1.05)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("training loss (lines) and validation loss (markers), L = %d" % train_length)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        place_legend(ax, len(methods))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def by_position_section(out_dir, train_length, methods, bins):
    """The loss against position in non-overlapping windows: a figure with one panel per
    evaluation length, and a table of the mean NLL at window positions below the training
    length against positions at or past it (whether a method gets anything from the context
    beyond what it was trained on)."""
    keys = [k for k in bins if k[0] == train_length and k[1] == "nonoverlapping"]
    if not keys:
        return []
    lengths = sorted({k[2] for k in keys})
    present = [m for m in methods if any(k[3] == m for k in keys)]
    series = {}
    for length in lengths:
        for method in present:
            arrays = bins.get((train_length, "nonoverlapping", length, method))
            if arrays:
                series[(length, method)] = pooled_bins(arrays)[:2]
    image = "position_L%d.png" % train_length
    plot_by_position(os.path.join(out_dir, image), train_length, lengths, present, series)
    md = ["### Loss by position in the window (non-overlapping windows)", "",
          "![loss by position, L = %d](%s)" % (train_length, image), ""]
    for length in [l for l in lengths if l > train_length]:
        row_cells = []
        for method in present:
            arrays = bins.get((train_length, "nonoverlapping", length, method))
            if not arrays:
                continue
            _, _, ranges, sums = pooled_bins(arrays)
            below = [sums[r] for r in ranges if r[1] <= train_length]
            past = [sums[r] for r in ranges if r[0] >= train_length]
            if not below or not past:
                continue
            nll_below = sum(n for n, _ in below) / sum(t for _, t in below)
            nll_past = sum(n for n, _ in past) / sum(t for _, t in past)
            row_cells.append([method, "%.4f" % nll_below, "%.4f" % nll_past, "%+.4f" % (nll_past - nll_below)])
        if row_cells:
            md += ["Mean NLL (nats) at eval length %d, by window position: below L = %d, and at or past it "
                   "(negative change: the later tokens gain from context beyond L):" % (length, train_length), "",
                   markdown_table(["method", "positions < %d" % train_length, "positions >= %d" % train_length,
                                   "change"], row_cells), ""]
    return md


def early_token_section(train_length, methods, values, modes):
    """The ALiBi paper's early-token curse (appendix B): how much of each method's change in
    perplexity past L under non-overlapping windows disappears under sliding windows, which
    give every scored token at least L - S tokens of context."""
    if "nonoverlapping" not in modes:
        return []
    md = []
    for mode in [m for m in modes if m.startswith("sliding_")]:
        rows = []
        for method in methods:
            base_no = values.get((train_length, "nonoverlapping", train_length, method))
            base_sl = values.get((train_length, mode, train_length, method))
            if not base_no or not base_sl:
                continue
            lengths = sorted({k[2] for k in values if k[0] == train_length and k[3] == method and k[2] > train_length})
            for length in lengths:
                no = values.get((train_length, "nonoverlapping", length, method))
                sl = values.get((train_length, mode, length, method))
                if not no or not sl:
                    continue
                d_no = float(np.mean(no)) - float(np.mean(base_no))
                d_sl = float(np.mean(sl)) - float(np.mean(base_sl))
                # Only a gain (a drop in perplexity) can be explained away by early tokens.
                gone = "%.0f%%" % (100.0 * (d_no - d_sl) / d_no) if d_no < 0 else "no gain"
                rows.append([method, "%d" % length, "%+.3f" % d_no, "%+.3f" % d_sl, gone])
        if rows:
            md += ["### Early-token curse: non-overlapping against %s" % mode_title(mode), "",
                   "The change in perplexity from L = %d to each longer evaluation length, under non-overlapping "
                   "windows and under sliding windows (stride %s), and the share of the non-overlapping change "
                   "that sliding windows remove, where non-overlapping windows show a gain: a method whose gain "
                   "disappears (100%% or more) only scored fewer early tokens; one that keeps it used the longer "
                   "context." % (train_length, mode.split("_", 1)[1]),
                   "", markdown_table(["method", "eval length", "change, non-overlapping", "change, sliding",
                                       "share removed by sliding"], rows), ""]
    return md


def count_text(value):
    """A count, or a mean of counts over seeds: "3", "2.5"."""
    return "%d" % value if float(value).is_integer() else "%.1f" % value


def longppl_selector(header):
    """Which model selected the key tokens, from the sweep spec's eval.longppl."""
    try:
        spec = yaml.safe_load(header.get("sweep_spec", "")) or {}
        settings = (spec.get("eval") or {}).get("longppl") or {}
    except yaml.YAMLError:
        settings = {}
    reference = settings.get("reference") or ""
    alpha, beta = settings.get("alpha", "2"), settings.get("beta", "-2")
    who = "the run `%s` (the same tokens for every method)" % reference if reference else "each model itself"
    return who, alpha, beta


def longppl_section(out_dir, train_length, methods, longppl, failures, header, notes):
    """LongPPL (Fang et al., ICLR 2025) of the non-overlapping points at this training length:
    a table (eval lengths by methods: LongPPL with the key tokens in parentheses) and a plot.
    longppl[(train_length, eval_length, method)] = each seed's /longppl row; failures likewise,
    their reasons."""
    keys = [k for k in list(longppl) + list(failures) if k[0] == train_length]
    if not keys:
        return []
    lengths = sorted({k[1] for k in keys})
    present = [m for m in methods if any(k[2] == m for k in keys)]
    shorts = sorted({int(r["short_length"]) for k in keys for r in longppl.get(k, [])})
    who, alpha, beta = longppl_selector(header)
    series, rows = {}, []
    for l in lengths:
        row = [eval_length_label(l, train_length)]
        for m in present:
            records = longppl.get((train_length, l, m), [])
            values = [math.exp(r["key_nll_sum"] / r["key_tokens"]) for r in records if r["key_tokens"] > 0]
            keys_counted = [int(r["key_tokens"]) for r in records]
            f = failures.get((train_length, l, m))
            if values:
                series.setdefault(m, []).append((l,) + mean_spread(values))
                text = "%s (%s)" % (cell(values), count_text(np.mean(keys_counted)))
                if len(values) < len(records):
                    text += " %d of %d seeds without key tokens" % (len(records) - len(values), len(records))
            elif records:
                text = "no key token (of %s)" % count_text(np.mean([int(r["candidates"]) for r in records]))
            else:
                text = ""
            if f:
                text = (text + " " if text else "failed ") + notes.mark(f[0])
            row.append(text)
        rows.append(row)
    image = "longppl_L%d.png" % train_length
    plot_perplexity(os.path.join(out_dir, image), train_length, "nonoverlapping", present, series,
                    ylabel="LongPPL", title="LongPPL over the key tokens")
    return ["### LongPPL (non-overlapping windows)", "",
            "Perplexity over the key tokens only (Fang et al., ICLR 2025): the targets whose "
            "log-probability with the whole window beats the one with the last K = %s tokens by more "
            "than alpha = %s nats and is above beta = %s. Key tokens selected by %s. Each cell: "
            "LongPPL, then the number of key tokens (mean over seeds) in parentheses."
            % (", ".join(str(k) for k in shorts) or "?", alpha, beta, who), "",
            "![LongPPL, L = %d](%s)" % (train_length, image), "",
            markdown_table(["eval length"] + present, rows), ""]


def retrieval_title(mode):
    """"passkey" for "retrieval_passkey", "passkey + yarn" for "retrieval_passkey+yarn"."""
    task, variant = split_mode(mode)
    return task[len("retrieval_"):] + (" + " + variant if variant else "")


def eval_length_label(l, train_length):
    """An evaluation length as a table row names it: "64 (= L)" at the training length."""
    return "%d" % l + (" (= L)" if l == train_length else "")


def length_text(length, train_length):
    """An instance length with its multiple of the training length: "256 (2x)"."""
    return "%d (%gx)" % (length, length / train_length)


def pooled_retrieval(cell_arrays):
    """The seeds' /retrieval rows of one point pooled: depth -> {"correct", "trials", "same_as",
    "placed"}: same_as the asked depth whose row places every key where this depth's do (its own
    where none earlier does, or where the file did not record it: extrap 0.11 and before), placed
    the trial-weighted mean of where the keys went (percent; NaN where not recorded)."""
    counts = {}
    for cells in cell_arrays:
        names = cells.dtype.names or ()
        for c in cells:
            depth = float(c["depth"])
            count = counts.setdefault(depth, {"correct": 0, "trials": 0, "same_as": depth,
                                              "placed_sum": 0.0, "placed_trials": 0})
            count["correct"] += int(c["correct"])
            count["trials"] += int(c["trials"])
            if "same_as" in names and math.isfinite(float(c["same_as"])):
                count["same_as"] = float(c["same_as"])
                count["placed_sum"] += float(c["placed_depth"]) * int(c["trials"])
                count["placed_trials"] += int(c["trials"])
    for count in counts.values():
        trials = count.pop("placed_trials")
        count["placed"] = count.pop("placed_sum") / trials if trials else float("nan")
    return counts


def placement_groups(by_depth):
    """The measurements of one point's pooled rows (pooled_retrieval): a list of (asked depths,
    correct, trials, placed), one per group of depths that place the key alike, in depth order."""
    groups = {}
    for depth in sorted(by_depth):
        c = by_depth[depth]
        g = groups.setdefault(c["same_as"], [[], 0, 0, 0.0, 0])
        g[0].append(depth)
        g[1] += c["correct"]
        g[2] += c["trials"]
        if math.isfinite(c["placed"]):
            g[3] += c["placed"] * c["trials"]
            g[4] += c["trials"]
    return [(d, correct, trials, placed / n if n else float("nan"))
            for d, correct, trials, placed, n in groups.values()]


def plot_retrieval(path, train_length, title, lengths, depths, methods, counts, failed):
    """Exact-match accuracy by instance length (rows) and depth (columns), one panel per method:
    counts[(length, method)] = pooled_retrieval's rows; failed: the (length, method) cells
    with failures and no finished point, written "failed". Depths that place the key alike at a
    length are one measurement: one cell spanning their columns, with the depth it was placed at."""
    columns = min(3, len(methods))
    rows = (len(methods) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, squeeze=False, constrained_layout=True,
                             figsize=(0.75 * len(depths) * columns + 2.6, (0.45 * len(lengths) + 1.3) * rows))
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("#dddddd")  # not evaluated, or failed
    image = None
    for panel, method in enumerate(methods):
        ax = axes[panel // columns][panel % columns]
        accuracy = np.full((len(lengths), len(depths)), np.nan)
        labels = []  # (row, first column, last column, accuracy, placed)
        for i, length in enumerate(lengths):
            by_depth = counts.get((length, method), {})
            for group, correct, trials, placed in placement_groups(by_depth):
                columns_of = [depths.index(d) for d in group if d in depths]
                if trials and columns_of:
                    accuracy[i, columns_of] = correct / trials
                    labels.append((i, min(columns_of), max(columns_of), correct / trials,
                                   placed if len(group) > 1 else None))
        image = ax.imshow(np.ma.masked_invalid(accuracy), cmap=cmap, vmin=0.0, vmax=1.0,
                          origin="lower", aspect="auto")
        for i, first, last, value, placed in labels:
            color = "black" if value > 0.6 else "white"
            ax.text((first + last) / 2, i, "%.2f" % value, ha="center", va="center", fontsize=8, color=color)
            if placed is not None:  # one measurement over several columns: say where the keys went
                ax.text((first + last) / 2, i - 0.3, "one cell, key at %.0f%%" % placed if math.isfinite(placed)
                        else "one cell", ha="center", va="center", fontsize=6, color=color)
                for edge in (first - 0.5, last + 0.5):
                    ax.plot([edge, edge], [i - 0.5, i + 0.5], color="white", linewidth=1.5)
        for i, length in enumerate(lengths):
            if (length, method) in failed:
                for j in range(len(depths)):
                    ax.text(j, i, "failed", ha="center", va="center", fontsize=7, color="black")
        ax.set_xlim(-0.5, len(depths) - 0.5)  # the cells' edges drawn above do not widen the axes
        ax.set_ylim(-0.5, len(lengths) - 0.5)
        ax.set_xticks(range(len(depths)))
        ax.set_xticklabels(["%g" % d for d in depths])
        ax.set_yticks(range(len(lengths)))
        ax.set_yticklabels([length_text(l, train_length) for l in lengths])
        ax.set_xlabel("depth of the key asked (%)")
        ax.set_ylabel("instance length (tokens)")
        ax.set_title(method, fontsize=10)
    for panel in range(len(methods), rows * columns):
        axes[panel // columns][panel % columns].axis("off")
    fig.colorbar(image, ax=[a for row in axes for a in row], label="exact-match accuracy", shrink=0.9)
    fig.suptitle("retrieval (%s), trained at L = %d" % (title, train_length), fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def placement_text(counts, lengths, train_length):
    """The lengths at which asked depths place the key alike, in words: "At 128 (2x) depths 0,
    25 and 50 (at 16% of the filler), and 75 and 100 (at 100%) place it alike." ("" where every
    depth is its own measurement)."""
    sentences = []
    for l in lengths:
        groups = {}
        for (length, _), by_depth in counts.items():
            if length == l:
                for depths, _, _, placed in placement_groups(by_depth):
                    if len(depths) > 1:
                        groups[tuple(depths)] = placed
        if not groups:
            continue
        parts = []
        for depths, placed in sorted(groups.items()):
            where = ("%.0f%%" % placed if math.isfinite(placed) else "one place") + ("" if parts else " of the filler")
            parts.append("%s (at %s)" % (", ".join("%g" % d for d in depths[:-1]) + " and %g" % depths[-1], where))
        sentences.append("At %s depths %s place it alike." % (length_text(l, train_length), ", and ".join(parts)))
    if not sentences:
        return ""
    return (" The key goes at the filler's sentence boundary nearest the asked depth, and a short filler has few. "
            + " ".join(sentences) + " Depths that place the key alike are one measurement, drawn as one cell with "
            "their instances pooled.")


def retrieval_section(out_dir, train_length, methods, retrieval, failures, notes):
    """Per retrieval mode at this training length: the heat map of accuracy by length and
    depth, and the accuracy over all depths per method and length. retrieval[(train_length,
    mode, length, method)] = each seed's /retrieval rows; failures likewise, their reasons."""
    keys = [k for k in list(retrieval) + list(failures) if k[0] == train_length]
    md = []
    for mode in sorted({k[1] for k in keys}):
        mode_keys = [k for k in keys if k[1] == mode]
        lengths = sorted({k[2] for k in mode_keys})
        present = [m for m in methods if any(k[3] == m for k in mode_keys)]
        counts = {(k[2], k[3]): pooled_retrieval(retrieval[k]) for k in mode_keys if retrieval.get(k)}
        failed = {(k[2], k[3]) for k in mode_keys if failures.get(k) and not retrieval.get(k)}
        depths = sorted({d for by_depth in counts.values() for d in by_depth})
        title = retrieval_title(mode)
        image = "retrieval_L%d_%s.png" % (train_length, mode.replace("+", "_"))
        plot_retrieval(os.path.join(out_dir, image), train_length, title, lengths, depths or [0.0],
                       present, counts, failed)
        rows = []
        for m in present:
            row = [m]
            for l in lengths:
                by_depth = counts.get((l, m))
                f = failures.get((train_length, mode, l, m))
                correct = sum(c["correct"] for c in by_depth.values()) if by_depth else 0
                trials = sum(c["trials"] for c in by_depth.values()) if by_depth else 0
                if trials:
                    row.append("%.0f%% (%d/%d)" % (100.0 * correct / trials, correct, trials)
                               + (" " + notes.mark(f[0]) if f else ""))
                elif f:
                    row.append("failed " + notes.mark(f[0]))
                else:
                    row.append("")
            rows.append(row)
        per_depth = sorted({int(c["trials"]) for k in mode_keys for cells in retrieval.get(k, [])
                            for c in cells})
        instances = ("%d" % per_depth[0] if len(per_depth) == 1 else
                     "%d to %d" % (per_depth[0], per_depth[-1]) if per_depth else "no")
        pooled = any(len(retrieval.get(k, [])) > 1 for k in mode_keys)
        md += ["### Retrieval accuracy, %s" % title, "",
               "![retrieval, L = %d, %s](%s)" % (train_length, mode, image), "",
               markdown_table(["method"] + [length_text(l, train_length) for l in lengths], rows), "",
               "Counted: exact match of greedy decoding (an instance is correct when greedy decoding after "
               "the question gives exactly the answer's tokens: the number and its full stop), over all depths "
               "(%s%%); %s instances per length and depth in each run, the same instances for every method%s.%s"
               % (", ".join("%g" % d for d in depths), instances,
                  "; the counts are summed over seeds" if pooled else "",
                  placement_text(counts, lengths, train_length)), ""]
    return md


def distance_label(begin, end):
    """A distance bin [begin, end) as a tick names it: "0", "2-3", "16-63"."""
    return "%d" % begin if end - begin == 1 else "%d-%d" % (begin, end - 1)


def share_cell(values):
    """A share of the attention, mean ± spread over seeds, 3 significant digits: a small mass
    (0.00123) is the finding, not a rounding to 0.00."""
    mean, spread = mean_spread(values)
    return "%.3g" % mean + (" ± %.2g" % spread if len(values) > 1 else "")


def profile_arrays(rows):
    """One point's /attention_profile rows as (edges, mass, entropy, sink): mass and entropy
    (layers, heads, bins), sink (layers, heads)."""
    layers, heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    bins = len(rows) // (layers * heads)
    order = np.lexsort((rows["begin"], rows["head"], rows["layer"]))
    rows = rows[order]
    edges = [int(b) for b in rows["begin"][:bins]] + [int(rows["end"][bins - 1])]
    shape = (layers, heads, bins)
    return (edges, rows["mass"].reshape(shape), rows["entropy"].reshape(shape),
            rows["sink"].reshape(shape)[:, :, 0])


def plot_profile(path, train_length, length, methods, maps):
    """Attention mass by distance bin (columns) and layer (rows), the mean over heads and
    seeds, one panel per method: maps[method] = (edges, (layers, bins) mass)."""
    columns = min(3, len(methods))
    rows = (len(methods) + columns - 1) // columns
    widest = max(len(maps[m][0]) - 1 for m in methods)
    deepest = max(maps[m][1].shape[0] for m in methods)
    fig, axes = plt.subplots(rows, columns, squeeze=False, constrained_layout=True,
                             figsize=(0.5 * widest * columns + 2.6, (0.4 * deepest + 1.5) * rows))
    cmap = plt.get_cmap("magma").copy()
    cmap.set_bad(cmap(0.0))  # no weight at all: the floor's colour
    norm = matplotlib.colors.LogNorm(vmin=1e-4, vmax=1.0, clip=True)
    image = None
    for panel, method in enumerate(methods):
        ax = axes[panel // columns][panel % columns]
        edges, mass = maps[method]
        image = ax.imshow(np.ma.masked_less_equal(mass, 0.0), cmap=cmap, norm=norm, origin="upper",
                          aspect="auto")
        ax.set_xticks(range(len(edges) - 1))
        ax.set_xticklabels([distance_label(edges[b], edges[b + 1]) for b in range(len(edges) - 1)],
                           rotation=60, fontsize=7)
        ax.set_yticks(range(mass.shape[0]))
        ax.set_yticklabels(["%d" % l for l in range(mass.shape[0])])
        if train_length in edges[1:-1]:  # the training length: distances past it right of the line
            ax.axvline(edges.index(train_length) - 0.5, color="cyan", linestyle="--", linewidth=1)
        ax.set_xlabel("query-key distance (tokens)")
        ax.set_ylabel("layer")
        ax.set_title(method, fontsize=10)
    for panel in range(len(methods), rows * columns):
        axes[panel // columns][panel % columns].axis("off")
    fig.colorbar(image, ax=[a for row in axes for a in row], label="attention mass",
                 shrink=0.9)
    fig.suptitle("where the models look at T = %d, trained at L = %d" % (length, train_length), fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile_section(out_dir, train_length, methods, profiles, failures, notes):
    """Where each model looks at this training length: tables of the attention mass at
    distances of at least L and of the attention entropy by window length, and a heat map of
    the mass by distance and layer at the longest window. profiles[(train_length, length,
    method)] = each seed's /attention_profile rows; failures likewise, their reasons."""
    keys = [k for k in list(profiles) + list(failures) if k[0] == train_length]
    if not keys:
        return []
    lengths = sorted({k[1] for k in keys})
    present = [m for m in methods if any(k[2] == m for k in keys)]
    # Each point's rows as arrays, once: the tables and the heat map read them.
    arrays = {k: [profile_arrays(rows) for rows in seeds] for k, seeds in profiles.items() if k[0] == train_length}
    past_rows, entropy_rows, sink_rows = [], [], []
    any_sink = False
    for l in lengths:
        past_row, entropy_row, sink_row = [eval_length_label(l, train_length)], [eval_length_label(l, train_length)], [eval_length_label(l, train_length)]
        for m in present:
            seeds = arrays.get((train_length, l, m), [])
            f = failures.get((train_length, l, m))
            mark = (" " + notes.mark(f[0])) if f else ""
            if not seeds:
                for row in (past_row, entropy_row, sink_row):
                    row.append("failed" + mark if f else "")
                continue
            past = [float(mass[:, :, [b for b in range(len(edges) - 1) if edges[b] >= train_length]].sum(-1).mean())
                    for edges, mass, _, _ in seeds]
            entropy = [float(e.sum(-1).mean()) for _, _, e, _ in seeds]
            sink = [float(k.mean()) for _, _, _, k in seeds]
            any_sink = any_sink or any(v > 0 for v in sink)
            past_row.append(share_cell(past) + mark)
            entropy_row.append(cell(entropy) + mark)
            sink_row.append(share_cell(sink) + mark)
        entropy_rows.append(entropy_row)
        sink_rows.append(sink_row)
        if l > train_length:
            past_rows.append(past_row)
    md = ["### Where the models look (attention by query-key distance)", "",
          "Each model's attention weights over the first windows of the evaluated split, averaged over "
          "every query (`extrap inspect attention` prints one run's by layer and head).", ""]
    longest = lengths[-1]
    maps = {}
    for m in present:
        seeds = arrays.get((train_length, longest, m), [])
        if seeds and all(s[0] == seeds[0][0] for s in seeds):
            maps[m] = (seeds[0][0], np.mean([mass.mean(1) for _, mass, _, _ in seeds], axis=0))
    if maps:
        image = "attention_profile_L%d.png" % train_length
        plot_profile(os.path.join(out_dir, image), train_length, longest, [m for m in present if m in maps], maps)
        md += ["![attention mass by distance and layer, T = %d, L = %d](%s)" % (longest, train_length, image), "",
               "The heat map: at T = %d, the mean over heads (and seeds) of each layer's attention mass in each "
               "distance bin, log colour scale from 1e-4; the dashed line is the training length." % longest, ""]
    if past_rows:
        md += ["Attention mass at distances of at least L = %d (the mean over layers and heads of each "
               "query's weights there; the rest is nearer):" % train_length, "",
               markdown_table(["eval length"] + present, past_rows), ""]
    md += ["Attention entropy (nats; the mean over layers, heads and queries of -sum p ln p over the keys):", "",
           markdown_table(["eval length"] + present, entropy_rows), ""]
    if any_sink:
        md += ["Share of attention on the learned sink logit (the mean over layers and heads):", "",
               markdown_table(["eval length"] + present, sink_rows), ""]
    return md


class ReadError(Exception):
    """The results file could not be read (the original error is args[0])."""


def distinct_text(values, missing="?"):
    """The distinct values, in order of first appearance, joined; `missing` for none."""
    seen = [v for i, v in enumerate(values) if v not in values[:i]]
    return " / ".join(str(v) for v in seen) if seen else missing


def without_unrecorded(entries):
    """(identity, vocabulary size) entries less those of size 0 (not recorded: a run that
    failed before it read its corpus, a file from before sizes were recorded) whose identity
    has a recorded size in another entry: not recording a size makes no vocabulary of its own."""
    return [e for e in entries if e[1] or not any(o[1] and o[0] == e[0] for o in entries)]


def corpora_text(runs, configs):
    """The distinct corpora of the runs: their path, tokenizer and vocabulary size, and the
    split fractions."""
    corpora = []
    for run_id, config in configs.items():
        data = config.get("data") or {}
        tokenizer = data.get("tokenizer", "?")
        if data.get("tokenizer_model"):
            tokenizer += " (`%s`)" % data["tokenizer_model"]
        fractions = data.get("split_fractions")
        split = (", split %s (train/valid/test)" % "/".join("%g" % float(f) for f in fractions)
                 if fractions else "")
        corpora.append((("`%s`, %s tokens" % (data.get("path", "?"), tokenizer), split),
                        runs[run_id].get("vocab_size") or 0))
    return distinct_text(["%s (vocabulary %s)%s" % (corpus, "{:,}".format(vocab) if vocab else "not recorded", split)
                          for (corpus, split), vocab in without_unrecorded(corpora)])


def model_shape(m):
    """A run's model in words: layers, width, heads and feed-forward, then each architecture key
    that is not GPT-2's default (core/model/config.h): key and value heads, the gated
    feed-forward, RMSNorm, no biases, the block, QK-norm, the embedding norm, an untied head.
    d_ffn 0 is given as the width its rule makes (ModelConfig::ffn_width)."""
    d_model, heads = m.get("d_model", "?"), m.get("heads", "?")
    ffn, d_ffn = m.get("ffn", "mlp"), m.get("d_ffn", "?")
    if d_ffn == 0 and isinstance(d_model, int):
        if ffn == "mlp":
            d_ffn = 4 * d_model
        else:
            multiple = int(m.get("ffn_multiple", 256))
            d_ffn = -(-(2 * 4 * d_model // 3) // multiple) * multiple
    kv = m.get("kv_heads", 0)
    parts = ["%s layer%s, d_model %s, %s heads%s, %s %s" % (
        m.get("layers", "?"), "" if m.get("layers") == 1 else "s", d_model, heads,
        " (%s key and value)" % kv if kv and kv != heads else "", "d_ffn" if ffn == "mlp" else ffn, d_ffn)]
    if m.get("norm", "layernorm") != "layernorm":
        parts.append(m["norm"])
    if m.get("bias", True) is False:
        parts.append("no biases")
    if m.get("block", "sequential") != "sequential":
        parts.append("%s block" % m["block"].replace("_", " "))
    if m.get("qk_norm"):
        parts.append("QK-norm")
    if m.get("embedding_norm"):
        parts.append("embedding norm")
    if m.get("tie_embeddings", True) is False:
        parts.append("untied head")
    return ", ".join(parts)


def trained_section(runs, labels, methods):
    """What was trained, from each run's resolved config (its `config` attribute) and the
    attributes training recorded: the corpus, its tokenizer and vocabulary, the splits trained
    and evaluated on, and by method the model's size and shape, the steps and tokens trained
    on, the precision and the device; then the software the runs ran on."""
    configs = {}
    for run_id, run in runs.items():
        try:
            configs[run_id] = yaml.safe_load(run.get("config") or "") or {}
        except yaml.YAMLError:
            configs[run_id] = {}
    section = ["## What was trained", ""]
    evaluation = []
    for config in configs.values():
        e = config.get("eval") or {}
        limit = int(e.get("max_tokens") or 0)
        evaluation.append("the %s split, %s" % (e.get("split", "valid"),
                                                 "its first {:,} tokens".format(limit) if limit else "all of it"))
    section.append("Corpus %s. Trained on its train split; evaluated on %s." %
                   (corpora_text(runs, configs), distinct_text(evaluation)))
    section.append("")
    rows = []
    for method in methods:
        ids = [run_id for run_id in runs if labels.get(run_id) == method]
        if not ids:
            continue
        model = [configs[i].get("model") or {} for i in ids]
        train = [configs[i].get("train") or {} for i in ids]
        shape = [model_shape(m) for m in model]
        tokens = ["{:,}".format(runs[i]["train_tokens"]) if runs[i].get("train_tokens") else "not recorded"
                  for i in ids]
        # 0 parameters: not recorded (a run that failed before its model was built).
        parameters = ["{:,}".format(runs[i]["num_parameters"]) for i in ids if runs[i].get("num_parameters")]
        rows.append([method, distinct_text(parameters, "not recorded"),
                     distinct_text(shape), distinct_text([m.get("objective", "causal_lm") for m in model]),
                     distinct_text([t.get("steps", "?") for t in train]), distinct_text(tokens),
                     distinct_text(["%s at L = %s" % ("{:,}".format(int(t["batch_tokens"]))
                                                      if "batch_tokens" in t else "?",
                                                      t.get("seq_len", "?")) for t in train]),
                     distinct_text([t.get("precision", "fp32") for t in train]),
                     distinct_text([t.get("device", "cpu") for t in train])])
    section += [markdown_table(["method", "parameters", "model", "objective", "steps", "tokens trained on",
                                "batch_tokens", "precision", "device"], rows), ""]
    versions = distinct_text(["%s (commit %s)" % (r.get("extrap_version", "?"), r.get("git_commit", "?"))
                              for r in runs.values()])
    runtimes = distinct_text([r.get("runtime") for r in runs.values() if r.get("runtime")], "not recorded")
    section += ["Trained by extrap %s. Runtime: %s." % (versions, runtimes), ""]
    return section


def released_section(runs, labels):
    """The released checkpoints evaluated (a sweep's released models): each row says it was not
    trained here and what exactly was read: the folder, config.json's hash and the weights
    digest, with the method the family maps to and its training length."""
    released = {i: r for i, r in runs.items() if r.get("released")}
    if not released:
        return []
    rows = []
    for run_id, run in sorted(released.items(), key=lambda item: item[1].get("point_index", 0)):
        try:
            source = yaml.safe_load(run["released"]) or {}
            data = (yaml.safe_load(run.get("config") or "") or {}).get("data") or {}
        except yaml.YAMLError:
            source, data = {}, {}
        rows.append([labels[run_id], "`%s`" % source.get("path", "?"), "`%s`" % source.get("config_json", "?"),
                     "`%s`" % source.get("weights", "?"),
                     "{:,}".format(run["num_parameters"]) if run.get("num_parameters") else "not recorded",
                     str(run.get("train_length", "?")), "`%s`" % data.get("tokenizer_model", data.get("tokenizer", "?")),
                     str(run.get("status", "?"))])
    return ["## Released checkpoints", "",
            "Not trained here: each was imported from its folder (`extrap import`) and evaluated as it is. "
            "The config.json hash and the weights digest (XXH3 over the weights files' hashes) say "
            "exactly which checkpoint each row is; L is the training length its numbers are read against.", "",
            markdown_table(["model", "folder", "config.json", "weights", "parameters", "L", "tokenizer",
                            "status"], rows), ""]


def vocabularies(runs):
    """The distinct tokenizations of the runs: (tokenizer, tokenizer model, vocabulary size),
    a size of 0 (not recorded) only where no run of that tokenizer recorded one."""
    found = []
    for run in runs.values():
        try:
            data = (yaml.safe_load(run.get("config") or "") or {}).get("data") or {}
        except yaml.YAMLError:
            data = {}
        key = ((data.get("tokenizer", "byte"), data.get("tokenizer_model")), run.get("vocab_size") or 0)
        if key not in found:
            found.append(key)
    return [tokenization + (vocab,) for tokenization, vocab in without_unrecorded(found)]


def bits_per_byte_section(tokenizations, train_length, mode, lengths, methods, bits):
    """Where the runs tokenise the text differently (`tokenizations`: vocabularies(runs)),
    their perplexities are per token of different vocabularies and do not compare: a table of
    bits per byte of the scored text, which do."""
    if len(tokenizations) < 2 or not any(bits.get((train_length, mode, l, m)) for l in lengths for m in methods):
        return []
    rows = [[eval_length_label(l, train_length)]
            + [cell(bits[(train_length, mode, l, m)]) if bits.get((train_length, mode, l, m)) else "" for m in methods]
            for l in lengths]
    return ["The runs tokenise the text differently (%s): their perplexities are per token of different "
            "vocabularies. Bits per byte of the scored text compare them (empty: tokens that do not say "
            "how many bytes they cover):" % "; ".join(
                "%s%s, %s tokens" % (t, " `%s`" % model if model else "", "{:,}".format(v) if v else "?")
                for t, model, v in tokenizations), "",
            markdown_table(["eval length"] + methods, rows), ""]


def check_results_file(path):
    """Refuses, before anything is read, what is not a results file this report reads: an
    empty file, a file that is not HDF5 or lacks the results file's header and tables, one of
    another format version. A path that cannot be opened at all raises h5py's OSError."""
    if os.path.isdir(path):
        raise ReadError("it is a directory, not a results file")
    if not os.path.exists(path):
        raise ReadError("no such file")
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise ReadError("the file is empty (0 bytes), not a results file")
    if os.path.isfile(path) and not h5py.is_hdf5(path):
        raise ReadError("not an extrap results file (not an HDF5 file)")
    with h5py.File(path, "r") as f:
        if "format_version" not in f.attrs:
            raise ReadError("not an extrap results file (no format_version)")
        version = attribute(f.attrs["format_version"])
        if version != 1:
            raise ReadError("results format %s, this report reads format 1 (written by extrap %s)"
                            % (version, attribute(f.attrs.get("extrap_version", "?"))))
        missing = ["/" + name for name in ("summary", "runs") if name not in f]
        if missing:
            raise ReadError("not an extrap results file (no %s)" % " or ".join(missing))


def point_method(p, labels):
    """(the method a point is reported under, its run's label, its RoPE variant or "")."""
    variant = split_mode(p["mode"])[1]
    base = labels.get(p["run_id"], p["position"])
    return base + (" + " + variant if variant else ""), base, variant


def method_order(points, runs, labels):
    """Every method of the report in order: as the grid lists them (by the first run's point
    index), each followed by its RoPE variants in the order the sweep lists them (those of
    retrieval points alone after the others)."""
    first_index = {}
    for run_id, run in runs.items():
        label = labels[run_id]
        first_index[label] = min(first_index.get(label, 1 << 62), run.get("point_index", 0))
    text_then_retrieval = ([p for p in points if not is_retrieval_mode(p["mode"]) and not is_profile_mode(p["mode"])]
                           + [p for p in points if is_retrieval_mode(p["mode"])])
    variant_index = {}
    for p in text_then_retrieval:
        variant = split_mode(p["mode"])[1]
        variant_index.setdefault(variant, len(variant_index) if variant else -1)
    order = {}
    for p in points:
        method, base, variant = point_method(p, labels)
        order[method] = (first_index.get(base, 1 << 62), variant_index[variant] if variant else -1)
    for label in first_index:
        order.setdefault(label, (first_index[label], -1))
    return sorted(order, key=lambda m: order[m])


def text_tables(text_points, labels):
    """The text points by (train_length, window mode, eval_length, method): the perplexities
    over seeds, their bits per byte (where the tokens count bytes), the failures' reasons, and
    each seed's loss-by-position bins."""
    values = collections.defaultdict(list)
    bits = collections.defaultdict(list)
    failures = collections.defaultdict(list)
    bins = collections.defaultdict(list)
    for p in text_points:
        key = (p["train_length"], split_mode(p["mode"])[0], p["eval_length"], point_method(p, labels)[0])
        if p["status"] == "ok":
            values[key].append(p["perplexity"])
            if isinstance(p.get("bits_per_byte"), float) and math.isfinite(p["bits_per_byte"]):
                bits[key].append(p["bits_per_byte"])
            if "by_position" in p:
                bins[key].append(p["by_position"])
        else:
            failures[key].append(failure_reason(p["status"]))
    return values, bits, failures, bins


def longppl_tables(text_points, labels):
    """(train_length, eval_length, method) -> each seed's /longppl row of its non-overlapping
    point, and the LongPPL failures' reasons."""
    longppl = collections.defaultdict(list)
    failures = collections.defaultdict(list)
    for p in text_points:
        if p["status"] == "ok" and "longppl" in p:
            key = (p["train_length"], p["eval_length"], point_method(p, labels)[0])
            if p["longppl"]["status"] == "ok":
                longppl[key].append(p["longppl"])
            else:
                failures[key].append(failure_reason(p["longppl"]["status"]))
    return longppl, failures


def row_tables(points, labels, key_of, table):
    """key_of(point, its method) -> each seed's rows of `table` ("retrieval",
    "attention_profile"), and the failures' reasons."""
    rows = collections.defaultdict(list)
    failures = collections.defaultdict(list)
    for p in points:
        key = key_of(p, point_method(p, labels)[0])
        if p["status"] == "ok":
            if table in p:
                rows[key].append(p[table])
        else:
            failures[key].append(failure_reason(p["status"]))
    return rows, failures


def collect(points, labels):
    """The points by key, over seeds, as the sections read them. Retrieval points (exact-match
    counts; their perplexity is the answer tokens') are only in the retrieval tables,
    attention-profile points only in the profile tables."""
    retrieval_points = [p for p in points if is_retrieval_mode(p["mode"])]
    profile_points = [p for p in points if is_profile_mode(p["mode"])]
    text_points = [p for p in points if not is_retrieval_mode(p["mode"]) and not is_profile_mode(p["mode"])]
    tables = types.SimpleNamespace(retrieval_points=len(retrieval_points), profile_points=len(profile_points))
    tables.values, tables.bits, tables.failures, tables.bins = text_tables(text_points, labels)
    tables.longppl, tables.longppl_failures = longppl_tables(text_points, labels)
    tables.retrieval, tables.retrieval_failures = row_tables(
        retrieval_points, labels, lambda p, m: (p["train_length"], p["mode"], p["eval_length"], m), "retrieval")
    tables.profiles, tables.profile_failures = row_tables(
        profile_points, labels, lambda p, m: (p["train_length"], p["eval_length"], m), "attention_profile")
    return tables


def grid_size(header):
    """The number of points of the sweep's grid (the product of its axes' lengths), from the
    header's sweep_spec; None where the file does not say."""
    try:
        grid = (yaml.safe_load(header.get("sweep_spec", "")) or {}).get("grid")
    except (yaml.YAMLError, AttributeError):
        return None
    if not isinstance(grid, dict) or not all(isinstance(v, list) for v in grid.values()):
        return None
    return int(np.prod([len(v) for v in grid.values()]))


def runs_text(header, runs):
    """How many runs the file holds and how they ended; where that is fewer than the sweep's
    grid has points, how many and why that may be."""
    complete = sum(1 for r in runs.values() if r.get("status") == "complete")
    failed = sum(1 for r in runs.values() if str(r.get("status", "")).startswith("failed"))
    states = "%d complete, %d failed, %d unfinished" % (complete, failed, len(runs) - complete - failed)
    points = grid_size(header)
    if points is None or points <= len(runs):
        return "%d runs (%s)" % (len(runs), states)
    return ("%d runs of the sweep's %d grid points (%s; %d not in this file: a shard not merged yet?)"
            % (len(runs), points, states, points - len(runs)))


def seed_text(runs, labels, methods):
    """Which seeds the cells are over: one list for all, or each method's where they differ
    (a method's seeds at each training length where those differ too)."""
    seeds = collections.defaultdict(set)  # (label, train_length) -> seeds
    for run_id, run in runs.items():
        seeds[(labels[run_id], run.get("train_length"))].add(run.get("seed"))
    everywhere = sorted({r.get("seed") for r in runs.values()})
    if len({frozenset(s) for s in seeds.values()}) <= 1:
        if len(everywhere) > 1:
            return "Seeds %s: values are the mean ± sample standard deviation over seeds." % ", ".join(
                str(s) for s in everywhere)
        return "One seed (%s)." % ", ".join(str(s) for s in everywhere)
    groups = []
    for method in [m for m in methods if any(k[0] == m for k in seeds)]:
        keys = sorted(k for k in seeds if k[0] == method)
        by_length = len({frozenset(seeds[k]) for k in keys}) > 1
        for key in (keys if by_length else keys[:1]):
            groups.append("%s%s %s" % (method, " at L = %s:" % key[1] if by_length else "",
                                       ", ".join(str(s) for s in sorted(seeds[key]))))
    return ("Seeds differ between methods: %s — each cell is the mean over the seeds its method has "
            "(± the sample standard deviation where it has several)." % "; ".join(groups))


def header_lines(results_path, header, runs, points, labels, methods, tables):
    """The report's title, where its numbers come from, how many runs and points, the seeds
    and the machines."""
    md = ["# Sweep `%s`" % header.get("sweep_name", "?"), ""]
    md.append("Results file `%s` (spec hash `%s`), written by extrap %s (commit %s), created %s."
              % (results_path, header.get("spec_hash", "?"), header.get("extrap_version", "?"),
                 header.get("git_commit", "?"), header.get("created", "?")))
    md.append("")
    special = [("%d of retrieval" % tables.retrieval_points) if tables.retrieval_points else "",
               ("%d attention profiles" % tables.profile_points) if tables.profile_points else ""]
    special_text = " (%s)" % ", ".join(t for t in special if t) if any(special) else ""
    md.append("%s; %d evaluation points%s. %s" % (runs_text(header, runs), len(points), special_text,
                                                   seed_text(runs, labels, methods)))
    machines = sorted({r.get("machine", "") for r in runs.values() if r.get("machine")})
    if machines:
        md.append("Machine: " + "; ".join(machines) + ".")
    md.append("")
    return md


def perplexity_section(out_dir, train_length, mode, methods, tables, tokenizations, notes):
    """One window mode at one training length: the plot of perplexity against evaluation
    length, the table of perplexities (failures as footnotes), the same as ratios to the
    perplexity at the training length, and bits per byte where the runs tokenise differently."""
    values, failures = tables.values, tables.failures
    keys = [k for k in list(values) + list(failures) if k[0] == train_length and k[1] == mode]
    lengths = sorted({k[2] for k in keys})
    present = [m for m in methods if any(k[3] == m for k in keys)]
    image = "ppl_L%d_%s.png" % (train_length, mode)
    series = {m: [(l,) + mean_spread(values[(train_length, mode, l, m)])
                  for l in lengths if values.get((train_length, mode, l, m))] for m in present}
    plot_perplexity(os.path.join(out_dir, image), train_length, mode, present, series)
    md = ["### Perplexity, %s" % mode_title(mode), "", "![perplexity, L = %d, %s](%s)" % (train_length, mode, image), ""]
    rows, ratio_rows = [], []
    for l in lengths:
        row, ratio_row = [eval_length_label(l, train_length)], ["%d" % l]
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
    md += bits_per_byte_section(tokenizations, train_length, mode, lengths, present, tables.bits)
    return md


def training_length_sections(out_dir, train_length, methods, tables, header, tokenizations, notes):
    """Everything evaluated of the models trained at one length: "## Trained at L = ..." with
    a perplexity section per window mode, then LongPPL, the loss by position, the early-token
    curse, retrieval and attention profiles."""
    md = ["## Trained at L = %d" % train_length, ""]
    modes = sorted({k[1] for k in list(tables.values) + list(tables.failures) if k[0] == train_length},
                   key=mode_order)
    for mode in modes:
        md += perplexity_section(out_dir, train_length, mode, methods, tables, tokenizations, notes)
    md += longppl_section(out_dir, train_length, methods, tables.longppl, tables.longppl_failures, header, notes)
    md += by_position_section(out_dir, train_length, methods, tables.bins)
    md += early_token_section(train_length, methods, tables.values, modes)
    md += retrieval_section(out_dir, train_length, methods, tables.retrieval, tables.retrieval_failures, notes)
    md += profile_section(out_dir, train_length, methods, tables.profiles, tables.profile_failures, notes)
    return md


def training_section(out_dir, runs, labels, methods):
    """"## Training": per training length, the training curves and a table of each method's
    training speed, peak memory, parameters, final validation loss and status."""
    md = ["## Training", ""]
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
            # 0: not recorded (a run that failed before its model was built).
            parameters = [r["num_parameters"] for r in group if r.get("num_parameters")]
            status = collections.Counter(str(r.get("status")) for r in group)
            rows.append([m, cell(speed) if speed else "", cell(memory) if memory else "",
                         "%d" % parameters[0] if parameters else "",
                         cell(final_valid) if final_valid else "",
                         ", ".join("%s ×%d" % (s, c) if c > 1 else s for s, c in status.items())])
        md += ["Training speed and memory at L = %d (tokens/s of training, validation excluded; "
               "peak resident memory of the process during the run):" % train_length, "",
               markdown_table(["method", "tokens/s", "peak memory (MiB)", "parameters",
                               "final valid loss", "status"], rows), ""]
    return md


def write_report(results_path, out_dir):
    """Writes report.md and its plots into out_dir from the results file; returns report.md's
    path."""
    try:
        check_results_file(results_path)
        header, points, runs = load(results_path)
    except (OSError, KeyError) as e:
        raise ReadError((str(e).splitlines() or [type(e).__name__])[0])  # h5py's messages run on
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a directory (report.md and its "
                                 "plots go in a directory)", out_dir)
    os.makedirs(out_dir, exist_ok=True)
    labels = method_labels(runs)
    methods = method_order(points, runs, labels)
    tables = collect(points, labels)
    notes = Footnotes()
    md = header_lines(results_path, header, runs, points, labels, methods, tables)
    trained = {i: r for i, r in runs.items() if not r.get("released")}
    md += released_section(runs, labels)
    if trained:
        md += trained_section(trained, labels, methods)
    tokenizations = vocabularies(runs)
    train_lengths = sorted({k[0] for k in list(tables.values) + list(tables.failures) + list(tables.retrieval)
                            + list(tables.retrieval_failures) + list(tables.profiles)
                            + list(tables.profile_failures)})
    for train_length in train_lengths:
        md += training_length_sections(out_dir, train_length, methods, tables, header, tokenizations, notes)
    if trained:
        md += training_section(out_dir, trained, labels, methods)
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
    except ReadError as e:
        print("report: cannot read %s: %s" % (args.results, e.args[0]), file=sys.stderr)
        return 1
    except OSError as e:
        print("report: cannot write %s: %s" % (e.filename or args.out, e.strerror or e),
              file=sys.stderr)
        return 1
    print("report: " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
