#!/usr/bin/env bash
# Next session, call 2 (same binaries, same warm machine): decode A/Bs of the experiments, runs alternated.
#   run: bash build/carry6/b.sh   with carry ["build/carry6"]
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
log start
[ -x /tmp/n/fathom ] || { mkdir -p /tmp/n && tar xJf build/carry6/new.tar.xz -C /tmp/n; }
Q="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-r1-distill-qwen-7b.json"
V="--offline --device cuda --load-format dummy --model tests/data/configs/deepseek-v2-lite.json --max-model-len 4096"
run(){ local name=$1 envs=$2; shift 2; env $envs /tmp/n/fathom bench "$@" --output $R/$name.json > $R/$name.log 2>&1; log "$name rc=$?"; }
for i in 1 2; do
  for pf in 0 2048; do run q1-pf$pf-$i "FATHOM_CUDA_GEMV_PREFETCH_BYTES=$pf" $Q --batch-size 1 --input-len 512 --output-len 128; done
  for pf in 0 2048; do run v1-pf$pf-$i "FATHOM_CUDA_GEMV_PREFETCH_BYTES=$pf" $V --batch-size 1 --input-len 512 --output-len 128; done
  pack
done
for oc in 0 1; do
  run q1k-oc$oc "FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES=$oc" $Q --batch-size 64,256 --input-len 1024 --output-len 128
  run q1k-fp8-oc$oc "FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES=$oc" $Q --batch-size 256 --input-len 1024 --output-len 128 --kv-cache-dtype fp8
  pack
done
# MLA's two-stage kernel, and MLA on an FP8 latent cache (FATHOM_CUDA_MLA_FP8=1) against bf16: V2-Lite at 64 and 256.
run v-pipe "FATHOM_CUDA_MLA_PIPELINE=1" $V --batch-size 64,256 --input-len 1024 --output-len 128
run v-bf16kv "FATHOM_CUDA_NOTHING=1" $V --batch-size 64,256 --input-len 1024 --output-len 128
run v-fp8kv "FATHOM_CUDA_MLA_FP8=1" $V --batch-size 64,256 --input-len 1024 --output-len 128 --kv-cache-dtype fp8
pack
for hm in 0 1; do
  if [ $hm = 1 ]; then e="FATHOM_CUDA_HOST_MOE=1"; else e="FATHOM_CUDA_NOTHING=1"; fi
  run vp-hm$hm "$e" $V --batch-size 16 --input-len 512 --output-len 2 --max-num-batched-tokens 8192
done
log done; pack
