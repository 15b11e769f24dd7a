#!/usr/bin/env bash
# The multi-GPU runs (tensor and expert parallelism), one part per device call on a machine of several GPUs, each
# run writing its own files under OUT_DIR (a call cut short keeps what it finished). NCCL's NVLink multicast stays off,
# as the lent machines require.
#
#   bench/multi_gpu.sh PART BIN_DIR OUT_DIR        (on the GPU machine, repository root; BIN_DIR: fathom,
#                                                  comm_nccl_test, from `cmake --preset cuda-release`)
#     PART correct:  comm_nccl_test: every golden fixture at tp = 2 and 4 (where it splits and the GPUs exist) against
#                    tp = 1, float32 and bf16 rules, the DeepSeek ones also with expert parallelism, and batch
#                    invariance at tp = 2 (tests/comm/nccl_golden_test.cc); then `fathom serve -tp 2` answers a
#                    completion and /health
#     PART dense:    R1-Distill-Llama-8B shape, batch-1 decode at tp = 1, 2, 4 and 64 / 256 sequences at tp = 2, each
#                    with its collective time per step; NCCL's own all-reduce at the same sizes (nccl_allreduce.py)
#     PART moe:      DeepSeek-V2-Lite at tp = 2, with and without --enable-expert-parallel, batch 1 and 256
#     PART llama70b: the R1-Distill-Llama-70B shape (tests/data/configs/deepseek-r1-distill-llama-70b.json, dummy bf16)
#                    at tp = 2 and 4: batch-1 decode and 256 sequences
#     PART v3:       DeepSeek-V3 FP8 (dummy weights, the real config) at tp = 8 with expert parallelism: the memory plan
#                    (fathom inspect), batch-1 decode, 64 and 256 sequences, a 512-token prefill
#
# Back here: the round's summary goes to bench/results/ROUND.json and its OUT_DIR into bench/results/ROUND.tar.xz
# (bench/results/README.md); headline figures to bench/baselines/CARD.json. Every figure is stated
# beside tp = 1 from the same call (dense, moe) or its anchor (v3: SGLang's 43 tok/s without MTP on 8 x H200).
set -uo pipefail

part=$1 bin=$2 out=$3
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
t0=$(date +%s)
log() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$out/timeline.txt" >&2; }
nvidia-smi >"$out/gpu.txt" 2>&1
nvidia-smi topo -m >"$out/topo.txt" 2>&1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "$part on $gpus GPUs" >"$out/part.txt"
export NCCL_NVLS_ENABLE=0
configs=tests/data/configs

# fathom bench --offline NAME ARGS...: the run's JSON, log and command line under OUT_DIR.
bench() {
  local name=$1
  shift
  log "fathom bench $name: $*"
  "$bin/fathom" bench --offline --device cuda --load-format dummy "$@" --output "$out/$name.json" >"$out/$name.log" 2>&1
  log "fathom bench $name: rc=$?"
  echo "fathom bench --offline --device cuda --load-format dummy $*" >"$out/$name.command"
}
# tp N fits on this machine.
fits() { [ "$1" -le "$gpus" ]; }

