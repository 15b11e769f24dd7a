#!/usr/bin/env bash
# Commit f906724 (wide MLA instance the default at 128 heads; the bench's token budget halved to fit): the attention
# op rows, the MLA kernel rows, Qwen-7B 64/256 x 1k (needs the halved budget on an 80 GB card), V2-Lite bf16 vs f8 KV.
set -u
T0=$(date +%s); R=$OUT/c; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/c.tgz -C $OUT c 2>/dev/null; }
( sleep 300; log watchdog; pack ) &
mkdir -p /tmp/c && tar xJf build/carry12/b.tar.xz -C /tmp/c
nvidia-smi -L > $R/gpu.txt 2>&1
/tmp/c/backend_ops_test --gtest_filter='AllRows/*Attention*' > $R/ops_attn.log 2>&1; log "attention rows rc=$?"
grep -E "FAILED|PASSED" $R/ops_attn.log | tail -15 > $R/ops_summary.txt; pack
/tmp/c/cuda_kernel_bench --ops 1 --filter "k=576" > $R/kb-mla.jsonl 2>$R/kb-mla.err; log "mla rows rc=$?"; pack
run(){ local name=$1 envs=$2; shift 2; env $envs /tmp/c/fathom bench "$@" --output $R/$name.json > $R/$name.log 2>&1; log "$name rc=$?"; pack; }
run q1k FATHOM_NOTHING=1 --offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json --batch-size 64,256 --input-len 1024 --output-len 128
V="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-v2-lite.json --max-model-len 4096 --batch-size 64,256 --input-len 1024 --output-len 128"
run v-bf16kv FATHOM_NOTHING=1 $V
run v-fp8kv FATHOM_CUDA_MLA_FP8=1 $V --kv-cache-dtype fp8
log done; pack
