"""The tiny sweep's results file (tests/experiments/test_sweep.cpp) as h5py reads it: every
attribute and table of the documented schema (docs/formats.md), each run's eval groups holding
/summary's numbers, and the loss-by-position bins adding up to their point.

usage: check_schema.py RESULTS.h5 SWEEP.yaml (run in the sweep's directory)
"""
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
for key in ["format_version", "sweep_name", "sweep_spec", "spec_hash", "sweep_file", "shard",
            "extrap_version", "git_commit", "created", "spec_time"]:
    assert key in f.attrs, "root attribute " + key
assert f.attrs["sweep_name"] == "tiny" and len(f.attrs["spec_hash"]) == 16
assert "grid:" in f.attrs["sweep_spec"]
assert f.attrs["sweep_file"] == open(sys.argv[2]).read() + "\n# --set eval.strides=[8]", f.attrs["sweep_file"]
assert f.attrs["shard"] == "", f.attrs["shard"]
s = f["summary"]
assert s.dtype.names == ("run_id", "position", "train_length", "seed", "mode", "stride",
                         "eval_length", "perplexity", "nll_sum", "scored_tokens",
                         "bits_per_byte", "seconds", "status"), s.dtype.names
assert s.shape == (24,) and s.maxshape == (None,), (s.shape, s.maxshape)
rows = s[...]
# Attention-profile points (at L and the longest length, 32) have no perplexity: apart here.
profiled = rows["mode"] == b"attention_profile"
ok = (rows["status"] == b"ok") & ~profiled
assert ok.sum() == 12 and profiled.sum() == 8
assert np.allclose(rows["perplexity"][ok], np.exp(rows["nll_sum"][ok] / rows["scored_tokens"][ok]))
# Byte-level tokens: bits per byte is the NLL in bits per scored token.
assert np.allclose(rows["bits_per_byte"][ok], rows["nll_sum"][ok] / (rows["scored_tokens"][ok] * np.log(2)))
assert set(rows["mode"]) == {b"nonoverlapping", b"sliding_8", b"attention_profile"}
profiled_ok = profiled & (rows["status"] == b"ok")
assert np.isnan(rows["perplexity"][profiled]).all() and (rows["scored_tokens"][profiled_ok] == 4 * rows["eval_length"][profiled_ok]).all()
# What every point was computed from: one row a point, each input 16 hex digits (tokens empty
# for retrieval points only, which there are none of here).
inputs = f["inputs"][...]
assert inputs.dtype.names == ("summary_row", "model", "data_key", "corpus", "tokens", "reference"), inputs.dtype
assert sorted(inputs["summary_row"]) == list(range(len(rows)))
for column in ("model", "data_key", "corpus", "tokens"):
    assert all(len(v) == 16 for v in inputs[column]), column
