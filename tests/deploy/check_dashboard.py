#!/usr/bin/env python3
"""Checks a Grafana dashboard: valid JSON and layout, and every fathom_* / process_* metric it queries exists.

  check_dashboard.py deploy/grafana/fathom.json --names tests/deploy/metric_names.txt --require-all
  check_dashboard.py deploy/grafana/fathom.json --metrics scrape.txt          # a saved GET /metrics body
  curl -s 127.0.0.1:8000/metrics | check_dashboard.py deploy/grafana/fathom.json --metrics -
  check_dashboard.py deploy/grafana/fathom.json --metrics-url http://127.0.0.1:8000/metrics

Names come from --names files (one family name a line, '#' comments) and/or Prometheus text exposition
(--metrics FILE or '-', --metrics-url): the names of '# TYPE' lines and of samples. A queried name matches when it is
known as is, or when it ends in _bucket, _sum or _count and its family is known. --require-all also fails when a known
fathom_* / process_* family is not used on the dashboard. Exit status 0 when all checks pass, 1 otherwise.
Python standard library only.
"""

import argparse
import json
import re
import sys
import urllib.request

METRIC_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:fathom|process)_[A-Za-z0-9_:]*)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
GRID_WIDTH = 24


def names_from_list(text):
    names = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(line)
    return names


def names_from_exposition(text):
    """Family names from '# TYPE name type' lines and sample names from sample lines."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "TYPE":
                names.add(parts[2])
            continue
        match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)", line)
        if match:
            names.add(match.group(1))
    return names


def family(name):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def walk_panels(panels):
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))  # rows hold their panels when collapsed


def expressions(dashboard):
    """(where, expr) for every PromQL string: panel targets, template variable queries, annotations."""
    for panel in walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" in target:
                yield f"panel {panel.get('id')} '{panel.get('title')}' target {target.get('refId')}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if isinstance(query, str) and variable.get("type") == "query":
            yield f"variable '{variable.get('name')}'", query
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if isinstance(annotation.get("expr"), str):
            yield f"annotation '{annotation.get('name')}'", annotation["expr"]


def check_layout(dashboard, errors):
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list)):
        if not isinstance(dashboard.get(key), kind):
            errors.append(f"dashboard: '{key}' missing or not a {kind.__name__}")
    if errors:
        return
    ids = set()
    for panel in walk_panels(dashboard["panels"]):
        where = f"panel {panel.get('id')} '{panel.get('title')}'"
        pid = panel.get("id")
        if not isinstance(pid, int):
            errors.append(f"{where}: no integer id")
        elif pid in ids:
            errors.append(f"{where}: duplicate id")
        ids.add(pid)
        if not panel.get("type") or not panel.get("title"):
            errors.append(f"{where}: no type or title")
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")):
            errors.append(f"{where}: gridPos needs integer h, w, x, y")
        elif grid["x"] < 0 or grid["w"] <= 0 or grid["x"] + grid["w"] > GRID_WIDTH:
            errors.append(f"{where}: gridPos outside the {GRID_WIDTH}-column grid")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets", [])
        if not targets:
            errors.append(f"{where}: no targets")
        for target in targets:
            if not str(target.get("expr", "")).strip():
                errors.append(f"{where}: target {target.get('refId')} has no expr")
            if not target.get("refId"):
                errors.append(f"{where}: a target has no refId")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dashboard", help="Grafana dashboard JSON")
    parser.add_argument("--names", action="append", default=[], help="file of metric family names, one a line")
    parser.add_argument("--metrics", action="append", default=[], help="Prometheus text exposition file, or - for stdin")
    parser.add_argument("--metrics-url", action="append", default=[], help="URL to scrape (e.g. a live /metrics)")
    parser.add_argument("--require-all", action="store_true",
                        help="also fail when a known fathom_*/process_* family is not used on the dashboard")
    args = parser.parse_args(argv)
    if not (args.names or args.metrics or args.metrics_url):
        parser.error("give at least one of --names, --metrics, --metrics-url")

    known = set()
    for path in args.names:
        with open(path, encoding="utf-8") as f:
            known |= names_from_list(f.read())
    for path in args.metrics:
        if path == "-":
            known |= names_from_exposition(sys.stdin.read())
        else:
            with open(path, encoding="utf-8") as f:
                known |= names_from_exposition(f.read())
    for url in args.metrics_url:
        with urllib.request.urlopen(url, timeout=10) as response:
            known |= names_from_exposition(response.read().decode("utf-8"))
    if not known:
        print("no metric names given", file=sys.stderr)
        return 1

    errors = []
    try:
        with open(args.dashboard, encoding="utf-8") as f:
            dashboard = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"{args.dashboard}: {e}", file=sys.stderr)
        return 1
    if not isinstance(dashboard, dict):
        print(f"{args.dashboard}: not a JSON object", file=sys.stderr)
        return 1
    check_layout(dashboard, errors)

    used = {}  # family name -> first place it is used
    for where, expr in expressions(dashboard):
        for name in METRIC_RE.findall(expr):
            fam = name if name in known else family(name)
            if name not in known and fam not in known:
                errors.append(f"{where}: unknown metric '{name}' in: {expr}")
            used.setdefault(fam, where)
    if not used:
        errors.append("no fathom_* or process_* metric found in any expression")
    if args.require_all:
        wanted = {family(n) for n in known if METRIC_RE.fullmatch(n)}
        for name in sorted(wanted - set(used)):
            errors.append(f"metric family '{name}' is not used on the dashboard")

    for error in errors:
        print(error, file=sys.stderr)
    print(f"{args.dashboard}: {len(used)} metric families used, {len(known)} names known, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
