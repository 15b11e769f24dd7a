#!/usr/bin/env bash
# Call 3: the performance round's MoE and kernels parts on the warm machine (llama.cpp reused from /tmp/peer).
set -u
mkdir -p /tmp/n && tar xJf build/carry4/new.tar.xz -C /tmp/n
( sleep 580; tar czf $OUT/m.tgz -C $OUT moe kernels 2>/dev/null ) &
bash bench/perf_round.sh kernels /tmp/n build/carry4/llama-src.tar.xz build/carry4/make_gguf.py $OUT/kernels
bash bench/perf_round.sh moe /tmp/n build/carry4/llama-src.tar.xz build/carry4/make_gguf.py $OUT/moe
tar czf $OUT/m.tgz -C $OUT moe kernels
