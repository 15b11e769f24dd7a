#!/usr/bin/env bash
# Structured output's cost on the GPU (issue: agents' API, "the mask hidden behind the forward pass"): `fathom serve
# --device cuda` on real configs with dummy weights, then `fathom bench` (online, closed loop, 512 random prompt ids
# in, 256 tokens out, ignore_eos, greedy) at concurrency 1 and 64, once plain and once with every request under a
# JSON schema (bench/schemas/records64.json through vLLM's `guided_json`: 64 records, so no output of 256 tokens
# finishes it and every token is constrained). The decode step time is read from the server's own histogram,
# fathom_step_duration_seconds{kind="decode"} (its sum and count before and after each level); the bench's TPOT and
# ITL are kept beside it. A warm-up level at concurrency 64 comes first, then two rounds with the modes alternating.
# Then a correctness pass on the same server: constrained requests (greedy, temperature 1 on the device sampler, n = 2
# forked on the host) whose outputs must parse and follow their schema.
#
#   [ROUNDS=2] bench/grammar_gpu.sh FATHOM_BINARY OUT_DIR [llama8b] [v2lite]
#
# Models: llama8b = the R1-Distill-Llama-8B config with the Llama-3.1 tokenizer (tests/data/tokenizers/llama-3.1);
# v2lite = the DeepSeek-V2-Lite config with vocab_size 129280 and the DeepSeek-V3 tokenizer (so that one tokenizer
# from tests/data serves it). Writes OUT/<model>-<mode>-c<concurrency>-r<round>.json (fathom bench's report),
# OUT/<model>.serve.log, OUT/<model>-check.json and OUT/summary.json.
set -euo pipefail
bin="$(realpath "$1")"
out="$2"
shift 2
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(llama8b v2lite)
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
port=8011
schema="$root/bench/schemas/records64.json"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

make_model() {  # make_model NAME DIR
  local name="$1" dir="$2" cfg tok vocab
  case "$name" in
    llama8b) cfg=deepseek-r1-distill-llama-8b.json tok=llama-3.1 vocab=0 ;;
    v2lite) cfg=deepseek-v2-lite.json tok=deepseek-v3 vocab=129280 ;;
    *) echo "unknown model $name" >&2; return 1 ;;
  esac
  mkdir -p "$dir"
  "$py" - "$root/tests/data/configs/$cfg" "$dir/config.json" "$vocab" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
if int(sys.argv[3]) > 0:
    c["vocab_size"] = int(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
EOF
  gunzip -c "$root/tests/data/tokenizers/$tok/tokenizer.json.gz" >"$dir/tokenizer.json"
  cp "$root/tests/data/tokenizers/$tok/tokenizer_config.json" "$dir/"
}

pid=""
start() {  # start NAME DIR
  "$bin" serve --model "$2/config.json" --load-format dummy --device cuda --port "$port" --max-model-len 2048 \
    --access-log off >"$out/$1.serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 900); do
    grep -q "ready: serving" "$out/$1.serve.log" && return 0
    kill -0 "$pid" 2>/dev/null || { tail -20 "$out/$1.serve.log" >&2; return 1; }
    sleep 0.5
  done
  return 1
}
stop() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
  [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  pid=""
}
trap stop EXIT

