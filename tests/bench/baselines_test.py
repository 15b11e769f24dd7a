#!/usr/bin/env python3
"""bench/baselines/*.json, the current headline figures of each card: every file against
bench/schemas/baseline.schema.json, and each figure for consistency:
  - its ratio is value / peer_value (to 3 digits), and a same-lease peer value has its ratio;
  - a target of the form '>= N unit', '<= N unit', '>= Nx the peer' (joined by ' and ') agrees with met;
  - its mbu is near value / roofline, and a higher-is-better value is not past its roofline;
  - its card is the file's (an NVIDIA card on a GPU file) and its round's machine names it;
  - its round is bench/results/ROUND.json, which holds the figure's value and commit, on the figure's date;
  - its commit exists in git (skipped outside a git checkout, or in a shallow one).

  tests/bench/baselines_test.py                     (what ctest runs: bench_baselines)
  FATHOM_BASELINES_DIR=DIR tests/bench/baselines_test.py   (another folder of baseline files, e.g. a copy)
"""
import glob
import json
import math
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(ROOT, "bench", "schemas", "baseline.schema.json")
RESULTS = os.path.join(ROOT, "bench", "results")

BOUND = re.compile(r"^(>=|<=) (-?[0-9][0-9.]*)(?: ([^0-9]*))?$")
PEER_RATIO = re.compile(r"^>= ([0-9][0-9.]*)x the peer$")
MBU_SLACK = 0.02  # mbu counts the step's mean-context KV bytes, the roofline the weights' and the prompt's


def target_met(fig):
    """Whether fig meets its target, or None when the target is not in the checkable form (or needs a missing ratio)."""
    if not fig["target"]:
        return None
    met = True
    for part in fig["target"].split(" and "):
        m = PEER_RATIO.match(part)
        if m:
            if fig["ratio"] is None:
                return None
            met = met and fig["value"] / fig["peer_value"] >= float(m.group(1))
            continue
        m = BOUND.match(part)
        if not m:
            return None
        bound = float(m.group(2))
        met = met and (fig["value"] >= bound if m.group(1) == ">=" else fig["value"] <= bound)
    return met


def git_commits_checkable(root):
    """True inside a full git checkout of root (git present, not shallow)."""
    try:
        inside = subprocess.run(["git", "-C", root, "rev-parse", "--is-inside-work-tree"], capture_output=True,
                                text=True)
        shallow = subprocess.run(["git", "-C", root, "rev-parse", "--is-shallow-repository"], capture_output=True,
                                 text=True)
    except OSError:
        return False
    return inside.returncode == 0 and inside.stdout.strip() == "true" and shallow.stdout.strip() == "false"


def commit_exists(root, commit):
    found = subprocess.run(["git", "-C", root, "cat-file", "-e", commit + "^{commit}"], capture_output=True)
    return found.returncode == 0


def validate_schema(doc):
    """The schema's errors for doc as (path, message) pairs, empty when it conforms. jsonschema is Debian's
    python3-jsonschema (scripts/setup)."""
    import jsonschema  # not at the top: a missing package fails this check with its name, never skips it
    with open(SCHEMA) as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    return [(list(e.absolute_path), e.message) for e in cls(schema).iter_errors(doc)]


