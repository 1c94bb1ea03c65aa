#!/usr/bin/env python3
"""TensorBoard event files from the training logs of extrap runs (RUN/metrics.jsonl).

    .venv/bin/python analysis/metrics_to_tensorboard.py RUN [RUN ...] --out DIR
    .venv/bin/tensorboard --logdir DIR

Writes DIR/<name of RUN>/events.out.tfevents.* for each run (a sweep's run root works too:
every directory under it holding a metrics.jsonl is a run, named by its path below the root).
The scalars, by step:
  train/loss, train/lr, train/tokens, train/tokens_per_second   at every log point
  valid/loss, valid/perplexity                                  at every validation point
  position/<name>                                              what the position method logs
with each line's "time" as the event's wall time. A run's directory in DIR is replaced, so
converting again after more training gives one curve, not two.

Uses the `tensorboard` package (pinned in requirements.txt; scripts/setup.sh installs it).
A line that is not a JSON object with an integer "step" is an error naming the file and line.
"""
import argparse
import json
import os
import shutil
import sys

SCALARS = [("loss", "train/loss"), ("lr", "train/lr"), ("tokens", "train/tokens"),
           ("tokens_per_second", "train/tokens_per_second"), ("valid_loss", "valid/loss"),
           ("valid_perplexity", "valid/perplexity")]


def read_metrics(path):
    """The records of a metrics.jsonl, in order; SystemExit naming the file and line if bad."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}: line {number} is not JSON ({e.msg})")
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                sys.exit(f"{path}: line {number} is not a metrics record "
                         "(a JSON object with an integer \"step\")")
            records.append(record)
    return records


def find_runs(paths):
    """(name, metrics.jsonl path) for each run given or found under a directory given."""
    runs = []
    for given in paths:
        if os.path.isfile(os.path.join(given, "metrics.jsonl")):
            runs.append((os.path.basename(os.path.normpath(given)),
                         os.path.join(given, "metrics.jsonl")))
            continue
        if not os.path.isdir(given):
            sys.exit(f"{given}: no such run directory")
        found = []
        for root, _, files in os.walk(given):
            if "metrics.jsonl" in files:
                found.append((os.path.relpath(root, given), os.path.join(root, "metrics.jsonl")))
        if not found:
            sys.exit(f"{given}: holds no metrics.jsonl (not a run directory written by "
                     "extrap 0.12 or later, nor a directory of runs)")
        runs.extend(sorted(found))
    names = [name for name, _ in runs]
    for name in names:
        if names.count(name) > 1:
            sys.exit(f"two runs would be written to {name}: convert them separately")
    return runs


def write_run(records, directory):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    writer = EventFileWriter(directory)
    for record in records:
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(record[key]))
                  for key, tag in SCALARS if record.get(key) is not None]
        for name, value in sorted((record.get("position") or {}).items()):
            values.append(summary_pb2.Summary.Value(tag=f"position/{name}",
                                                    simple_value=float(value)))
        writer.add_event(event_pb2.Event(wall_time=float(record.get("time", 0.0)),
                                         step=record["step"],
                                         summary=summary_pb2.Summary(value=values)))
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (or directories of runs)")
    parser.add_argument("--out", required=True, help="TensorBoard log directory to write")
    args = parser.parse_args()
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        sys.exit(f"--out {args.out}: exists and is not a directory")
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        sys.exit("the tensorboard package is not installed: run scripts/setup.sh (it installs "
                 "requirements.txt into .venv) and use .venv/bin/python")
    for name, path in find_runs(args.runs):
        records = read_metrics(path)
        write_run(records, os.path.join(args.out, name))
        print(f"{path}: {len(records)} lines -> {os.path.join(args.out, name)}")


if __name__ == "__main__":
    main()
