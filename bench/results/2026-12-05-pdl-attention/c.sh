#!/usr/bin/env bash
# Call 2: the performance round's dense part (llama.cpp built first, then fathom, then the peer), new binaries.
set -u
mkdir -p /tmp/n && tar xJf build/carry4/new.tar.xz -C /tmp/n
( sleep 580; tar czf $OUT/d.tgz -C $OUT dense 2>/dev/null ) &
bash bench/perf_round.sh dense /tmp/n build/carry4/llama-src.tar.xz build/carry4/make_gguf.py $OUT/dense
tar czf $OUT/d.tgz -C $OUT dense