def check_figure(fig, doc, results_dir, rounds):
    """The problems of one figure (schema-valid) of baseline doc."""
    p = []
    value, pv, ratio = fig["value"], fig["peer_value"], fig["ratio"]
    if ratio is not None:
        if not pv:
            p.append(f"ratio {ratio} without a peer value")
        elif not math.isclose(ratio, value / pv, rel_tol=1e-3, abs_tol=6e-4):
            p.append(f"ratio {ratio} is not value / peer_value = {value} / {pv} = {value / pv:.4f}")
    elif pv is not None and fig["peer_same_lease"]:
        p.append("a peer value measured in the same lease but no ratio")
    if pv is not None and fig["peer_same_lease"] is None:
        p.append("a peer value without peer_same_lease (true or false)")
    computed = target_met(fig)
    if computed is not None and fig["met"] is not None and computed != fig["met"]:
        p.append(f"met is {fig['met']} but {value} against '{fig['target']}' gives {computed}")
    roof = fig["roofline"]
    if "mbu" in fig:
        if roof is None:
            p.append("mbu without a roofline")
        elif abs(fig["mbu"] - value / roof) > MBU_SLACK:
            p.append(f"mbu {fig['mbu']} is far from value / roofline = {value / roof:.3f}")
    if roof is not None and fig["better"] == "higher" and value > roof:
        p.append(f"value {value} is past its roofline {roof}")
    if fig["card"] != doc["card"]:
        p.append(f"card '{fig['card']}' is not the file's '{doc['card']}'")
    rnd = rounds.get(fig["round"])
    if rnd is None:
        path = os.path.join(results_dir, fig["round"] + ".json")
        try:
            with open(path) as f:
                text = f.read()
            rnd = rounds[fig["round"]] = (text, json.loads(text))
        except (OSError, ValueError) as e:
            rnd = rounds[fig["round"]] = (None, str(e))
    text, data = rnd
    if text is None:
        p.append(f"round {fig['round']}: {data}")
        return p
    if json.dumps(value) not in text and str(value) not in text:
        p.append(f"value {value} is not in bench/results/{fig['round']}.json")
    if fig["commit"][:7] not in text:
        p.append(f"commit {fig['commit']} is not in bench/results/{fig['round']}.json")
    if isinstance(data.get("date"), str) and data["date"] != fig["date"]:
        p.append(f"date {fig['date']} is not the round's {data['date']}")
    if isinstance(data.get("machine"), str) and fig["card"] not in data["machine"]:
        p.append(f"the round's machine ({data['machine'][:60]}...) does not name {fig['card']}")
    return p


def check_file(path, results_dir=RESULTS, root=ROOT, git=None):
    """The problems of one baseline file, each prefixed by the file and the figure."""
    name = os.path.basename(path)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return [f"{name}: {e}"]
    errors = validate_schema(doc)
    if any(len(where) < 2 or where[0] != "figures" for where, _ in errors):  # the file's own fields: nothing holds
        return [f"{name}: {'/'.join(str(k) for k in where) or '(top)'}: {m}" for where, m in errors]
    bad = {where[1] for where, _ in errors}
    problems = [f"{name}: {doc['figures'][where[1]].get('name', where[1])}: "
                f"{''.join(str(k) + ': ' for k in where[2:])}{m}" for where, m in errors]
    if doc["name"] != name[:-len(".json")]:
        problems.append(f"{name}: name '{doc['name']}' is not the file's stem")
    if doc["kind"] == "gpu" and not doc["card"].startswith("NVIDIA "):
        problems.append(f"{name}: a GPU file's card is nvidia-smi's name (NVIDIA ...), not '{doc['card']}'")
    seen, rounds = set(), {}
    if git is None:
        git = git_commits_checkable(root)
    for i, fig in enumerate(doc["figures"]):
        if i in bad:
            continue  # its schema errors are listed; the checks below assume its fields
        if fig["name"] in seen:
            problems.append(f"{name}: {fig['name']} twice")
        seen.add(fig["name"])
        problems += [f"{name}: {fig['name']}: {m}" for m in check_figure(fig, doc, results_dir, rounds)]
        if git and not commit_exists(root, fig["commit"]):
            problems.append(f"{name}: {fig['name']}: commit {fig['commit']} is not in this repository's history")
    return problems


class BaselinesTest(unittest.TestCase):
    def test_every_baseline_file(self):
        folder = os.environ.get("FATHOM_BASELINES_DIR", os.path.join(ROOT, "bench", "baselines"))
        paths = sorted(glob.glob(os.path.join(folder, "*.json")))
        self.assertTrue(paths, f"no baseline in {folder}")
        git = git_commits_checkable(ROOT)
        if not git:
            print("baselines_test: no full git history here: commits checked for form only", file=sys.stderr)
        problems = []
        for path in paths:
            problems += check_file(path, git=git)
        self.assertEqual(problems, [], "\n" + "\n".join(problems))
        print(f"baselines_test: {', '.join(os.path.basename(p) for p in paths)}: OK", file=sys.stderr)

    def test_target_form(self):
        fig = {"value": 230.5, "peer_value": 200.0, "ratio": 1.153, "target": ">= 270 tok/s"}
        self.assertFalse(target_met(fig))
        self.assertTrue(target_met(dict(fig, target=">= 1.1x the peer")))
        self.assertFalse(target_met(dict(fig, target=">= 200 tok/s and >= 1.2x the peer")))
        self.assertTrue(target_met(dict(fig, target="<= 250 ms")))
        self.assertIsNone(target_met(dict(fig, target="within 5% of the offline figure")))
        self.assertIsNone(target_met(dict(fig, ratio=None, peer_value=None, target=">= 1.2x the peer")))


if __name__ == "__main__":
    unittest.main()
