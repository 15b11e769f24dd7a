#!/usr/bin/env bash
# Long libFuzzer runs of the fuzz targets (tests/fuzz), one after another, each on every core (libFuzzer's fork
# mode), each from its corpus in tests/data/fuzz/. Prints one JSON line per target (executions, seconds, corpus
# size, coverage, crashes) and leaves the grown corpora and any crashing inputs in OUT.
#
#   cmake --preset fuzz-fast && cmake --build --preset fuzz-fast --target fuzz_all
#   scripts/fuzz_long.sh build/fuzz-fast/tests/fuzz /tmp/fuzz-out json_routes:600 http:1200
#   # then replay each grown corpus under ASan + UBSan (the fuzz preset):
#   build/fuzz/tests/fuzz/fuzz_http -runs=0 /tmp/fuzz-out/http/corpus
# FATHOM_FUZZ_FLAGS adds libFuzzer flags to every run (e.g. -max_len=16384: the tokenizer target's real
# tokenizer.json seeds are up to 49 KB, and at that length parsing them, not mutating, is most of the time).
set -uo pipefail
bin="$1"
out="$2"
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
workers="${FATHOM_FUZZ_WORKERS:-$(nproc)}"
export FATHOM_FUZZ_TOKENIZER_DIR="${FATHOM_FUZZ_TOKENIZER_DIR:-$root/tests/data/fuzz/http-tokenizer}"
mkdir -p "$out"
for spec in "$@"; do
  target="${spec%%:*}"
  seconds="${spec##*:}"
  dir="$out/$target"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -rn "$root/tests/data/fuzz/$target"/. "$dir/corpus/" 2>/dev/null  # what an earlier run kept stays
  echo "fuzz_$target: $seconds s on $workers workers" >&2
  start=$SECONDS
  "$bin/fuzz_$target" -fork="$workers" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 ${FATHOM_FUZZ_FLAGS:-} \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log.txt" 2>&1
  rc=$?
  took=$((SECONDS - start))
  # The fork-mode parent's last status line: "#EXECS: cov: C ft: F corp: N exec/s: R oom/timeout/crash: a/b/c ..."
  last="$(grep -E '^#[0-9]+' "$dir/log.txt" | tail -n 1)"
  execs="$(sed -E 's/^#([0-9]+).*/\1/' <<<"$last")"
  cov="$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")"
  problems="$(sed -nE 's#.*oom/timeout/crash: ([0-9]+/[0-9]+/[0-9]+).*#\1#p' <<<"$last")"
  artifacts="$(find "$dir/artifacts" -type f | wc -l)"
  corpus="$(find "$dir/corpus" -type f | wc -l)"
  printf '{"target": "%s", "seconds": %d, "workers": %d, "executions": %s, "coverage": %s, "oom_timeout_crash": "%s", "artifacts": %d, "corpus_files": %d, "rc": %d}\n' \
    "$target" "$took" "$workers" "${execs:-0}" "${cov:-0}" "${problems:-?}" "$artifacts" "$corpus" "$rc"
  tail -n 3 "$dir/log.txt" >&2
done