scrape() {  # scrape FILE: the decode steps' histogram sum and count
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^fathom_step_duration_seconds_(sum|count)\{kind="decode"' >"$1" || true
}

for m in "${models[@]}"; do
  dir="$(mktemp -d)"
  make_model "$m" "$dir"
  echo "== $m: starting fathom serve --device cuda" >&2
  start "$m" "$dir"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv >"$out/$m.memory.txt" 2>&1 || true
  # A warm-up level at 64 first (longer-context graphs, pools, caches), so that neither measured mode pays for them.
  "$bin" bench --base-url "http://127.0.0.1:$port" --input-len 512 --output-len 64 --ignore-eos --prompt-format ids \
    --concurrency 64 --num-requests 64 --warmup 0 >"$out/$m-warmup.txt" 2>&1 || { tail -20 "$out/$m-warmup.txt" >&2; exit 1; }
  # Two rounds, the modes alternating, so that drift over time falls on both.
  for round in $(seq "${ROUNDS:-2}"); do
    for c in 1 64; do
      for mode in plain schema; do
        extra='{}'
        [ "$mode" = schema ] && extra="$("$py" -c 'import json,sys; print(json.dumps({"guided_json": json.load(open(sys.argv[1]))}))' "$schema")"
        n=$((c == 1 ? 6 : 128))
        tag="$m-$mode-c$c-r$round"
        scrape "$out/$tag.before"
        echo "== $m $mode: fathom bench at concurrency $c (round $round)" >&2
        "$bin" bench --base-url "http://127.0.0.1:$port" --input-len 512 --output-len 256 --ignore-eos \
          --prompt-format ids --concurrency "$c" --num-requests "$n" --warmup 2 --extra-body "$extra" \
          --output "$out/$tag.json" >"$out/$tag.txt" 2>&1 || { tail -20 "$out/$tag.txt" >&2; exit 1; }
        scrape "$out/$tag.after"
      done
    done
  done
  echo "== $m: constrained outputs on the GPU" >&2
  "$py" - "$port" "$out/$m-check.json" <<'EOF'
import json, sys, urllib.request
port, path = sys.argv[1], sys.argv[2]
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
          "age": {"type": "integer", "minimum": 0, "maximum": 99},
          "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())
def valid(text):
    v = json.loads(text)
    assert set(v) == {"name", "age", "tags"}, v
    assert isinstance(v["name"], str) and len(v["name"]) <= 10, v
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 99, v
    assert isinstance(v["tags"], list) and len(v["tags"]) <= 3 and all(t in "abc" for t in v["tags"]), v
    return v
results, bad = [], 0
for i, extra in enumerate([{"temperature": 0}, {"temperature": 1.0, "seed": 7}, {"temperature": 1.0, "seed": 8, "n": 2},
                           {"temperature": 0.7, "top_p": 0.9, "seed": 9}] * 4):
    r = post(dict({"prompt": f"Person {i}:", "max_tokens": 300, "guided_json": schema}, **extra))
    for ch in r["choices"]:
        try:
            valid(ch["text"])
            ok = ch["finish_reason"] == "stop"
        except Exception as e:
            ok = False
        bad += not ok
        results.append({"request": extra, "finish_reason": ch["finish_reason"], "text": ch["text"], "valid": ok})
json.dump({"outputs": len(results), "invalid": bad, "results": results}, open(path, "w"), indent=1)
print(f"constrained outputs: {len(results)}, invalid: {bad}", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
  stop
done

"$py" - "$out" "${ROUNDS:-2}" "${models[@]}" <<'EOF'
import json, os, sys
out, rounds, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def hist(p):
    d = {}
    for line in open(p):
        k, v = line.split()
        d["sum" if "_sum" in k else "count"] = float(v)
    return d
summary = {}
for m in models:
    for c in (1, 64):
        row = {}
        for mode in ("plain", "schema"):
            steps = total = 0.0
            runs = []
            for r in range(1, rounds + 1):
                tag = f"{out}/{m}-{mode}-c{c}-r{r}"
                b, a = hist(tag + ".before"), hist(tag + ".after")
                n, s = a.get("count", 0) - b.get("count", 0), a.get("sum", 0) - b.get("sum", 0)
                steps, total = steps + n, total + s
                lv = json.load(open(tag + ".json"))["levels"][0]
                runs.append({"decode_step_ms": 1e3 * s / n if n else None, "decode_steps": n,
                             "itl_ms_median": lv["itl_ms"]["median"], "tpot_ms_mean": lv["tpot_ms"]["mean"],
                             "output_tok_s": lv["output_throughput"], "completed": lv["completed"],
                             "failed": lv["failed"]})
            row[mode] = {"decode_step_ms": 1e3 * total / steps if steps else None, "decode_steps": steps, "runs": runs}
        p, s = row["plain"]["decode_step_ms"], row["schema"]["decode_step_ms"]
        row["step_ratio_schema_to_plain"] = s / p if p and s else None
        summary[f"{m}_c{c}"] = row
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
EOF
