# The report pools runs as seeds only when they are one configuration: analysis/report.py's
# method_labels() against labels written out by hand for grids that vary a method's options.
#
#   python tests/experiments/check_report_labels.py SOURCE_DIR
import os
import sys

sys.path.insert(0, os.path.join(sys.argv[1], "analysis"))
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
}
expected = {
    "00": "rotary", "01": "rotary (randomize_max=512)", "02": "rotary",
    "03": "learned", "04": "learned",  # options shared by every learned run: not in the label
    "05": "fire (init_L=32)", "06": "fire (init_L=64, mlp_width=8)",
    "07": "alibi (layers=4)",
}
labels = report.method_labels(runs)
assert labels == expected, labels
print("labels ok")
