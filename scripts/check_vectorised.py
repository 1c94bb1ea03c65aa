#!/usr/bin/env python3
"""Fails when a kernel's AVX2 or AVX-512 variant in the built library is scalar code.

extrap's element-wise CPU kernels are written once as plain loops and compiled for each
instruction set by EXTRAP_ISA_KERNEL (core/runtime/cpu_isa.h): their speed rests on GCC
vectorising each variant. Nothing else notices when it does not: the numbers stay right and the
loop runs 4-8x slower. That happened once, unseen for weeks: under GCC's default -ftrapping-math
and -fmath-errno every loop with a select (exp_float's clamps) or a square root stayed scalar on
AVX2 paths, while AVX-512's masked operations vectorised the same loops (benchmarks/RESULTS.md,
"Scalar AVX2 kernels"). This check reads the disassembly of the library: every kernel's `_avx2`
variant must hold a ymm instruction and its `_avx512` variant a ymm or zmm one (GCC prefers
256-bit vectors on x86-64-v4). A variant passes when any of its loops is vector code, so a kernel
holds one kind of loop: where a bias or an option picks between loops, each is its own kernel
(an int64 index converted to float left one of two such loops scalar on AVX2, unseen here while
its sibling was vector code: fused_cpu_attention.cpp's bias_and_max, a third of the attention's
time at 8k under the AVX2 cap).

Usage: check_vectorised.py LIBRARY [ROOT]
  LIBRARY: the built libextrap.so; ROOT: the repository (default: this script's parent's), whose
  sources name the kernels. Exits 0 with a note where objdump is missing or the compiler is not
  GCC on x86-64 (the variants exist only there).
"""
import pathlib
import re
import shutil
import subprocess
import sys

def kernel_names(root):
    names = set()
    pattern = re.compile(r"EXTRAP_ISA_KERNEL\(\s*[^,]+,\s*([A-Za-z_][A-Za-z_0-9]*)\s*,")
    for folder in ("core", "positions", "experiments"):
        for path in (root / folder).rglob("*"):
            if path.suffix in (".h", ".cpp"):
                names.update(pattern.findall(path.read_text(errors="replace")))
    names.discard("name")  # the macro's own definition
    return names


def vector_counts(library):
    """{function name without its namespace: [ymm count, zmm count] summed over its copies}."""
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(library)], check=True,
                         capture_output=True, text=True).stdout
    counts, current = {}, None
    header = re.compile(r"^[0-9a-f]+ <(.*)>:$")
    for line in out.splitlines():
        m = header.match(line)
        if m:
            name = m.group(1).replace("(anonymous namespace)", "")
            name = name.split("(")[0].split("::")[-1]
            current = counts.setdefault(name, [0, 0]) if name.endswith(("_avx2", "_avx512")) else None
        elif current is not None:
            current[0] += line.count("%ymm")
            current[1] += line.count("%zmm")
    return counts


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    library = pathlib.Path(sys.argv[1])
    root = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else pathlib.Path(__file__).resolve().parent.parent
    if shutil.which("objdump") is None:
        print("check_vectorised: no objdump here (binutils); nothing checked")
        return
    counts = vector_counts(library)
    if not any(name.endswith("_avx2") for name in counts):
        print(f"check_vectorised: {library} has no _avx2 variants (not GCC on x86-64); nothing checked")
        return
    names = kernel_names(root)
    if not names:
        sys.exit(f"check_vectorised: found no EXTRAP_ISA_KERNEL in {root}: wrong ROOT?")
    failures, checked = [], 0
    for name in sorted(names):
        for isa, wanted in (("avx2", "ymm"), ("avx512", "ymm or zmm")):
            count = counts.get(f"{name}_{isa}")
            if count is None:
                continue  # inlined everywhere or not compiled in: nothing to read
            checked += 1
            vector = count[0] if isa == "avx2" else count[0] + count[1]
            if vector == 0:
                failures.append(f"{name}_{isa}: no {wanted} instruction in {library.name} (scalar code)")
    for failure in failures:
        print(failure)
    if failures:
        sys.exit(f"check_vectorised: {len(failures)} of {checked} kernel variants are scalar; see the "
                 "flags in CMakeLists.txt (-fno-trapping-math, -fno-math-errno) and GCC's -fopt-info-vec-missed")
    print(f"check_vectorised: {checked} kernel variants of {len(names)} kernels, each vectorised")


if __name__ == "__main__":
    main()
