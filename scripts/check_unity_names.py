#!/usr/bin/env python3
"""Fails when two source files of one build target define the same file-private name.

extrap builds each target as a unity build (CMakeLists.txt, EXTRAP_UNITY_BUILD): its .cpp files
are compiled in batches, several to a translation unit, so the anonymous namespaces and `static`
definitions of files in one batch share a scope. The compiler refuses a second definition of a
name with the same signature, but a function of the same name and another signature becomes an
overload, and a call written against one file's function may silently pick the other's. This
check keeps every file-private name of a target unique across its files, whichever batches
CMake makes.

What counts as a file-private name (a deliberately simple reading of the code, comments and
strings removed): a function, struct, class, enum, alias or constant declared at namespace scope
inside an anonymous namespace; a `static` function or variable at namespace scope; a function
made by EXTRAP_ISA_KERNEL (core/runtime/cpu_isa.h), which expands inside an anonymous namespace.

Usage: check_unity_names.py [ROOT]   (ROOT: the repository, default: this script's parent's)
"""
import collections
import pathlib
import re
import sys

# Each target's sources as CMakeLists.txt globs them (files CMake compiles apart from the unity
# batches, with their own compile definitions, are left in: a unique name costs nothing).
TARGETS = {
    "extrap": ["core/*/*.cpp", "positions/*.cpp"],
    "extrap_sweeps": ["experiments/sweep/*.cpp"],
    "extrap_cli": ["experiments/cli/*.cpp", "experiments/bench/*.cpp"],
    "extrap_tests": ["tests/*/test_*.cpp"],
    "extrap_cuda": ["core/attention/cuda/*.cpp", "core/runtime/nccl_backend.cpp",
                    "core/runtime/cuda_graph_capture.cpp"],
    "extrap_cuda_tests": ["tests/attention/test_fused_cuda_attention.cpp", "tests/kernels/test_cuda_adamw.cpp",
                          "tests/train/test_cuda_graph_step.cpp"],
}
# Sources of extrap_cuda and extrap_cuda_tests that the globs of the others also match.
CUDA_HALF = re.compile(r"core/attention/cuda/|core/runtime/(nccl_backend|cuda_graph_capture)\.cpp$|"
                       r"tests/.*/test_(fused_cuda_attention|cuda_adamw|cuda_graph_step)\.cpp$")

KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype",
            "static_assert"}


def strip(text):
    """The code without comments, string and character literals (raw strings included)."""
    text = re.sub(r'R"(\w*)\((.*?)\)\1"', '""', text, flags=re.S)
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def private_names(path):
    """The file-private names `path` defines."""
    text = strip(path.read_text())
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)  # preprocessor lines
    names = set(re.findall(r"\bEXTRAP_ISA_KERNEL\(\s*[^,]+,\s*(\w+)", text))
    scopes = []  # one entry per open brace: "anonymous", "namespace" or "other"
    start = 0
    for i, c in enumerate(text):
        if c not in "{};":
            continue
        head = text[start:i].strip()
        at_namespace_scope = all(s != "other" for s in scopes)
        private = "anonymous" in scopes
        if c == "{":
            if re.search(r"(^|\W)namespace$", head):
                scopes.append("anonymous")
            elif re.search(r"(^|\W)namespace\s+[\w:]+$", head) or head.startswith('extern ""'):
                scopes.append("namespace")
            else:
                if at_namespace_scope:
                    names |= defined(head, private)
                scopes.append("other")
        elif c == "}":
            if scopes:
                scopes.pop()
        elif at_namespace_scope:  # a declaration ending in ';'
            names |= declared(head, private)
        start = i + 1
    return names


def defined(head, private):
    """Names a definition with a body introduces (`head` is its text up to the brace)."""
    head = re.sub(r"^template\s*<.*?>\s*", "", head, flags=re.S)
    if not (private or re.match(r"(inline\s+|constexpr\s+)*static\b", head)):
        return set()
    kind = re.match(r"(struct|class|union|enum(\s+class|\s+struct)?)\s+(\w+)", head)
    if kind:
        return {kind.group(3)}
    # A function: the name before its parameter list; a qualified name (Type::member) is a
    # member's definition, not a new name.
    function = re.search(r"((?:\w+::)*)(~?\w+)\s*\((?:[^()]|\([^()]*\))*\)[\w\s&]*(->[^{]*)?$", head, re.S)
    if function:
        return set() if function.group(1) or function.group(2) in KEYWORDS else {function.group(2)}
    # A variable with a braced initialiser: `constexpr int kTable[] = {`, `Type name{`.
    variable = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*=?\s*$", head)
    return {variable.group(1)} if variable and re.search(r"\w[\s*&>]+\w+\s*(\[[^\]]*\])?\s*=?\s*$", head) else set()


def declared(head, private):
    """Names a declaration ending in ';' introduces (constants, aliases, static variables)."""
    if not head or head.startswith("template"):
        return set()
    if head.startswith("using"):  # an alias is a new name; a using-declaration names another's
        alias = re.match(r"using\s+(\w+)\s*=", head)
        return {alias.group(1)} if alias and private else set()
    if not (private or re.match(r"(inline\s+|constexpr\s+)*static\b", head)):
        return set()
    if re.match(r"(struct|class|enum)\b[^=]*$", head):  # a forward declaration
        return set()
    if "(" in head and "=" not in head.split("(")[0]:  # a function's declaration
        match = re.search(r"(\w+)\s*\(", head)
        return {match.group(1)} if match and match.group(1) not in KEYWORDS else set()
    match = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*(=|\{|$)", head)
    return {match.group(1)} if match else set()


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    failures = []
    for target, patterns in TARGETS.items():
        where = collections.defaultdict(list)
        for pattern in patterns:
            for path in sorted(root.glob(pattern)):
                relative = path.relative_to(root).as_posix()
                if CUDA_HALF.search(relative) and not target.startswith("extrap_cuda"):
                    continue
                for name in private_names(path):
                    if not name.isupper():  # a macro's name (EXTRAP_ISA_KERNEL itself)
                        where[name].append(relative)
        for name, files in sorted(where.items()):
            if len(files) > 1:
                failures.append("%s: %s is defined privately in %s" % (target, name, ", ".join(files)))
    for failure in failures:
        print(failure)
    if failures:
        print("check_unity_names: %d name(s) defined privately in two files of one target; in a unity "
              "build those files may share a translation unit: rename one (or share it from a header)"
              % len(failures))
        return 1
    print("check_unity_names: every file-private name is unique within its target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