case "$part" in
  correct)
    log "comm_nccl_test"
    "$bin/comm_nccl_test" --gtest_output="json:$out/comm_nccl_test.json" >"$out/comm_nccl_test.log" 2>&1
    log "comm_nccl_test: rc=$?"
    dir=/tmp/mgpu-demo
    mkdir -p "$dir"
    cp "$configs/deepseek-v2-lite.json" "$dir/config.json"
    tok=/tmp/mgpu-tokenizer
    mkdir -p "$tok"
    zcat tests/data/tokenizers/qwen3/tokenizer.json.gz >"$tok/tokenizer.json"
    cp tests/data/tokenizers/qwen3/tokenizer_config.json "$tok/"
    log "fathom serve -tp 2 (V2-Lite, dummy weights)"
    "$bin/fathom" serve --device cuda -tp 2 --model "$dir" --load-format dummy --tokenizer "$tok" --max-model-len 4096 \
      --port 8000 >"$out/serve-tp2.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 240); do
      curl -sf localhost:8000/health >/dev/null 2>&1 && break
      sleep 1
    done
    curl -s localhost:8000/health >"$out/serve-tp2-health.json" 2>&1
    curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \
      -d '{"prompt": [1, 2, 3, 4], "max_tokens": 16, "ignore_eos": true}' >"$out/serve-tp2-completion.json" 2>&1
    curl -s localhost:8000/metrics | grep -E '^fathom_(engine_failed|collective)' >"$out/serve-tp2-metrics.txt" 2>&1
    kill "$pid"
    wait "$pid"
    log "fathom serve -tp 2: stopped, rc=$?"
    ;;
  dense)
    llama="--model $configs/deepseek-r1-distill-llama-8b.json --input-len 512 --output-len 128"
    for tp in 1 2 4; do
      # shellcheck disable=SC2086  # the argument lists are lists of words
      fits "$tp" && bench "llama8b-tp$tp-b1" $llama -tp "$tp" --batch-size 1
    done
    # shellcheck disable=SC2086
    fits 2 && bench "llama8b-tp2-b64-256" $llama -tp 2 --batch-size 64,256
    # The all-reduce's device time per step (fathom's own collective figure is the host's enqueue time on GPUs): NCCL's
    # kernels in an Nsight Systems trace of the tp = 2 batch-1 run, where nsys exists.
    if fits 2 && command -v nsys >/dev/null; then
      log "nsys: llama8b tp 2 batch 1"
      # shellcheck disable=SC2086
      nsys profile -o "$out/llama8b-tp2-b1" --force-overwrite true --trace cuda,nvtx \
        "$bin/fathom" bench --offline --device cuda --load-format dummy $llama -tp 2 --batch-size 1 --output-len 32 \
        >"$out/nsys-run.log" 2>&1
      nsys stats --report cuda_gpu_kern_sum --format csv "$out/llama8b-tp2-b1.nsys-rep" 2>/dev/null |
        grep -iE 'nccl|Name' >"$out/llama8b-tp2-b1-nccl-kernels.csv"
      rm -f "$out"/*.nsys-rep "$out"/*.sqlite
      log "nsys: done"
    fi
    log "nccl_allreduce.py"
    # A decode step's all-reduce: n tokens x 4096 hidden, float32 (fathom's activations): 1, 64 and 256 tokens.
    python3 "$here/nccl_allreduce.py" --ranks 2,4 --elements 4096,262144,1048576 --dtypes float32,bfloat16 \
      >"$out/nccl_allreduce.jsonl" 2>"$out/nccl_allreduce.log"
    log "nccl_allreduce.py: rc=$?"
    ;;
  moe)
    v2="--model $configs/deepseek-v2-lite.json --max-model-len 4096 --input-len 512 --output-len 128"
    # shellcheck disable=SC2086
    bench v2lite-tp1 $v2 --batch-size 1,256
    if fits 2; then
      # shellcheck disable=SC2086
      bench v2lite-tp2 $v2 -tp 2 --batch-size 1,256
      # shellcheck disable=SC2086
      bench v2lite-tp2-ep $v2 -tp 2 --enable-expert-parallel --batch-size 1,256
    fi
    ;;
  llama70b)
    l70="--model $configs/deepseek-r1-distill-llama-70b.json --max-model-len 4096 --input-len 512 --output-len 64"
    for tp in 2 4; do
      # shellcheck disable=SC2086
      fits "$tp" && bench "llama70b-tp$tp" $l70 -tp "$tp" --batch-size 1,256
    done
    ;;
  v3)
    v3="--model $configs/deepseek-v3.json -tp 8 --enable-expert-parallel"
    log "fathom inspect (the memory plan's inputs)"
    mkdir -p /tmp/mgpu-v3
    cp "$configs/deepseek-v3.json" /tmp/mgpu-v3/config.json
    "$bin/fathom" inspect --model /tmp/mgpu-v3 --load-format dummy -tp 8 --enable-expert-parallel \
      >"$out/v3-inspect.txt" 2>&1
    v3="$v3 --max-model-len 4096"
    if fits 8; then
      # shellcheck disable=SC2086
      bench v3-decode $v3 --input-len 512 --output-len 64 --batch-size 1,64,256
      # shellcheck disable=SC2086
      bench v3-prefill512 $v3 --input-len 512 --output-len 1 --batch-size 1
    fi
    ;;
  *)
    echo "usage: $0 correct|dense|moe|llama70b|v3 BIN_DIR OUT_DIR" >&2
    exit 2
    ;;
esac
log "done"
