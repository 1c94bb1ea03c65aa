#!/usr/bin/env python3
"""The layers of extrap's code, checked against the real include graph.

Every C++ file belongs to the layer of its folder (LAYERS below, lowest first). A file may
include its own layer and the layers below it, never one above it or a sibling beside it: an
include that does is printed as `file:line: includes path (layer A may not use layer B)` and
the check fails. A C++ file in a folder that no layer names fails too, so a new folder is
placed on purpose. CI runs this as the ctest entry `layers.includes`.

The picture in docs/architecture.md (between the markers below) is drawn from the same graph:
an arrow for each pair of layers that an include joins, labelled with the number of includes,
less the arrows a longer path already implies.
`--write-doc` redraws it; the check fails when the page's picture is not the graph's.

  python3 scripts/check_layers.py               # check the includes and the page's picture
  python3 scripts/check_layers.py --write-doc   # redraw the picture in docs/architecture.md
"""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first. Layers in one tuple are siblings: each may use what is below the tuple, not
# each other. (folder prefixes, layer name)
LAYERS = [
    (("core/base/",), "base"),
    (("core/runtime/",), "runtime"),
    (("core/data/",), "data"),
    (("core/kernels/",), "kernels"),
    (("core/attention/",), "attention"),
    (("positions/",), "positions"),
    (("core/model/",), "model"),
    (("core/hub/",), "hub"),
    (("core/run/",), "run"),
    (("core/eval/",), "eval"),
    (("core/train/",), "train"),
    (("core/results/",), "results"),
    (("core/export/",), "export"),
    (("experiments/sweep/",), "sweep"),
    (("experiments/cli/", "experiments/bench/"), "commands"),
]
# Pairs of layers that are siblings (neither may use the other).
SIBLINGS = {("results", "export")}
# Folders that use the library from outside: plugins see what a position method sees; tests
# may use everything.
OUTSIDE = {"plugins/": "positions", "tests/": None}

SOURCE_DIRS = ("core", "positions", "experiments", "plugins", "tests")
EXTENSIONS = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
DOC = os.path.join(ROOT, "docs", "architecture.md")
BEGIN, END = "<!-- layers: begin (scripts/check_layers.py --write-doc) -->", "<!-- layers: end -->"

RANK = {name: rank for rank, (_, name) in enumerate(LAYERS)}


def layer_of(path):
    """The layer name of a repository-relative path, or None for a folder no layer names."""
    for prefixes, name in LAYERS:
        if path.startswith(prefixes):
            return name
    for prefix, like in OUTSIDE.items():
        if path.startswith(prefix):
            return prefix.rstrip("/")
    return None


def may_use(user, used):
    if user == used:
        return True
    if user == "tests":
        return True
    if user == "plugins":
        user = OUTSIDE["plugins/"]
        if used == user:
            return True
    if used in ("tests", "plugins"):
        return False
    if (user, used) in SIBLINGS or (used, user) in SIBLINGS:
        return False
    return RANK[used] < RANK[user]


def sources():
    for top in SOURCE_DIRS:
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if name.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def includes(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m and os.path.exists(os.path.join(ROOT, m.group(1))):
                yield number, m.group(1)


def check():
    """(problems, edges): the layering errors and the count of includes per pair of layers."""
    problems, edges = [], collections.Counter()
    for path in sorted(sources()):
        user = layer_of(path)
        if user is None:
            problems.append(f"{path}: in no layer (add its folder to LAYERS in scripts/check_layers.py)")
            continue
        for number, target in includes(path):
            used = layer_of(target)
            if used is None:
                problems.append(f"{path}:{number}: includes {target}, which is in no layer")
            elif not may_use(user, used):
                problems.append(f"{path}:{number}: includes {target} (layer {user} may not use layer {used})")
            elif used != user and user != "tests":
                edges[(user, used)] += 1
    return problems, edges


def reduced(edges):
    """The edges no longer path implies (A -> C goes when A -> B -> ... -> C exists)."""
    uses = collections.defaultdict(set)
    for user, used in edges:
        uses[user].add(used)

    def reaches(start, goal, skip):
        stack, seen = [w for w in uses[start] if w != skip], set()
        while stack:
            w = stack.pop()
            if w == goal:
                return True
            if w not in seen:
                seen.add(w)
                stack.extend(uses[w])
        return False

    return {e: n for e, n in edges.items() if not reaches(e[0], e[1], skip=e[1])}


def picture(edges):
    edges = reduced(edges)
    lines = ["```mermaid", "flowchart BT"]
    for prefixes, name in LAYERS:
        folders = ", ".join(p.rstrip("/") for p in prefixes)
        lines.append(f'  {name}["{name}<br/><small>{folders}</small>"]')
    lines.append('  plugins["plugins<br/><small>plugins</small>"]')
    last = len(LAYERS)  # plugins, after every layer
    for (user, used), count in sorted(edges.items(), key=lambda e: (RANK.get(e[0][0], last), RANK.get(e[0][1], last))):
        lines.append(f"  {user} -->|{count}| {used}")
    lines.append("```")
    return "\n".join(lines)


def main():
    problems, edges = check()
    drawn = picture(edges)
    if "--write-doc" in sys.argv:
        text = open(DOC, encoding="utf-8").read()
        if BEGIN not in text or END not in text:
            sys.exit(f"{DOC}: no markers {BEGIN} ... {END}")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        open(DOC, "w", encoding="utf-8").write(head + BEGIN + "\n" + drawn + "\n" + END + tail)
    else:
        text = open(DOC, encoding="utf-8").read() if os.path.exists(DOC) else ""
        if BEGIN + "\n" + drawn + "\n" + END not in text:
            problems.append("docs/architecture.md: its picture of the layers is not the include graph's "
                            "(python3 scripts/check_layers.py --write-doc redraws it)")
    for p in problems:
        print(p)
    count = sum(1 for _ in sources())
    if problems:
        print(f"layers: {len(problems)} problem(s) in {count} files")
        return 1
    print(f"layers: {count} files, {sum(edges.values())} includes across layers, none upward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
