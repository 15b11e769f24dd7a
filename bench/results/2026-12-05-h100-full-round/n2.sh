#!/usr/bin/env bash
# Call 2 (same warm machine after n1.sh, or a fresh one, which builds llama.cpp first): the performance round's parts
# kernels, dense and moe, each with its same-call peer (llama.cpp; PyTorch for MLA).
set -u
C=build/carry14
T0=$(date +%s); P=$OUT/perf; mkdir -p $P
log(){ echo "[$(( $(date +%s)-T0 ))s] $1" >> $P/timeline.txt; }
pack(){ tar czf $OUT/r.tgz -C $OUT perf 2>/dev/null; }
( sleep 585; log watchdog; pack ) &
[ -f /tmp/ok ] || [ ! -d /tmp/n ] || { log "no /tmp/ok: n1's tests did not pass on this machine; nothing run"; pack; exit 1; }
[ -f /tmp/ok ] || log "fresh machine: n1 ran on another one"
[ -x /tmp/n/fathom ] || { mkdir -p /tmp/n && tar xJf $C/new.tar.xz -C /tmp/n; }
for part in ${PARTS:-kernels dense moe}; do
  bash bench/perf_round.sh $part /tmp/n $C/llama-src.tar.xz $C/make_gguf.py $P/$part > $P/$part.log 2>&1
  log "$part rc=$?"; pack
done
log done; pack
