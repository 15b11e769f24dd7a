#!/usr/bin/env bash
# The wide MLA kernel (64 heads a block, FATHOM_CUDA_MLA_WIDE=1 / op variant mla_wide): every MLA op row, then the
# MLA kernel rows (k=576) in perf mode: mla_wide against the default at 128 heads, same call.
#   run: bash build/carry11/n4.sh   with carry ["build/carry11"]
set -u
T0=$(date +%s); R=$OUT/w; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/w.tgz -C $OUT w 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
mkdir -p /tmp/w && tar xJf build/carry11/wide.tar.xz -C /tmp/w
nvidia-smi -L > $R/gpu.txt 2>&1
/tmp/w/backend_ops_test --gtest_filter='AllRows/*Attention*' > $R/ops_attn.log 2>&1; log "attention rows rc=$?"; pack
grep -E "FAILED|PASSED" $R/ops_attn.log | tail -15 > $R/ops_summary.txt
/tmp/w/cuda_kernel_bench --ops 1 --filter "k=576" > $R/kb-mla.jsonl 2>$R/kb-mla.err; log "mla kernel rows rc=$?"; pack
log done; pack
