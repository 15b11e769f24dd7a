#!/usr/bin/env python3
"""Fails when docs/ARCHITECTURE.md and the code disagree on what it can check mechanically.

1. The layer table ("## Layers and their boundaries"), read as a table. Its "may depend on" column is, exactly:

       deps     := "everything above" | list (";" sublib)*
       sublib   := LIB ":" list          LIB: a fathom_library of the row's folder named <layer>_<part>
       list     := entry ("," entry)*
       entry    := name (" and " name)* [" (" remark ")"]
       name     := a layer of an earlier row | an outside library named in EXTERNAL below
       remark   := any text without parentheses (free prose: not checked)

   A cell that does not parse is an error naming its row. Then every #include "<layer>/..." in src/<layer> names the
   layer itself, one its row lists, or one those may depend on in turn, and every layer a row lists stands above it.
   A sub-library's entries (`engine_text: tokenizer`) hold only for that library's files: its SOURCES in the folder's
   CMakeLists.txt and their same-named headers. The rest of the folder may not include its headers, and another
   layer may include them only if it may depend on what the sub-library adds.
2. The environment-variable table ("## Environment variables"): every variable src/ reads has a row, every row names
   a variable src/ still reads, and its "read by" column names every file that reads it. A file reads a variable it
   passes as a string literal to getenv, secure_getenv, EnvSwitch or EnvInteger (core/env.h), or spells out whole as
   a "FATHOM_*" literal. Where the name is not a literal (`for (const char* var : {"PMI_SIZE", ...}) getenv(var)`),
   the all-caps literals with an underscore of the enclosing function (else of the file) are taken as the names read;
   a call with none is an error naming it, unless it is the body of one of those readers (core/env.cc's EnvSwitch).
   What it cannot see: a name built at run time or passed in from another file (through a helper of its own, say),
   a name without an underscore (HOME), and an unrelated all-caps literal in such a function, which it takes for a
   variable (then the table wants a row for it: move the literal out of that function). Functions are found by
   matching braces after comments and literals are blanked, which macros that open or close braces can confuse.
3. The launcher headers ("## The CUDA backend today"): launcher.h and every header in src/backend/cuda that declares
   an `int Launch...(` may include only the C++ standard library (<name> without a dot or a slash, so no CUDA
   header), core/ and other launcher headers, apart from the known exceptions in LAUNCHER_EXCEPTIONS. The document's
   rule must name each of them, and an exception the code no longer has is an error too, so the list stays exact.

  scripts/check_architecture.py [REPO_ROOT]        # prints what is stale; exit 1 if anything is

REPO_ROOT needs docs/ARCHITECTURE.md and src/ (sources and CMakeLists.txt files) only.
"""
import os
import re
import sys

# Outside libraries a layer row may name. A new one goes here, so that a misspelt layer is not taken for a library.
EXTERNAL = {"fmt", "spdlog", "nlohmann-json", "libdl", "CUDA runtime", "cuBLASLt", "PCRE2", "utf8proc",
            "Boost headers"}
# Launcher headers that include more than the rule allows: (header, include) -> why. Each is to go once formats and
# attention layouts become providers; docs/ARCHITECTURE.md's rule names them.
LAUNCHER_EXCEPTIONS = {
    ("backend/cuda/moe.h", "model/moe_route.h"): "the routing rule the router kernel shares with the CPU",
    ("backend/cuda/sampling.h", "model/sample_rows.h"): "SampleRowSpec, LogitAdjust and AdjustedLogit",
}
# The calls that read the environment, with the variable's name as their first argument.
READERS = ("getenv", "secure_getenv", "EnvSwitch", "EnvInteger", "EnvChoice")
ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")

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


def blank(s):
    return re.sub(r"[^\n]", " ", s)


