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
