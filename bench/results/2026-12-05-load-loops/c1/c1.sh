#!/usr/bin/env bash
# Call 1 (binaries at build/carry7/commit): llama.cpp's build in the background while the attention op rows and the
# CUDA tests run (the prefill kernel is now the default; MLA decode and prefill load loops rewritten), then the A/Bs on
# an idle CPU. /tmp/ok marks that the tests passed (c2.sh needs it).
#   run: bash build/carry7/c1.sh   with carry ["build/carry7"]
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/n && tar xJf build/carry7/new.tar.xz -C /tmp/n
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf build/carry7/quant.tar.xz -C /work/main/build/cuda-release/tests/data
( bash bench/peers/llama_cpp.sh build build/carry7/llama-src.tar.xz /tmp/peer > $R/peer-build.log 2>&1; log "peer build rc=$?" ) &
BP=$!
rm -f /tmp/ok
/tmp/n/backend_ops_test --gtest_filter='AllRows/*Attention*' > $R/ops_attn.log 2>&1; rc1=$?; log "ops attention rows rc=$rc1"; pack
/tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $R/cuda_test.log 2>&1; rc2=$?; log "cuda tests rc=$rc2"; pack
[ $rc1 = 0 ] && [ $rc2 = 0 ] && touch /tmp/ok
wait $BP; log "peer build waited"; pack
Q="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json"
L="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-llama-8b.json"
run(){ local name=$1 envs=$2; shift 2; env $envs /tmp/n/fathom bench "$@" --output $R/$name.json > $R/$name.log 2>&1; log "$name rc=$?"; }
for i in 1 2; do
  for pm in 0 1; do
    run qt-pm$pm-$i "FATHOM_CUDA_PREFILL_MMA_ATTENTION=$pm" $Q --batch-size 1 --input-len 512 --output-len 2
    run qp-pm$pm-$i "FATHOM_CUDA_PREFILL_MMA_ATTENTION=$pm" $Q --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192
  done
done
run qp-fs1 "FATHOM_CUDA_FUSED_SILU=1" $Q --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192
log done; pack
