#!/usr/bin/env python3
"""llama.cpp's constrained decoding as a peer: llama-server with and without a JSON schema, same run as fathom's.

    bench/peers/llama_server_grammar.py --server /tmp/peer/b/bin/llama-server --model M.gguf \
        --schema bench/schemas/records64.json --n-predict 256 --concurrency 1,64 --requests 4 > peer-grammar.jsonl

Starts llama-server (-ngl 99, one slot per concurrent request), then for each concurrency and each mode
(plain, json_schema) sends `requests` rounds of that many concurrent POST /completion requests (greedy,
ignore_eos, no prompt cache) and prints one JSON line a mode: llama-server's own per-request timings
(`predicted_per_token_ms`, the decode time per token) averaged over the requests. Standard library only; the GGUF
comes from ../shared/peers/make_gguf.py (random weights, synthetic vocabulary).
"""
import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--schema", required=True)
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--concurrency", default="1")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--port", type=int, default=18090)
    a = ap.parse_args()
    schema = json.load(open(a.schema))
    levels = [int(x) for x in a.concurrency.split(",")]
    slots = max(levels)
    ctx = slots * (a.n_predict + 64)
    proc = subprocess.Popen([a.server, "-m", a.model, "-ngl", "99", "-np", str(slots), "-c", str(ctx),
                             "--port", str(a.port)], stdout=sys.stderr, stderr=sys.stderr)
    base = f"http://127.0.0.1:{a.port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(1)
        for n in levels:
            for mode in ["plain", "json_schema"]:
                body = {"prompt": "Records as JSON:", "n_predict": a.n_predict, "temperature": 0, "ignore_eos": True,
                        "cache_prompt": False}
                if mode == "json_schema":
                    body["json_schema"] = schema
                post(base + "/completion", dict(body, n_predict=8))  # warm-up
                per_token, tokens = [], []
                t0 = time.time()
                for _ in range(a.requests):
                    results = [None] * n

                    def one(i):
                        results[i] = post(base + "/completion", body)

                    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    for r in results:
                        if r is None:
                            continue
                        per_token.append(r["timings"]["predicted_per_token_ms"])
                        tokens.append(r["timings"]["predicted_n"])
                print(json.dumps({"peer": "llama.cpp llama-server", "model": a.model.split("/")[-1], "mode": mode,
                                  "concurrency": n, "requests": len(per_token), "n_predict": a.n_predict,
                                  "mean_tokens": statistics.mean(tokens) if tokens else 0,
                                  "predicted_per_token_ms": statistics.mean(per_token) if per_token else None,
                                  "wall_s": time.time() - t0}), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
