#!/usr/bin/env bash
# One device call of the performance round: fathom's headline benchmarks and the llama.cpp peer on the same GPU, in
# the same lease. bench/summary.py then turns the raw outputs into the card's bench/baselines/CARD.json figures, each
# with its same-call peer ratio, and the round's OUT_DIRs are packed into bench/results/ROUND.tar.xz
# (bench/results/README.md). Nothing is compared against an old peer number.
#
#   bench/perf_round.sh PART BIN_DIR LLAMA_SRC.tar.xz MAKE_GGUF.py OUT_DIR      (on the GPU machine, repository root)
#     PART dense:   Qwen-7B and Llama-8B (bf16 and FP8 KV caches), peers r1-distill-llama-8b f16 and qwen7b-shape
#                   f16 (bench/peers/llama_cpp.sh; prompts of 512 and 1024 for the latter, as fathom's runs have)
#     PART moe:     DeepSeek-V2-Lite, peer deepseek-v2-lite f16
#     PART kernels: the MLA decode kernel and the 256-sequence attention rows of the op table (cuda_kernel_bench --ops);
#                   peer: PyTorch on the same MLA decode (bench/peers/mla_torch.py)
#     PART online: `fathom bench` against `fathom serve --device cuda` at concurrency 1, 16, 64 and 256 (512 tokens
#                  in, 256 out) for Qwen-7B and V2-Lite (ONLINE_MODELS=NAME:CONFIG ... picks), beside the offline
#                  batch-1 run of the same lengths
#   bench/summary.py --raw OUT_DIR ... (back on the development machine; see its usage)
#
# BIN_DIR holds fathom and cuda_kernel_bench (built here with `cmake --preset cuda-release`). Each part fits the
# device tool's 10-minute call.
#
# Order within a call:
#   1. llama.cpp is built (bench/peers/llama_cpp.sh) into /tmp/peer, unless an earlier call on the same warm machine
#      built it. The build comes first: run beside fathom's benchmarks, its 16 compiler processes slowed fathom's
#      batch-1 decode by a third (Llama-8B: 142.5 tok/s against 208 alone), since the engine thread launches every
#      step's kernels from the CPU.
#   2. fathom's benchmarks.
#   3. The peer's llama-bench and llama-batched-bench, after fathom's, so the two never share the GPU.
#
# Every step appends to OUT_DIR/timeline.txt, and every run writes its own file, so a call cut short keeps what it
# finished.
set -uo pipefail

part=$1 bin=$2 llama_src=$3 gguf_tool=$4 out=$5
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
t0=$(date +%s)
log() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$out/timeline.txt" >&2; }
nvidia-smi >"$out/gpu.txt" 2>&1
echo "$part" >"$out/part.txt"

configs=tests/data/configs
# fathom bench runs: NAME|ARGS. The file NAME.json is what bench/summary.py reads.
runs=()
peer_models=()
case "$part" in
  dense)
    qwen="--model $configs/deepseek-r1-distill-qwen-7b.json"
    llama="--model $configs/deepseek-r1-distill-llama-8b.json"
    runs+=("qwen7b-512|$qwen --batch-size 1 --input-len 512 --output-len 128")
    runs+=("qwen7b-1k|$qwen --batch-size 64,256 --input-len 1024 --output-len 128")
    runs+=("qwen7b-1k-fp8kv|$qwen --batch-size 64,256 --input-len 1024 --output-len 128 --kv-cache-dtype fp8")
    runs+=("qwen7b-prefill8k|$qwen --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192")
    runs+=("llama8b-512|$llama --batch-size 1,64,256 --input-len 512 --output-len 128")
    peer_models+=(r1-distill-llama-8b:f16 qwen7b-shape:f16:512,1024)
    ;;
  moe)
    v2="--model $configs/deepseek-v2-lite.json --max-model-len 4096"
    runs+=("v2lite-512|$v2 --batch-size 1,64,256 --input-len 512 --output-len 128")
    runs+=("v2lite-prefill8k|$v2 --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192")
    peer_models+=(deepseek-v2-lite:f16)
    ;;
  kernels | online) ;;
  *)
    echo "usage: $0 dense|moe|kernels|online BIN_DIR LLAMA_SRC.tar.xz MAKE_GGUF.py OUT_DIR" >&2
    exit 2
    ;;
esac

