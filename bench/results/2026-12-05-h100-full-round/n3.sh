#!/usr/bin/env bash
# Call 3: the online part (fathom serve + fathom bench at concurrency 1/16/64/256, beside offline batch 1).
set -u
C=build/carry14
T0=$(date +%s); P=$OUT/online; mkdir -p $P
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $P/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT online 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
[ -x /tmp/n/fathom ] || { mkdir -p /tmp/n && tar xJf $C/new.tar.xz -C /tmp/n; }
bash bench/perf_round.sh online /tmp/n $C/llama-src.tar.xz $C/make_gguf.py $P/online > $P/online.log 2>&1
log "online rc=$?"; pack
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf $C/quant.tar.xz -C /work/main/build/cuda-release/tests/data
FATHOM_CUDA_MLA_FP8=1 /tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $P/cuda_test_mla_fp8.log 2>&1; log "cuda tests MLA_FP8 rc=$?"
grep -E "FAILED|PASSED" $P/cuda_test_mla_fp8.log | tail -20 > $P/cuda_fp8_summary.txt; log done; pack