def scan(text):
    """C++ text with comments and the contents of string and character literals blanked (same length, newlines kept,
    quotes kept), and the string literals by the offset of their opening quote. Blanking first keeps a brace, a
    quote or a name inside a comment or a literal from counting as code."""
    out, lits, i, n = [], {}, 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i) or text.startswith("/*", i):
            j = text.find("\n", i) if text[i + 1] == "/" else text.find("*/", i + 2)
            j = n if j < 0 else (j if text[i + 1] == "/" else j + 2)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            word = re.search(r"[A-Za-z0-9_]*$", text[max(0, i - 3):i]).group(0)
            if word in ("R", "u8R", "uR", "UR", "LR"):  # a raw string: R"delim( ... )delim"
                open_paren = text.find("(", i)
                delim = text[i + 1:open_paren]
                j = text.find(")" + delim + '"', open_paren)
                j = n - 1 if j < 0 else j + len(delim) + 1
                lits[i] = text[open_paren + 1:j - len(delim) - 1]
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                lits[i] = text[i + 1:j]
            out.append('"' + blank(text[i + 1:j]) + '"')
            i = j + 1
        elif c == "'":
            # 1'000'000 is a digit separator, not a character literal.
            k = i
            while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_'"):
                k -= 1
            if k < i and text[k].isdigit():
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append("'" + blank(text[i + 1:j]) + "'")
            i = j + 1
        else:
            j = i + 1
            while j < n and text[j] not in "/\"'":
                j += 1
            out.append(text[i:j])
            i = j
    return "".join(out)[:n], lits


def without_preprocessor(code):
    return re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: blank(m.group(0)), code)


def function_bodies(code):
    """The outermost function bodies of `code` (scanned, without preprocessor lines) as (open, close, name). A brace
    opens a function body when the text since the last ';', '{' or '}' ends in ')' (with qualifiers) or in a trailing
    return type, and does not start a namespace, class, struct, union or enum."""
    bodies, stack = [], []
    for m in re.finditer(r"[{}]", code):
        if m.group(0) == "{":
            start = max(code.rfind(";", 0, m.start()), code.rfind("{", 0, m.start()), code.rfind("}", 0, m.start()))
            head = " ".join(code[start + 1:m.start()].split())
            head = re.sub(r"^template\s*<.*?>\s*", "", head)
            is_function = not re.match(r"(namespace|class|struct|union|enum)\b", head) and bool(
                re.search(r"\)\s*(?:const|override|final|noexcept|mutable|volatile|&|\s)*$", head)
                or re.search(r"\)\s*(?:const\s*|mutable\s*|noexcept\s*)*->\s*[\w:<>,*&\s]+$", head))
            name = re.search(r"(~?[A-Za-z_]\w*)\s*\(", head)
            outermost = is_function and not any(f for _, f, _ in stack)
            stack.append((m.start(), outermost, name.group(1) if name else ""))
        elif stack:
            start, outermost, name = stack.pop()
            if outermost:
                bodies.append((start, m.end(), name))
    return bodies


def sources():
    for base, _, files in sorted(os.walk(os.path.join(root, "src"))):
        for f in sorted(files):
            if f.endswith((".cc", ".h", ".cu", ".cuh")):
                path = os.path.join(base, f)
                text = open(path, encoding="utf-8").read()
                code, lits = scan(text)
                yield os.path.relpath(path, os.path.join(root, "src")).replace(os.sep, "/"), text, code, lits


files = list(sources())


def includes(code, lits):
    """(line, path) of each #include "path" (quoted) and #include <path> (angled) of a scanned file."""
    found = []
    for m in re.finditer(r'(?m)^[ \t]*#[ \t]*include[ \t]*(["<])', code):
        line = code.count("\n", 0, m.start()) + 1
        if m.group(1) == '"':
            found.append((line, lits.get(m.end() - 1, ""), True))
        else:
            end = code.find(">", m.end())
            found.append((line, code[m.end():end], False))
    return found


# 1. Layers.
rows = table_rows(section("Layers and their boundaries"))
order = [r[0] for r in rows]
allowed, sub_allowed = {}, {}  # layer -> layers; sub-library -> (its layer, the layers it adds)


