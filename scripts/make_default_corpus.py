#!/usr/bin/env python3
"""Builds extrap's default corpus, data/pydoc/{train,valid,test}.txt.

The text is the reStructuredText source of the Python 3.11 documentation, as Debian's
python3.11-doc installs it (/usr/share/doc/python3.11/html/_sources/**/*.rst.txt): about 12 MB of
real English prose with code, in UTF-8.

Each source file goes whole into one split. Files are ranked by the SHA-256 of their relative
path; valid takes files from the top of that ranking until it holds 5% of all bytes (and at
least 300 KB), test takes the next files likewise, and train gets the rest. Within a split the
files are concatenated in sorted path order, each ending with a line break. The result depends
only on the sources, so every machine with the same package builds the same corpus.

Idempotent: a stamp (a digest of this script and every source file) is written last, and the
build is skipped when the outputs exist and the stamp matches. Outputs are written to temporary
names and renamed, so an interrupted run never leaves a half-written split behind.
"""
import argparse
import hashlib
import os
import sys
from pathlib import Path

DEFAULT_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "data" / "pydoc"
SPLITS = ("train", "valid", "test")
HELD_OUT_FRACTION = 0.05  # each of valid and test
HELD_OUT_MIN_BYTES = 300_000


def read_sources(root):
    """[(relative path, bytes)] for every *.rst.txt under root, in sorted path order."""
    files = sorted(p for p in root.rglob("*.rst.txt") if p.is_file())
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in files]


def assign_splits(sources):
    """{relative path: split name}."""
    total = sum(len(data) for _, data in sources)
    quota = max(HELD_OUT_FRACTION * total, HELD_OUT_MIN_BYTES)
    ranked = sorted(sources, key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())
    assignment = {}
    held_out = {"valid": 0, "test": 0}
    for path, data in ranked:
        split = next((s for s in ("valid", "test") if held_out[s] < quota), "train")
        if split != "train":
            held_out[split] += len(data)
        assignment[path] = split
    return assignment


def stamp_of(sources):
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path, data in sources:
        digest.update(path.encode() + b"\0" + str(len(data)).encode() + b"\0")
        digest.update(data)
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=Path, default=DEFAULT_SOURCES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = parser.parse_args()

    sources = read_sources(args.sources) if args.sources.is_dir() else []
    if not sources:
        sys.exit(f"make_default_corpus: no *.rst.txt files under {args.sources}: install "
                 "python3.11-doc (if it is installed, check that dpkg does not exclude "
                 "/usr/share/doc, e.g. a path-exclude line in /etc/dpkg/dpkg.cfg.d/)")

    stamp = stamp_of(sources)
    stamp_path = args.out / ".stamp"
    outputs = {split: args.out / f"{split}.txt" for split in SPLITS}
    if (not args.force and all(p.is_file() for p in outputs.values()) and stamp_path.is_file()
            and stamp_path.read_text().strip() == stamp):
        return  # up to date: quiet

    assignment = assign_splits(sources)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)  # the stamp only ever vouches for finished outputs
    for split, path in outputs.items():
        parts = [data if data.endswith(b"\n") else data + b"\n"
                 for rel, data in sources if assignment[rel] == split]
        temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
        temporary.write_bytes(b"".join(parts))
        temporary.replace(path)
        print(f"corpus: {path}: {path.stat().st_size:,} bytes from {len(parts)} files")
    temporary = stamp_path.with_name(f".stamp.tmp.{os.getpid()}")
    temporary.write_text(stamp + "\n")
    temporary.replace(stamp_path)


if __name__ == "__main__":
    main()
