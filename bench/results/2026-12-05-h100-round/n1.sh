#!/usr/bin/env bash
# Next session, call 1 (binaries at build/carry10/commit): llama.cpp's build in the background while every op row and
# the CUDA tests run (FUSED_SILU is now the default; the one-stage f8 MLA kernel now widens through registers), then
# the f8 MLA A/B. /tmp/ok marks that the tests passed (n2.sh needs it).
#   run: bash build/carry10/n1.sh   with carry ["build/carry10"]
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/n && tar xJf build/carry10/new.tar.xz -C /tmp/n
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf build/carry10/quant.tar.xz -C /work/main/build/cuda-release/tests/data
( bash bench/peers/llama_cpp.sh build build/carry10/llama-src.tar.xz /tmp/peer > $R/peer-build.log 2>&1; log "peer build rc=$?" ) &
BP=$!
rm -f /tmp/ok
/tmp/n/backend_ops_test --gtest_filter='AllRows/*' > $R/ops_test.log 2>&1; rc1=$?; log "ops rows rc=$rc1"; pack
/tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $R/cuda_test.log 2>&1; rc2=$?; log "cuda tests rc=$rc2"; pack
[ $rc1 = 0 ] && [ $rc2 = 0 ] && touch /tmp/ok
wait $BP; log "peer build waited"; pack
/tmp/n/cuda_kernel_bench --ops 1 --filter "k=576" > $R/kb-mla.jsonl 2>/dev/null; log "mla kernel rows"; pack
V="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-v2-lite.json --max-model-len 4096"
run(){ local name=$1 envs=$2; shift 2; env $envs /tmp/n/fathom bench "$@" --output $R/$name.json > $R/$name.log 2>&1; log "$name rc=$?"; pack; }
run v-bf16kv FATHOM_CUDA_NOTHING=1 $V --batch-size 64,256 --input-len 1024 --output-len 128
run v-fp8kv FATHOM_CUDA_MLA_FP8=1 $V --batch-size 64,256 --input-len 1024 --output-len 128 --kv-cache-dtype fp8
log done; pack