def split_top(text, sep):
    """`text` split at `sep` outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def parse_list(row, text):
    layers = set()
    for entry in split_top(text, ","):
        m = re.fullmatch(r"\s*([^()]+?)(?:\s+\(([^()]+)\))?\s*", entry)
        if not m:
            problems.append(f"layer table, row '{row}': cannot read '{entry.strip()}' (a name, then at most one "
                            f"'(remark)')")
            continue
        for name in m.group(1).split(" and "):
            name = name.strip()
            if name in order:
                layers.add(name)
            elif name not in EXTERNAL:
                problems.append(f"layer table, row '{row}': '{name}' is neither a layer of the table nor an outside "
                                f"library named in scripts/check_architecture.py's EXTERNAL")
    return layers


def cmake_libraries(layer):
    """NAME -> SOURCES of each fathom_library(...) in src/<layer>/CMakeLists.txt."""
    path = os.path.join(root, "src", layer, "CMakeLists.txt")
    if not os.path.exists(path):
        return {}
    text = re.sub(r"#[^\n]*", "", open(path, encoding="utf-8").read())
    libs = {}
    for m in re.finditer(r"fathom_library\(\s*NAME\s+(\w+)(.*?)\)", text, re.S):
        srcs = re.search(r"\bSOURCES\b(.*?)(?:\b(?:DEPS|PRIVATE_DEPS)\b|$)", m.group(2), re.S)
        libs[m.group(1)] = srcs.group(1).split() if srcs else []
    return libs


file_library = {}  # src-relative path -> the sub-library it belongs to
for r in rows:
    layer = r[0]
    if len(r) != 4:
        problems.append(f"layer table, row '{layer}': {len(r)} cells, not 4 (layer, folder, owns, may depend on)")
        allowed[layer] = set()
        continue
    if r[1] != f"`src/{layer}`":
        problems.append(f"layer table, row '{layer}': its folder is {r[1]}, not `src/{layer}`")
    if not os.path.isdir(os.path.join(root, "src", layer)):
        problems.append(f"layer table, row '{layer}': src/{layer} does not exist")
    deps = r[3].strip()
    if deps == "everything above":
        allowed[layer] = set(order[: order.index(layer)])
        continue
    parts = split_top(deps, ";")
    allowed[layer] = parse_list(layer, parts[0])
    libs = cmake_libraries(layer)
    for part in parts[1:]:
        m = re.fullmatch(r"\s*([a-z][a-z0-9_]*):\s*(.+?)\s*", part)
        prefix = layer.replace("/", "_") + "_"
        if not m or not m.group(1).startswith(prefix):
            problems.append(f"layer table, row '{layer}': cannot read '{part.strip()}' (after ';' comes "
                            f"'{prefix}<part>: layers', a sub-library's own dependencies)")
            continue
        sub = m.group(1)
        sub_allowed[sub] = (layer, parse_list(layer, m.group(2)))
        if sub not in libs:
            problems.append(f"layer table, row '{layer}': src/{layer}/CMakeLists.txt builds no fathom_library {sub}")
            continue
        for s in libs[sub]:
            stem = os.path.splitext(s)[0]
            for ext in (os.path.splitext(s)[1], ".h", ".cuh"):
                file_library[f"{layer}/{stem}{ext}"] = sub
for layer in order:
    for d in allowed.get(layer, set()) | set().union(*[a for l, a in sub_allowed.values() if l == layer]):
        if order.index(d) >= order.index(layer):
            problems.append(f"layer table: {layer} may depend on {d}, which does not stand above it")


def closure(deps):
    seen, todo = set(), list(deps)
    while todo:
        d = todo.pop()
        if d not in seen and d in allowed:
            seen.add(d)
            todo.extend(allowed[d])
    return seen


layer_of_dir = sorted(order, key=len, reverse=True)


def layer_of(rel):
    return next((l for l in layer_of_dir if rel.startswith(l + "/")), None)


for rel, text, code, lits in files:
    layer = layer_of(rel)
    if layer is None:
        problems.append(f"src/{rel}: its folder is not in the layer table")
        continue
    own = file_library.get(rel)
    ok = closure(allowed.get(layer, set())) | {layer}
    if own is not None:
        ok |= closure(sub_allowed[own][1])
    for line, inc, quoted in includes(code, lits):
        target = layer_of(inc) if quoted else None
        if target is None:
            continue
        if target not in ok:
            problems.append(f"src/{rel}:{line} includes {inc}: {own or layer} may not depend on {target} "
                            f"(docs/ARCHITECTURE.md's layer table)")
            continue
        lib = file_library.get(inc)
        if lib is None or lib == own:
            continue
        if target == layer:
            problems.append(f"src/{rel}:{line} includes {inc}, a header of fathom::{lib}: the rest of src/{layer} "
                            f"may not depend on it")
        else:
            for d in sorted(sub_allowed[lib][1] - ok):
                problems.append(f"src/{rel}:{line} includes {inc} of fathom::{lib}, which depends on {d}: {layer} "
                                f"may not depend on {d} (docs/ARCHITECTURE.md's layer table)")

# 2. Environment variables.
documented = {}
for r in table_rows(section("Environment variables")):
    m = re.match(r"`([A-Z][A-Z0-9_]+)`", r[0])
    if m and len(r) > 1:
        documented[m.group(1)] = set(re.findall(r"[\w./-]+\.(?:cc|h|cu|cuh)\b", r[1]))
    else:
        problems.append(f"environment table: cannot read the row '{' | '.join(r)}'")
read = {}  # variable -> {file: line}
named_at_call = set()  # the variables a call without a literal name reads: reported at that call


def reads(name, rel, line):
    read.setdefault(name, {}).setdefault(rel, line)


for rel, text, code, lits in files:
    flat = without_preprocessor(code)
    bodies = None
    for m in re.finditer(r"(?:\b\w+\s*::\s*|::\s*)*\b(" + "|".join(READERS) + r")\s*\(", flat):
        line = flat.count("\n", 0, m.start()) + 1
        before = re.search(r"(\w+|\S)\s*$", flat[:m.start()])
        if before and (before.group(1) == ">" or re.fullmatch(r"\w+", before.group(1))) and \
                before.group(1) not in ("return", "co_return", "else", "do", "case"):
            continue  # a declaration or definition (a type before the name), not a call
        arg = re.match(r"\s*", flat[m.end():]).end() + m.end()
        if flat[arg] == '"':
            reads(lits[arg], rel, line)
            continue
        if bodies is None:
            bodies = function_bodies(flat)
        body = next((b for b in bodies if b[0] < m.start() < b[1]), None)
        if body is not None and body[2] in READERS:
            continue  # the reader itself (core/env.cc): its callers name the variables
        call = f"src/{rel}:{line}: {m.group(1)}({flat[arg:flat.find(')', arg)].strip()})"
        names = []
        for where in ([body] if body else []) + [(0, len(flat), "")]:
            names = list(dict.fromkeys(v for k, v in sorted(lits.items())
                                       if where[0] < k < where[1] and ENV_NAME.fullmatch(v)))
            if names:
                break
        if not names:
            problems.append(f"{call} reads a variable whose name is no string literal of its function or file; "
                            f"scripts/check_architecture.py cannot tell which (spell the names out next to the call)")
        for v in names:
            if v not in documented:
                problems.append(f"{call} reads its name from a variable; {v}, a name spelt next to it, is not in "
                                f"docs/ARCHITECTURE.md's environment table")
            reads(v, rel, line)
            named_at_call.add(v)
    for k, v in lits.items():
        if re.fullmatch(r"FATHOM_[A-Z0-9_]+", v):
            reads(v, rel, code.count("\n", 0, k) + 1)
for v, where in sorted(read.items()):
    if v not in documented and v not in named_at_call:
        rel, line = sorted(where.items())[0]
        problems.append(f"src/{rel}:{line} reads {v}, which docs/ARCHITECTURE.md's environment table does not list")
for v, named in sorted(documented.items()):
    if v not in read:
        problems.append(f"docs/ARCHITECTURE.md lists {v}, which nothing in src/ reads any more")
        continue
    actual = set(read[v])
    if named != actual:
        problems.append(f"docs/ARCHITECTURE.md's environment table says {v} is read by "
                        f"{', '.join(sorted(named)) or 'nothing'}; src/ reads it in {', '.join(sorted(actual))}")

# 3. Launcher headers.
cuda_text = section("The CUDA backend today")
rule = next((b for b in cuda_text.split("\n- ") if "Launchers take" in b), None)
if rule is None:
    problems.append("docs/ARCHITECTURE.md's '## The CUDA backend today' has no bullet with the launcher rule "
                    "('Launchers take ...')")
launchers = {rel for rel, text, code, lits in files
             if rel.startswith("backend/cuda/") and rel.endswith(".h")
             and (rel == "backend/cuda/launcher.h" or re.search(r"\bint\s+Launch[A-Z]\w*\s*\(", code))}
seen_exceptions = set()
for rel, text, code, lits in files:
    if rel not in launchers:
        continue
    for line, inc, quoted in includes(code, lits):
        if (rel, inc) in LAUNCHER_EXCEPTIONS:
            seen_exceptions.add((rel, inc))
        elif quoted and not (inc.startswith("core/") or inc in launchers):
            problems.append(f"src/{rel}:{line} includes \"{inc}\": a launcher header includes only the standard "
                            f"library, core/ and other launcher headers (docs/ARCHITECTURE.md, The CUDA backend today)")
        elif not quoted and ("." in inc or "/" in inc):
            problems.append(f"src/{rel}:{line} includes <{inc}>: a launcher header includes no CUDA or other "
                            f"outside header, only the C++ standard library (docs/ARCHITECTURE.md)")
for header, inc in sorted(LAUNCHER_EXCEPTIONS):
    if (header, inc) not in seen_exceptions:
        problems.append(f"src/{header} no longer includes {inc}: remove the exception from "
                        f"scripts/check_architecture.py's LAUNCHER_EXCEPTIONS and docs/ARCHITECTURE.md's rule")
    elif rule is not None and (header not in rule or inc not in rule):
        problems.append(f"docs/ARCHITECTURE.md's launcher rule does not name its exception: {header} includes {inc}")

# 4. The Backends section's two rules: no cast of a Backend to its concrete class outside src/backend, and no exit
# or signal disposition in a library outside src/cli.
BACKEND_CLASSES = sorted({m.group(1) for rel, text, code, lits in files if rel.startswith("backend/")
                          for m in re.finditer(r"\bclass\s+(\w+)\s*(?:final\s*)?:\s*public\s+Backend\b", code)})
for rel, text, code, lits in files:
    flat = without_preprocessor(code)
    if not rel.startswith("backend/"):
        for m in re.finditer(r"\b(?:dynamic|static|reinterpret)_cast\s*<\s*(?:const\s+)?(\w+)\s*\*", flat):
            if m.group(1) in BACKEND_CLASSES:
                line = flat.count(chr(10), 0, m.start()) + 1
                problems.append(f"src/{rel}:{line} casts to {m.group(1)}: code outside src/backend asks a Backend "
                                f"through its virtuals (docs/ARCHITECTURE.md, Backends)")
    if not rel.startswith("cli/"):
        for m in re.finditer(r"(?<![\w.>:])(?:std\s*::\s*|::\s*)?(exit|_exit|quick_exit|signal|sigaction)\s*\(", flat):
            before = re.search(r"(\w+|\S)\s*$", flat[:m.start()])
            if before and re.fullmatch(r"\w+", before.group(1)) and before.group(1) not in ("return", "else", "do"):
                continue  # a declaration (a type before the name)
            problems.append(f"src/{rel}:{flat.count(chr(10), 0, m.start()) + 1} calls {m.group(1)}(): only src/cli "
                            f"ends the process or sets signal dispositions (docs/ARCHITECTURE.md, Backends)")

for p in problems:
    print(p)
print(f"checked {len(order)} layers, {len(documented)} environment variables, {len(launchers)} launcher headers and "
      f"{len(BACKEND_CLASSES)} backend classes: {'OK' if not problems else str(len(problems)) + ' stale'}")
sys.exit(1 if problems else 0)
