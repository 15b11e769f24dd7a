#!/usr/bin/env bash
# Next session, call 1 (binaries at build/carry6/commit): correctness of everything written without a GPU, then the
# prefill kernel's A/B, ncu on the decode attention kernels, and the kernel bench.
#   run: bash build/carry6/a.sh   with carry ["build/carry6"]
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/n && tar xJf build/carry6/new.tar.xz -C /tmp/n
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf build/carry6/quant.tar.xz -C /work/main/build/cuda-release/tests/data
# 1. The op table (the prefill_mma_attention rows are new, MlaContextMmaKernel was refactored onto flash_tile.cuh,
#    and every >48 KiB kernel now raises its limit through EnsureDynamicSmem).
/tmp/n/backend_ops_test --gtest_filter='AllRows/*' > $R/ops_test.log 2>&1; log "ops tests rc=$?"; pack
/tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $R/cuda_test.log 2>&1; log "cuda tests rc=$?"; pack
FATHOM_CUDA_PREFILL_MMA_ATTENTION=1 FATHOM_CUDA_MLA_FP8=1 FATHOM_CUDA_MLA_PIPELINE=1 FATHOM_CUDA_FUSED_SILU=1 FATHOM_CUDA_GEMV_PREFETCH_BYTES=2048 \
  FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES=1 /tmp/n/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' \
  > $R/cuda_test_on.log 2>&1; log "cuda tests (all experiments on) rc=$?"; pack
/tmp/n/comm_nccl_test > $R/nccl_test.log 2>&1; log "nccl test rc=$?"; pack
# 2. Prefill: the flash kernel against the decode kernel (and the one-chunk rule), TTFT and 16 x 512.
Q="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json"
run(){ local name=$1 envs=$2; shift 2; env $envs /tmp/n/fathom bench "$@" --output $R/$name.json > $R/$name.log 2>&1; log "$name rc=$?"; }
for i in 1 2; do
  for pm in 0 1; do
    run qt-pm$pm-$i "FATHOM_CUDA_PREFILL_MMA_ATTENTION=$pm" $Q --batch-size 1 --input-len 512 --output-len 2
    run qp-pm$pm-$i "FATHOM_CUDA_PREFILL_MMA_ATTENTION=$pm" $Q --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192
  done
  pack
done
run qp-pm1-fs1 "FATHOM_CUDA_PREFILL_MMA_ATTENTION=1 FATHOM_CUDA_FUSED_SILU=1" $Q --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192
run qt-oc1 "FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES=1" $Q --batch-size 1 --input-len 512 --output-len 2
pack
# 3. Kernels: every attention row twice (the prefill variant's rows beside the default's), ncu on the decode kernels.
for i in 1 2; do /tmp/n/cuda_kernel_bench --ops 1 --filter PagedAttention > $R/kb-attn-$i.txt 2>&1; done; log "kernel bench"; pack
(which ncu; ncu --version) > $R/ncu-version.txt 2>&1
timeout 100 ncu --clock-control none -k regex:MmaAttention -c 2 --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section Occupancy --section SpeedOfLight /tmp/n/cuda_kernel_bench --ops 1 --filter "256x(1023+1)" > $R/ncu-attn.txt 2>&1
log "ncu attention rc=$?"; pack
for h in 16 128; do
  timeout 90 ncu --clock-control none -k regex:MlaAttention -c 2 --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section Occupancy --section SpeedOfLight /tmp/n/cuda_kernel_bench --ops 1 --filter "heads=$h/1 k=576 v=512 (V in K) batch=decode[64x(4095+1)]" \
    > $R/ncu-mla-$h.txt 2>&1
  log "ncu mla $h rc=$?"; pack
done
log done; pack
