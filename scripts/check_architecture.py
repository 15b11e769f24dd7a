#!/usr/bin/env python3
"""Fails when docs/ARCHITECTURE.md and the code disagree on what it can check mechanically.

1. The layer table ("## Layers and their boundaries"): every #include "<layer>/..." in src/<layer> names the layer
   itself, one its row lists under "may depend on", or one those may depend on in turn; and every layer a row lists
   stands above it in the table.
2. The environment-variable table ("## Environment variables"): every variable src/ reads (getenv("X"), and the
   FATHOM_* names it spells out as string literals) has a row, and every row names a variable src/ still reads.

  scripts/check_architecture.py [REPO_ROOT]        # prints what is stale; exit 1 if anything is
"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
doc = open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
problems = []


def section(title):
    start = doc.find("\n## " + title)
    if start < 0:
        problems.append(f"docs/ARCHITECTURE.md has no section '## {title}'")
        return ""
    end = doc.find("\n## ", start + 1)
    return doc[start:end if end >= 0 else len(doc)]


def table_rows(text):
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header


def sources():
    for base, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f.endswith((".cc", ".h", ".cu", ".cuh")):
                path = os.path.join(base, f)
                yield os.path.relpath(path, os.path.join(root, "src")), open(path, encoding="utf-8").read()


# 1. Layers.
rows = table_rows(section("Layers and their boundaries"))
order = [r[0] for r in rows]
allowed = {}
for r in rows:
    layer, deps = r[0], r[-1]
    if "everything above" in deps:
        allowed[layer] = set(order[: order.index(layer)])
        continue
    words = set(re.findall(r"[a-z]+(?:/[a-z]+)?", deps))
    allowed[layer] = {w for w in words if w in order and w != layer}
for layer, deps in allowed.items():
    for d in deps:
        if order.index(d) > order.index(layer):
            problems.append(f"layer table: {layer} may depend on {d}, which stands below it")


def closure(layer, seen=None):
    seen = set() if seen is None else seen
    for d in allowed.get(layer, ()):
        if d not in seen:
            seen.add(d)
            closure(d, seen)
    return seen


layer_of_dir = sorted(order, key=len, reverse=True)
for rel, text in sources():
    layer = next((l for l in layer_of_dir if rel == l or rel.startswith(l + "/")), None)
    if layer is None:
        problems.append(f"src/{rel}: its folder is not in the layer table")
        continue
    ok = closure(layer) | {layer}
    for inc in re.findall(r'#include "([^"]+)"', text):
        target = next((l for l in layer_of_dir if inc.startswith(l + "/")), None)
        if target is not None and target not in ok:
            problems.append(f"src/{rel} includes {inc}: {layer} may not depend on {target} (docs/ARCHITECTURE.md)")

# 2. Environment variables.
documented = {}
for r in table_rows(section("Environment variables")):
    m = re.match(r"`([A-Z][A-Z0-9_]+)`", r[0])
    if m:
        documented[m.group(1)] = r[1]
read = {}
for rel, text in sources():
    for v in re.findall(r'getenv\("([A-Z][A-Z0-9_]+)"\)', text) + re.findall(r'"(FATHOM_[A-Z0-9_]+)"', text):
        read.setdefault(v, rel)
for v, rel in sorted(read.items()):
    if v not in documented:
        problems.append(f"src/{rel} reads {v}, which docs/ARCHITECTURE.md's environment table does not list")
for v in sorted(documented):
    if v not in read:
        problems.append(f"docs/ARCHITECTURE.md lists {v}, which nothing in src/ reads any more")

for p in problems:
    print(p)
print(f"checked {len(order)} layers and {len(documented)} environment variables: "
      f"{'OK' if not problems else str(len(problems)) + ' stale'}")
sys.exit(1 if problems else 0)
