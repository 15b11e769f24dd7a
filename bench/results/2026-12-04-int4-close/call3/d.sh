#!/usr/bin/env bash
# One device call: the INT4 commit's GPU tests, kernel table, benches, llama.cpp peer.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 565; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/t && tar xJf build/carry/cuda.tar.xz -C /tmp/t
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf build/carry/quant.tar.xz -C /work/main/build/cuda-release/tests/data
( bash bench/peers/llama_cpp.sh build build/carry/llama-src.tar.xz /tmp/peer > $R/peer-build.log 2>&1; log peer-built ) &
PEER=$!
B="/tmp/t/fathom bench --offline --device cuda --load-format dummy"
C=tests/data/configs
for i in 1 2; do
$B --model $C/deepseek-r1-distill-qwen-7b-awq.json --max-model-len 1024 --input-len 512 --output-len 128 --batch-size 1 --output $R/qwen7b-awq-b1-$i.json > $R/qwen7b-awq-b1-$i.log 2>&1; log qwen-awq-$i
$B --model $C/deepseek-r1-distill-qwen-7b.json --max-model-len 1024 --input-len 512 --output-len 128 --batch-size 1 --output $R/qwen7b-bf16-b1-$i.json > $R/qwen7b-bf16-b1-$i.log 2>&1; log qwen-bf16-$i
$B --model $C/deepseek-r1-distill-llama-8b-gptq.json --max-model-len 1024 --input-len 512 --output-len 128 --batch-size 1 --output $R/llama8b-gptq-b1-$i.json > $R/llama8b-gptq-b1-$i.log 2>&1; log llama-gptq-$i
$B --model $C/deepseek-v2-lite-awq.json --max-model-len 1024 --input-len 512 --output-len 64 --batch-size 1 --output $R/v2awq-b1-$i.json > $R/v2awq-b1-$i.log 2>&1; log v2awq-$i
$B --model $C/deepseek-v2-lite.json --max-model-len 1024 --input-len 512 --output-len 64 --batch-size 1 --output $R/v2bf16-b1-$i.json > $R/v2bf16-b1-$i.log 2>&1; log v2bf16-$i
done
/tmp/t/cuda_kernel_bench --int4 1 > $R/kbench.jsonl 2> $R/kbench.err; log "kbench rc=$?"
wait $PEER
bash bench/peers/llama_cpp.sh run /tmp/peer build/carry/make_gguf.py r1-distill-llama-8b:q4_k_m deepseek-v2-lite:q4_k_m > $R/peer.jsonl 2> $R/peer-run.log; log peer-run
pack