peer_ok=0
if [ ${#peer_models[@]} -gt 0 ]; then
  if [ -x /tmp/peer/b/bin/llama-batched-bench ]; then
    log "peer: llama.cpp already built in /tmp/peer"
    peer_ok=1
  else
    log "peer: building llama.cpp (before fathom's runs, so that the compilers do not share the CPUs with them)"
    "$here/peers/llama_cpp.sh" build "$llama_src" /tmp/peer >"$out/peer-build.log" 2>&1 && peer_ok=1
    log "peer build: ok=$peer_ok"
  fi
fi

for r in "${runs[@]}"; do
  name=${r%%|*} args=${r#*|}
  log "fathom bench $name: $args"
  # shellcheck disable=SC2086  # args is a list of words
  "$bin/fathom" bench --offline --device cuda --load-format dummy $args --output "$out/$name.json" \
    >"$out/$name.log" 2>&1
  log "fathom bench $name: rc=$?"
  echo "fathom bench --offline --device cuda --load-format dummy $args" >"$out/$name.command"
done

if [ "$part" = online ]; then
  # The served model is a config folder with dummy weights; Qwen's tokenizer (tests/data/tokenizers/qwen3) for both:
  # prompts go as token ids, so only the outputs' detokenization uses it.
  tok=/tmp/perf-tokenizer
  mkdir -p "$tok"
  zcat tests/data/tokenizers/qwen3/tokenizer.json.gz >"$tok/tokenizer.json"
  cp tests/data/tokenizers/qwen3/tokenizer_config.json "$tok/"
  for m in ${ONLINE_MODELS:-qwen7b:deepseek-r1-distill-qwen-7b v2lite:deepseek-v2-lite}; do
    name=${m%%:*} cfg=${m#*:}
    dir=/tmp/perf-$name
    mkdir -p "$dir"
    cp "$configs/$cfg.json" "$dir/config.json"
    offline="--model $configs/$cfg.json --max-model-len 4096 --batch-size 1 --input-len 512 --output-len 256"
    log "fathom bench $name-offline-b1-256: $offline"
    # shellcheck disable=SC2086
    "$bin/fathom" bench --offline --device cuda --load-format dummy $offline --output "$out/$name-offline-b1-256.json" \
      >"$out/$name-offline-b1-256.log" 2>&1
    echo "fathom bench --offline --device cuda --load-format dummy $offline" >"$out/$name-offline-b1-256.command"
    log "fathom serve $name"
    "$bin/fathom" serve --device cuda --model "$dir" --load-format dummy --tokenizer "$tok" --max-model-len 4096 \
      --port 8000 >"$out/$name-serve.log" 2>&1 &
    serve_pid=$!
    for _ in $(seq 1 180); do
      python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null && break
      sleep 1
    done
    log "fathom serve $name: up (or gave up)"
    # Each level's prompts from a seed of its own: with one seed, a level's prompts repeat the level before's, which
    # the server's prefix cache then serves (the 2026-12-05 rounds: 331 of 584 requests found 496 tokens cached).
    for level in 1:8 16:64 64:256 256:256; do
      c=${level%%:*} n=${level#*:}
      args="--input-len 512 --output-len 256 --ignore-eos --prompt-format ids --concurrency $c --num-requests $n"
      args+=" --seed $((1000 + c))"
      # shellcheck disable=SC2086
      "$bin/fathom" bench $args --output "$out/$name-online-c$c.json" >"$out/$name-online-c$c.log" 2>&1
      log "fathom bench online $name c$c: rc=$?"
      echo "fathom serve --device cuda --model <$cfg.json folder> --load-format dummy --tokenizer <qwen3> --max-model-len 4096; fathom bench $args" \
        >"$out/$name-online-c$c.command"
    done
    kill "$serve_pid"
    wait "$serve_pid"
    log "fathom serve $name: stopped, rc=$?"
  done
fi

if [ "$part" = kernels ]; then
  log "cuda_kernel_bench --ops 1 --filter PagedAttention"
  "$bin/cuda_kernel_bench" --ops 1 --filter PagedAttention >"$out/kernels.jsonl" 2>"$out/kernels.log"
  log "cuda_kernel_bench: rc=$?"
  echo "cuda_kernel_bench --ops 1 --filter PagedAttention" >"$out/kernels.command"
  log "peer: PyTorch MLA decode (bench/peers/mla_torch.py)"
  python3 "$here/peers/mla_torch.py" >"$out/mla_peer.jsonl" 2>"$out/mla_peer.log"
  log "peer: PyTorch MLA decode rc=$?"
fi

if [ "$peer_ok" = 1 ]; then
  log "peer runs: ${peer_models[*]}"
  "$here/peers/llama_cpp.sh" run /tmp/peer "$gguf_tool" "${peer_models[@]}" >"$out/peer.jsonl" 2>"$out/peer.log"
  log "peer runs: rc=$?"
fi
log done
