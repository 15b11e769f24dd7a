#!/usr/bin/env bash
# The llama.cpp peer, measured in the same GPU-machine call as fathom (../shared/peers/README.md): builds llama.cpp
# from its trimmed source (a CPU-only step, which can overlap fathom's GPU runs), then writes random-weight GGUFs in
# the real shapes with make_gguf.py and runs llama-bench on each (after fathom's runs: the GPU is not shared).
# Prints llama-bench's and llama-batched-bench's JSON lines; llama.cpp's source and binaries never enter the
# repository.
#
#   bench/peers/llama_cpp.sh build SRC.tar.xz OUT_DIR
#   bench/peers/llama_cpp.sh run OUT_DIR MAKE_GGUF.py PRESET:DTYPE[:NPP] [PRESET:DTYPE[:NPP] ...]
#   e.g. ... run /tmp/peer make_gguf.py r1-distill-llama-8b:f16 deepseek-v2-lite:f16 qwen7b-shape:f16:512,1024
#
# PRESET is one of make_gguf.py's, or qwen7b-shape: DeepSeek-R1-Distill-Qwen-7B's dimensions (hidden 3584, 28 layers,
# 28/4 heads, FFN 18944, vocab 152064, rope theta 1e6) written as llama.cpp's "llama" architecture, which
# make_gguf.py writes; Qwen2's q/k/v biases (4,608 values a layer) are the only part left out. NPP is
# llama-batched-bench's prompt lengths (default 512).
#
# SRC.tar.xz holds llama.cpp's CMakeLists.txt cmake ggml src include common tools vendor licenses LICENSE app
# scripts/ui-assets.cmake (the node-llama-cpp 3.22.1 npm package's bundle, commit de3ff81). Each model, then its GGUF
# is deleted:
#   - llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o jsonl (pp512: a 512-token prefill; tg128: batch-1 decode);
#   - llama-batched-bench -ngl 99 -fa 1 -c CTX -b 4096 -ub 1024 -npp NPP -ntg 128 -npl $PEER_NPL
#     --output-format jsonl (PEER_NPL defaults to 1,16,64,256: that many sequences of NPP prompt and 128 generated
#     tokens each; speed_tg is their decode throughput, speed_pp their prefill's; CTX holds the largest). Its lines
#     get "model" and "tool" fields, so bench/summary.py can tell them apart.
set -euo pipefail
case "$1" in
  build)
    src=$2 out=$3
    mkdir -p "$out/llama.cpp"
    tar xJf "$src" -C "$out/llama.cpp"
    echo "peer: building llama.cpp (CUDA, sm_90)" >&2
    cmake -S "$out/llama.cpp" -B "$out/b" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1
    ninja -C "$out/b" llama-bench llama-batched-bench >"$out/ninja.log" 2>&1
    echo "peer: built llama-bench" >&2
    # llama-server (bench/peers/llama_server_grammar.py) embeds no web UI: nothing is downloaded at build time.
    if ninja -C "$out/b" llama-server >>"$out/ninja.log" 2>&1; then
      echo "peer: built llama-server" >&2
    else
      tail -20 "$out/ninja.log" >&2
      echo "peer: llama-server did not build" >&2
    fi
    ;;
  run)
    out=$2 gguf_tool=$3
    shift 3
    npl=${PEER_NPL:-1,16,64,256}
    for m in "$@"; do
      IFS=: read -r preset dtype npp <<<"$m"
      npp=${npp:-512}
      case "$preset" in
        qwen7b-shape)
          shape=(--preset r1-distill-llama-8b --hidden 3584 --layers 28 --heads 28 --kv-heads 4 --ffn 18944
            --vocab 152064 --ctx 131072 --rope-theta 1000000 --rms-eps 1e-6 --no-llama3-rope)
          ;;
        *) shape=(--preset "$preset") ;;
      esac
      # The context holds the largest batch: the most sequences of the longest prompt and 128 generated tokens.
      max_pl=$(tr , '\n' <<<"$npl" | sort -n | tail -1)
      max_pp=$(tr , '\n' <<<"$npp" | sort -n | tail -1)
      ctx=$((max_pl * (max_pp + 128)))
      ctx=$((ctx > 172032 ? ctx : 172032))
      f="$out/$preset-$dtype.gguf"
      echo "peer: writing $f" >&2
      python3 "$gguf_tool" "${shape[@]}" --dtype "$dtype" --name "$preset-$dtype" -o "$f" >&2
      echo "peer: llama-bench $preset $dtype" >&2
      "$out/b/bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o jsonl
      echo "peer: llama-batched-bench $preset $dtype (prompts $npp, contexts of $ctx)" >&2
      "$out/b/bin/llama-batched-bench" -m "$f" -ngl 99 -fa 1 -c "$ctx" -b 4096 -ub 1024 -npp "$npp" -ntg 128 \
        -npl "$npl" --output-format jsonl 2>"$out/batched-$preset-$dtype.log" |
        sed -n "s/^{/{\"tool\": \"llama-batched-bench\", \"model\": \"$preset-$dtype\", /p"
      rm -f "$f"
    done
    ;;
  *)
    echo "usage: $0 build SRC.tar.xz OUT_DIR | run OUT_DIR MAKE_GGUF.py PRESET:DTYPE..." >&2
    exit 2
    ;;
esac
