#!/usr/bin/python3
"""Validates constrained-decoding outputs against their JSON schemas with python3-jsonschema (Debian's).

Usage: validate_outputs.py FILE.jsonl, each line {"id", "schema", "output"}: output is the generated text. Prints
one line per output that does not parse or does not validate, and exits 1 if there was any.
"""
import json
import sys

import jsonschema

bad = 0
count = 0
for line in open(sys.argv[1], encoding="utf-8"):
    case = json.loads(line)
    count += 1
    try:
        instance = json.loads(case["output"])
    except ValueError as e:
        bad += 1
        print(f"{case['id']}: not JSON ({e}): {case['output'][:300]!r}")
        continue
    schema = case["schema"]
    if isinstance(schema, dict):
        # fathom resolves every $ref inside the document: so does the validator, whatever base the root's id names.
        schema = {k: v for k, v in schema.items() if k not in ("$id", "id")}
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        errors = list(validator.iter_errors(instance))
    except jsonschema.exceptions.RefResolutionError as e:
        bad += 1
        print(f"{case['id']}: the validator could not resolve a $ref: {e}")
        continue
    if errors:
        bad += 1
        print(f"{case['id']}: {errors[0].message[:300]} at {list(errors[0].absolute_path)}: {case['output'][:300]!r}")
print(f"validated {count} outputs, {bad} invalid")
sys.exit(1 if bad else 0)
