#!/usr/bin/env python3
"""Checks the layering of DESIGN.md §1: a file may include its own layer and the layers below it,
never one above; nothing under lib/, kernels/ or apps/ includes tests/ or dev/ (the kernel labs,
which build on the product, never the other way round); and each layer's library
in CMakeLists.txt (`ft_layer(NAME DEPS...)`) links only libraries of layers below it; and no
library file (under lib/) is over MAX_LINES lines: one that grows past it is split by job.

    scripts/check_layers.py [SOURCE_DIR]        # exit 1, one line per violation: file:line: ...

The order is LAYERS below, bottom first; CMakeLists.txt builds one library per layer, each
linking only layers under it. An include is read from `#include "..."` (or <...> naming one of our
folders), resolved the way the build resolves it (lib/ and the repository root are on the
include path), and mapped to the layer of the folder it names. CI runs this through ctest
(tests/cli/test_layers.sh, which also shows that it fails on each kind of problem).
"""
import os
import re
import sys

# Bottom first. Each name is a folder under lib/, except kernels/ and apps/ at the root.
LAYERS = ["core", "kernels", "runtime", "comm", "data", "parallel", "model", "adapt", "optim",
          "ckpt", "recipe", "train", "apps"]
RANK = {name: i for i, name in enumerate(LAYERS)}
MAX_LINES = 900
SOURCES = re.compile(r"\.(h|hpp|cpp|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def layer_of_source(rel):
    """The layer of a file of ours (a path relative to the source dir), or None."""
    parts = rel.split("/")
    if parts[0] == "lib" and len(parts) > 2:
        return parts[1]
    if parts[0] in ("kernels", "apps"):
        return parts[0]
    return None


# Folders above every layer, which the product never includes: the tests and the kernel labs.
OUTSIDE = {"tests": "test code", "dev": "the kernel labs' code"}


def layer_of_include(path):
    """(layer, outside) of an include path as written: outside names the OUTSIDE folder it is in,
    else None; layer None for a system header or an OUTSIDE folder."""
    parts = path.split("/")
    if parts[0] in OUTSIDE:
        return None, parts[0]
    if parts[0] == "lib" and len(parts) > 1:  # "lib/core/error.h"
        parts = parts[1:]
    if parts[0] in RANK and len(parts) > 1:
        return parts[0], None
    return None, None


LAYER_LIB = re.compile(r"^\s*ft_layer\((\w+)([^)]*)\)", re.M)


def check_cmake(src):
    """Each `ft_layer(NAME DEPS...)` of CMakeLists.txt links only ft_<layer> of lower layers."""
    path = os.path.join(src, "CMakeLists.txt")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []
    for m in LAYER_LIB.finditer(text):
        name, line = m.group(1), text.count("\n", 0, m.start()) + 1
        if name not in RANK:
            problems.append(f"CMakeLists.txt:{line}: ft_layer({name}) is not a layer")
            continue
        for dep in m.group(2).split():
            if dep.startswith("ft_") and dep[3:] in RANK and RANK[dep[3:]] >= RANK[name]:
                problems.append(f"CMakeLists.txt:{line}: ft_{name} links {dep}, which is not "
                                f"below it ({' → '.join(LAYERS)}; DESIGN.md §1)")
    return problems


def check(src):
    problems = check_cmake(src)
    for top in ("lib", "kernels", "apps"):
        for root, _, files in os.walk(os.path.join(src, top)):
            for name in sorted(files):
                if not SOURCES.search(name):
                    continue
                full = os.path.join(root, name)
                rel = os.path.relpath(full, src)
                mine = layer_of_source(rel)
                if mine is None:
                    continue
                if mine not in RANK:
                    problems.append(f"{rel}: folder lib/{mine} is not a layer of "
                                    f"scripts/check_layers.py (add it to LAYERS and DESIGN.md §1)")
                    continue
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read().splitlines()
                if top == "lib" and len(text) > MAX_LINES:
                    problems.append(f"{rel}: {len(text)} lines, over the {MAX_LINES} a library "
                                    f"file may have (split it by job: DESIGN.md §1)")
                for n, line in enumerate(text, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target, outside = layer_of_include(m.group(2))
                    if outside:
                        problems.append(f"{rel}:{n}: includes {OUTSIDE[outside]} "
                                        f"{m.group(2)} (production code never names "
                                        f"{outside}/)")
                    elif target is not None and RANK[target] > RANK[mine]:
                        problems.append(
                            f"{rel}:{n}: layer '{mine}' includes {m.group(2)} of layer "
                            f"'{target}', which is above it (order, bottom first: "
                            f"{' → '.join(LAYERS)}; DESIGN.md §1)")
    return problems


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(os.path.abspath(src))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s) against the layering", file=sys.stderr)
        return 1
    print(f"check_layers: every include goes down ({' → '.join(LAYERS)}); no library file over "
          f"{MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
