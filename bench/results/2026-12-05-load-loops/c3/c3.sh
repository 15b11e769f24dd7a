#!/usr/bin/env bash
# A fresh H200 after call 2 was taken back (5 device-minutes left, too few to build llama.cpp): the attention kernel
# rows of the new binaries against c522f10's, PyTorch's MLA decode, Qwen-7B 512 and V2-Lite batch 1, and FUSED_SILU
# against the default at 256 x 1k.
set -u
T0=$(date +%s); P=$OUT/perf; mkdir -p $P
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $P/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT perf 2>/dev/null; }
( sleep 150; log watchdog; pack ) &
nvidia-smi > $P/gpu.txt 2>&1
mkdir -p /tmp/n && tar xJf build/carry8/new.tar.xz -C /tmp/n ./fathom ./cuda_kernel_bench && tar xJf build/carry8/old_bench.tar.xz -C /tmp/n
log extracted
/tmp/n/cuda_kernel_bench_c522f10 --ops 1 --filter PagedAttention > $P/kb-old-1.jsonl 2>/dev/null
/tmp/n/cuda_kernel_bench --ops 1 --filter PagedAttention > $P/kb-new-1.jsonl 2>/dev/null
log "kernel rows old/new"; pack
python3 bench/peers/mla_torch.py > $P/mla_peer.jsonl 2> $P/mla_peer.log; log "torch mla rc=$?"; pack
Q="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json"
V="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-v2-lite.json --max-model-len 4096"
run(){ local name=$1 envs=$2; shift 2; env $envs /tmp/n/fathom bench "$@" --output $P/$name.json > $P/$name.log 2>&1; log "$name rc=$?"; pack; }
run qwen7b-512 FATHOM_CUDA_NOTHING=1 $Q --batch-size 1 --input-len 512 --output-len 128
run q256-fs0 FATHOM_CUDA_NOTHING=1 $Q --batch-size 256 --input-len 1024 --output-len 64
run q256-fs1 FATHOM_CUDA_FUSED_SILU=1 $Q --batch-size 256 --input-len 1024 --output-len 64
run v2lite-b1 FATHOM_CUDA_NOTHING=1 $V --batch-size 1 --input-len 512 --output-len 128
log done; pack
