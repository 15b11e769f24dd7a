#!/usr/bin/env bash
# Call 1: llama.cpp's build in the background while the attention op rows (and the op-table and variant tests), the
# CUDA tests, and the CUDA tests with FATHOM_CUDA_MLA_FP8=1 run; then the MLA kernel rows, old (77025eb) against new,
# alternated. /tmp/ok marks that the tests passed.
set -u
C=build/carry14
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 580; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/n /tmp/o && tar xJf $C/new.tar.xz -C /tmp/n && xz -dc $C/old-kb.xz > /tmp/o/cuda_kernel_bench && chmod +x /tmp/o/cuda_kernel_bench
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf $C/quant.tar.xz -C /work/main/build/cuda-release/tests/data
( bash bench/peers/llama_cpp.sh build $C/llama-src.tar.xz /tmp/peer > $R/peer-build.log 2>&1; log "peer build rc=$?" ) &
BP=$!
rm -f /tmp/ok
/tmp/n/backend_ops_test --gtest_filter='AllRows/*Attention*:OpTableTest.*:CudaVariantsTest.*' > $R/ops_test.log 2>&1; rc1=$?; log "ops rows rc=$rc1"
grep -E "FAILED|PASSED" $R/ops_test.log | tail -20 > $R/ops_summary.txt; pack
/tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $R/cuda_test.log 2>&1; rc2=$?; log "cuda tests rc=$rc2"
grep -E "FAILED|PASSED" $R/cuda_test.log | tail -20 > $R/cuda_summary.txt; pack
[ $rc1 = 0 ] && [ $rc2 = 0 ] && touch /tmp/ok
for i in 1 2; do
  /tmp/o/cuda_kernel_bench --ops 1 --filter "k=576" > $R/kb-mla-old-$i.jsonl 2>/dev/null; log "mla rows old $i"
  /tmp/n/cuda_kernel_bench --ops 1 --filter "k=576" > $R/kb-mla-new-$i.jsonl 2>/dev/null; log "mla rows new $i"
done
pack
wait $BP; log "peer build waited"; log done; pack
