#!/usr/bin/env bash
# Replicas on one GPU against one engine: `fathom bench` (online, concurrency 64, 512 prompt ids in, 128 tokens out,
# ignore_eos) against `fathom serve` on the R1-Distill-Qwen-1.5B config with dummy weights, in three layouts:
#   single  one engine (--gpu-memory-utilization 0.9)
#   dp2     --data-parallel-size 2 --device cuda:0: two replicas in one process, 0.45 of the memory each
#   ports2  two `--reuse-port` processes on one port, --gpu-memory-utilization 0.45 each
# Writes OUT/<layout>.json (fathom bench's report), OUT/<layout>.serve.log and OUT/summary.json.
#
#   bench/replicas.sh build/cuda-release/bin/fathom /tmp/replicas-out
set -euo pipefail
bin="$(realpath "$1")"
out="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
port=8000
model="$(mktemp -d)"
# The real config with the DeepSeek-V3 tokenizer's vocabulary, so that one tokenizer from tests/data serves it.
python3 - "$root/tests/data/configs/deepseek-r1-distill-qwen-1.5b.json" "$model/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["vocab_size"] = 129280
json.dump(c, open(sys.argv[2], "w"))
EOF
gunzip -c "$root/tests/data/tokenizers/deepseek-v3/tokenizer.json.gz" >"$model/tokenizer.json"
cp "$root/tests/data/tokenizers/deepseek-v3/tokenizer_config.json" "$model/"

pids=()
start() {  # start NAME ARGS...: one server process, waits until its log says it is ready
  local name="$1"
  shift
  "$bin" serve --model "$model/config.json" --load-format dummy --port "$port" --max-model-len 2048 \
    --access-log off "$@" >"$out/$name.serve.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    grep -q "ready: serving" "$out/$name.serve.log" && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || { tail -20 "$out/$name.serve.log"; return 1; }
    sleep 0.5
  done
  return 1
}
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
bench() {  # bench NAME EXTRA...
  local name="$1"
  shift
  echo "== $name: fathom bench at concurrency 64" >&2
  "$bin" bench --base-url "http://127.0.0.1:$port" --input-len 512 --output-len 128 --ignore-eos --prompt-format ids \
    --concurrency 64 --num-requests 512 --warmup 16 --output "$out/$name.json" "$@" >"$out/$name.bench.txt" 2>&1 ||
    { tail -20 "$out/$name.bench.txt"; return 1; }
  tail -12 "$out/$name.bench.txt" >&2
}

start single --device cuda:0
bench single
stop_all

start dp2 --device cuda:0 --data-parallel-size 2
bench dp2
stop_all

start ports2-a --device cuda:0 --reuse-port --gpu-memory-utilization 0.45
start ports2-b --device cuda:0 --reuse-port --gpu-memory-utilization 0.45
bench ports2
stop_all

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = {}
for name in ["single", "dp2", "ports2"]:
    path = os.path.join(out, name + ".json")
    if os.path.exists(path):
        rows[name] = json.load(open(path))
json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
