#!/usr/bin/env bash
# Call 1: correctness of the attention pipeline and of programmatic dependent launch (op rows, CUDA tests), the
# attention kernel before (836042f) and after, then decode speeds: PDL on/off and the old binary, alternated.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 575; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/n /tmp/o && tar xJf build/carry3/new.tar.xz -C /tmp/n && tar xJf build/carry3/mma.tar.xz -C /tmp/o
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf build/carry3/quant.tar.xz -C /work/main/build/cuda-release/tests/data
/tmp/n/backend_ops_test --gtest_filter='AllRows/*' > $R/ops_test.log 2>&1; log "ops tests rc=$?"; pack
for i in 1 2; do
  /tmp/o/cuda_kernel_bench --ops 1 --filter PagedAttention > $R/kb-old-$i.txt 2>&1; log "kb old $i rc=$?"
  /tmp/n/cuda_kernel_bench --ops 1 --filter PagedAttention > $R/kb-new-$i.txt 2>&1; log "kb new $i rc=$?"
done
pack
/tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $R/cuda_test.log 2>&1; log "cuda tests rc=$?"; pack
Q="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json"
V="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-v2-lite.json --max-model-len 4096"
for i in 1 2; do
  /tmp/n/fathom bench $Q --batch-size 1 --input-len 512 --output-len 128 --output $R/q1-pdl-$i.json > $R/q1-pdl-$i.log 2>&1; log "q1 pdl $i rc=$?"
  FATHOM_CUDA_NO_PDL=1 /tmp/n/fathom bench $Q --batch-size 1 --input-len 512 --output-len 128 --output $R/q1-nopdl-$i.json > $R/q1-nopdl-$i.log 2>&1; log "q1 nopdl $i rc=$?"
  /tmp/o/fathom bench $Q --batch-size 1 --input-len 512 --output-len 128 --output $R/q1-old-$i.json > $R/q1-old-$i.log 2>&1; log "q1 old $i rc=$?"
  /tmp/n/fathom bench $V --batch-size 1 --input-len 512 --output-len 128 --output $R/v1-pdl-$i.json > $R/v1-pdl-$i.log 2>&1; log "v1 pdl $i rc=$?"
  FATHOM_CUDA_NO_PDL=1 /tmp/n/fathom bench $V --batch-size 1 --input-len 512 --output-len 128 --output $R/v1-nopdl-$i.json > $R/v1-nopdl-$i.log 2>&1; log "v1 nopdl $i rc=$?"
  /tmp/o/fathom bench $V --batch-size 1 --input-len 512 --output-len 128 --output $R/v1-old-$i.json > $R/v1-old-$i.log 2>&1; log "v1 old $i rc=$?"
  pack
done
for b in n o; do
  /tmp/$b/fathom bench $Q --batch-size 64,256 --input-len 1024 --output-len 128 --output $R/q1k-$b.json > $R/q1k-$b.log 2>&1; log "q1k $b rc=$?"
  /tmp/$b/fathom bench $Q --batch-size 256 --input-len 1024 --output-len 128 --kv-cache-dtype fp8 --output $R/q1k-fp8-$b.json > $R/q1k-fp8-$b.log 2>&1; log "q1k fp8 $b rc=$?"
  pack
done
log done; pack
