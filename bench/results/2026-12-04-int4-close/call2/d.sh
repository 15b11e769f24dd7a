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
log tests
/tmp/t/backend_cuda_test --gtest_filter='CudaInt4Test.*:CudaDecodeGraphsTest.*' > $R/cuda_test.log 2>&1; log "tests rc=$?"
/tmp/t/backend_ops_test --gtest_filter='*Linear*' > $R/ops.log 2>&1; log "ops rc=$?"
/tmp/t/cuda_kernel_bench --int4 1 > $R/kbench.jsonl 2> $R/kbench.err; log "kbench rc=$?"
B="/tmp/t/fathom bench --offline --device cuda --load-format dummy"
C=tests/data/configs
$B --model $C/deepseek-r1-distill-qwen-7b-awq.json --max-model-len 1024 --input-len 512 --output-len 128 --batch-size 1 --output $R/qwen7b-awq-b1.json > $R/qwen7b-awq-b1.log 2>&1; log qwen-awq
$B --model $C/deepseek-r1-distill-qwen-7b.json --max-model-len 1024 --input-len 512 --output-len 128 --batch-size 1 --output $R/qwen7b-bf16-b1.json > $R/qwen7b-bf16-b1.log 2>&1; log qwen-bf16
$B --model $C/deepseek-r1-distill-llama-8b-gptq.json --max-model-len 1024 --input-len 512 --output-len 128 --batch-size 1 --output $R/llama8b-gptq-b1.json > $R/llama8b-gptq-b1.log 2>&1; log llama-gptq
$B --model $C/deepseek-v2-lite-awq.json --max-model-len 1024 --input-len 512 --output-len 64 --batch-size 1 --output $R/v2awq-b1.json > $R/v2awq-b1.log 2>&1; log v2awq
$B --model $C/deepseek-v2-lite.json --max-model-len 1024 --input-len 512 --output-len 64 --batch-size 1 --output $R/v2bf16-b1.json > $R/v2bf16-b1.log 2>&1; log v2bf16
$B --model $C/deepseek-v2-lite-awq.json --max-model-len 1024 --input-len 512 --output-len 64 --batch-size 64,256 --output $R/v2awq-batch.json > $R/v2awq-batch.log 2>&1; log v2awq-batch
wait $PEER
bash bench/peers/llama_cpp.sh run /tmp/peer build/carry/make_gguf.py r1-distill-llama-8b:q4_k_m deepseek-v2-lite:q4_k_m > $R/peer.jsonl 2> $R/peer-run.log; log peer-run
pack
