#!/usr/bin/env bash
# One device call: the CUDA tests (graph workspace shared by captured ops), structured output's cost with the masks
# computed during the forward pass, llama.cpp's llama-server with and without a JSON schema.
set -u
T0=$(date +%s); R=$OUT/r; mkdir -p $R
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $R/timeline.txt; }
pack(){ cp /tmp/peer/ninja.log $R/peer-ninja.log 2>/dev/null; tar czf $OUT/r.tgz -C $OUT r 2>/dev/null; }
( sleep 580; log watchdog; pack ) &
log start
nvidia-smi > $R/gpu.txt 2>&1
mkdir -p /tmp/t && tar xJf build/carry/cuda.tar.xz -C /tmp/t
mkdir -p /work/main && ln -sfn $PWD/tests /work/main/tests
mkdir -p /work/main/build/cuda-release/tests/data && tar xJf build/carry/quant.tar.xz -C /work/main/build/cuda-release/tests/data
( mkdir -p /tmp/peer/llama.cpp && tar xJf build/carry/llama-src.tar.xz -C /tmp/peer/llama.cpp &&
  cmake -S /tmp/peer/llama.cpp -B /tmp/peer/b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DCMAKE_BUILD_TYPE=Release > $R/peer-cmake.log 2>&1 && ninja -C /tmp/peer/b llama-server > /tmp/peer/ninja.log 2>&1; log "peer-built rc=$?" ) &
PEER=$!
/tmp/t/backend_cuda_test --gtest_filter='-CudaRealSizeTest.*' > $R/cuda_test.log 2>&1; log "cuda tests rc=$?"
python3 build/carry/make_gguf.py --preset r1-distill-llama-8b --dtype f16 -o /tmp/l8.gguf > $R/gguf.log 2>&1; log gguf
wait $PEER
ROUNDS=1 bash bench/grammar_gpu.sh /tmp/t/fathom $R/g llama8b v2lite > $R/grammar.log 2>&1; log "grammar rc=$?"
pack
timeout 100 python3 bench/peers/llama_server_grammar.py --server /tmp/peer/b/bin/llama-server --model /tmp/l8.gguf --schema bench/schemas/records64.json --n-predict 128 --concurrency 1,64 --requests 1 > $R/peer-grammar.jsonl 2> $R/peer-grammar.log; log "peer rc=$?"
pack