assert all(v == b"" for v in inputs["reference"])
assert len(set(inputs["corpus"])) == 1 and len(set(inputs["tokens"])) == 1
profile = f["attention_profile"][...]
assert profile.dtype.names == ("summary_row", "layer", "head", "begin", "end", "mass", "entropy", "sink"), profile.dtype
assert set(profile["summary_row"]) == set(np.nonzero(profiled_ok)[0])
sliding = rows["mode"] == b"sliding_8"
assert (rows["stride"][sliding] == 8).all() and (rows["stride"][~sliding] == rows["eval_length"][~sliding]).all()
# Bins only for the points that finished.
assert set(f["position_bins"]["summary_row"]) == set(np.nonzero(ok)[0]), f["position_bins"]["summary_row"]
# The first 1024 tokens of valid (eval.max_tokens), each scored once whatever the window.
assert set(rows["scored_tokens"][ok]) == {1023}, set(rows["scored_tokens"][ok])
bad = rows[rows["status"] != b"ok"]
assert len(bad) == 6 and all(r["position"] == b"learned" and r["eval_length"] == 32 for r in bad)
assert all(r["status"].startswith(b"failed: ") and b"max_length" in r["status"] for r in bad)
assert len(f["runs"]) == 4
for run_id, g in f["runs"].items():
    for key in ["config", "grid_point", "position", "train_length", "seed", "extrap_version",
                "git_commit", "machine", "runtime", "start_time", "end_time", "tokens_per_second",
                "peak_memory_bytes", "num_parameters", "train_tokens", "vocab_size", "status"]:
        assert key in g.attrs, run_id + " attribute " + key
    # 40 steps of 256 // 16 = 16 sequences of 16 tokens; bytes and <mask>.
    assert g.attrs["train_tokens"] == 40 * 16 * 16, g.attrs["train_tokens"]
    assert g.attrs["vocab_size"] == 257, g.attrs["vocab_size"]
    assert g.attrs["runtime"].startswith("extrap ") and ", LibTorch " in g.attrs["runtime"], g.attrs["runtime"]
    assert ", 1 threads, malloc (glibc" in g.attrs["runtime"], g.attrs["runtime"]  # train.threads of tiny.yaml
    assert g.attrs["train_length"] == 16 and g.attrs["status"] == "complete"
    assert "seq_len: 16" in g.attrs["config"]
    assert g["train_loss"].shape == (4, 2) and g["valid_loss"].shape == (2, 2)
    assert list(g["train_loss"][:, 0]) == [10, 20, 30, 40]
    for mode in ["nonoverlapping", "sliding_8"]:
        e = g["eval"][mode]
        n = e["length"].shape[0]
        for column in ["perplexity", "nll_sum", "scored_tokens", "bits_per_byte", "seconds"]:
            assert e[column].shape == (n,), (run_id, mode, column)
        # The run's own datasets hold the summary's numbers.
        mine = rows[(rows["run_id"] == run_id.encode()) & (rows["mode"] == mode.encode()) & ok]
        by_length = {int(r["eval_length"]): r for r in mine}
        assert sorted(by_length) == sorted(int(x) for x in e["length"][...]), (run_id, mode)
        for i, length in enumerate(e["length"][...]):
            r = by_length[int(length)]
            for column in ["perplexity", "nll_sum", "scored_tokens", "bits_per_byte"]:
                assert e[column][i] == r[column], (run_id, mode, column)
        # The loss by position in the window: bins that add up to the point's totals.
        all_bins = f["position_bins"][...]
        assert all_bins.dtype.names == ("summary_row", "begin", "end", "nll_sum", "scored_tokens"), all_bins.dtype
        for i, length in enumerate(e["length"][...]):
            r = by_length[int(length)]
            row_index = [k for k in range(len(rows)) if rows[k]["run_id"] == r["run_id"] and
                         rows[k]["mode"] == r["mode"] and rows[k]["eval_length"] == length]
            assert len(row_index) == 1
            bins = all_bins[all_bins["summary_row"] == row_index[0]]
            assert bins["begin"][0] == 0 and bins["end"][-1] == length, bins
            assert (bins["end"] > bins["begin"]).all() and (bins["begin"][1:] >= bins["end"][:-1]).all()
            assert bins["scored_tokens"].sum() == r["scored_tokens"], (run_id, mode, length)
            assert np.isclose(bins["nll_sum"].sum(), r["nll_sum"], rtol=1e-9, atol=0), (run_id, mode, length)
        failures = e["failures"][...]
        if g.attrs["position"] == "learned":
            assert list(e["length"][...]) == [16] and list(failures["length"]) == [32]
        else:
            assert list(e["length"][...]) == [16, 32] and len(failures) == 0
    # The profile's own group: the windows' queries and the time, by length.
    e = g["eval"]["attention_profile"]
    assert sorted(e.keys()) == ["failures", "length", "queries", "seconds"], list(e.keys())
    assert list(e["queries"][...]) == [4 * int(l) for l in e["length"][...]]
    assert list(e["length"][...]) == ([16] if g.attrs["position"] == "learned" else [16, 32])
print("schema ok")
