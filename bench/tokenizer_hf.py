#!/usr/bin/env python3
"""Hugging Face `tokenizers` baseline for bench/tokenizer_bench.cc, on exactly the same inputs.

Measures, single-threaded, with the DeepSeek-V3 tokenizer:
  - encode throughput (MB/s) of bench/data/{english,code,chinese}.txt, add_special_tokens=False
  - load time of tokenizer.json

Usage (needs `pip install tokenizers`, v0.23 for the reference numbers):
  python3 bench/tokenizer_hf.py [--tokenizer PATH/tokenizer.json] [--min-time 2.0] [--json OUT.json]
Without --tokenizer it reads tests/data/tokenizers/deepseek-v3/tokenizer.json.gz (decompressed to a temp file).
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time

# Single thread: tokenizers only parallelizes batches, but make sure rayon stays out of the way.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["english", "code", "chinese"]  # the same order and files as tokenizer_bench.cc


def tokenizer_path(arg):
    if arg:
        return arg
    gz = os.path.join(ROOT, "tests/data/tokenizers/deepseek-v3/tokenizer.json.gz")
    out = os.path.join(tempfile.mkdtemp(prefix="fathom_hf_bench_"), "tokenizer.json")
    with gzip.open(gz, "rb") as src, open(out, "wb") as dst:
        dst.write(src.read())
    return out


def bench_encode(tok, text, min_time):
    tok.encode(text, add_special_tokens=False)  # warm the word cache, as Google Benchmark's warm-up does
    rates = []
    for _ in range(5):
        n = 0
        start = time.perf_counter()
        while True:
            tok.encode(text, add_special_tokens=False)
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time / 5:
                break
        rates.append(len(text.encode("utf-8")) * n / elapsed / 1e6)
    return statistics.median(rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", help="path to the DeepSeek-V3 tokenizer.json")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per text")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()

    path = tokenizer_path(args.tokenizer)
    loads = []
    for _ in range(5):
        start = time.perf_counter()
        tok = tokenizers.Tokenizer.from_file(path)
        loads.append((time.perf_counter() - start) * 1e3)

    results = {"tokenizers_version": tokenizers.__version__, "load_ms": statistics.median(loads), "encode_mb_s": {}}
    print(f"tokenizers {tokenizers.__version__}")
    print(f"load DeepSeek-V3 tokenizer.json: {results['load_ms']:.1f} ms (median of 5)")
    for name in TEXTS:
        with open(os.path.join(ROOT, "bench/data", name + ".txt"), encoding="utf-8") as f:
            text = f.read()
        rate = bench_encode(tok, text, args.min_time)
        ids = tok.encode(text, add_special_tokens=False).ids
        results["encode_mb_s"][name] = rate
        print(f"encode {name:8s}: {rate:8.2f} MB/s  ({len(text.encode('utf-8'))} bytes, {len(ids)} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
