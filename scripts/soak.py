#!/usr/bin/env python3
"""A soak and a hostile-client fuzz against a running `fathom serve`, with the server's RSS sampled throughout.

    fathom serve --port 8011 --api-key k &                       # the demo model is enough
    scripts/soak.py --url http://127.0.0.1:8011 --api-key k --pid $! \
        --soak-s 1800 --fuzz-requests 30000 --out bench/results/soak.json

Phases, one after the other:
  soak   well-formed traffic for --soak-s seconds from --concurrency clients: chat and completions, streamed and not,
         n > 1, stop strings, logprobs, resumable streams that are dropped and resumed, clients that hang up
         mid-stream, /tokenize, /detokenize, /v1/models, /health, /metrics;
  fuzz   --fuzz-requests requests that are mutations of those (wrong types, huge and negative numbers, deep and wide
         JSON, invalid UTF-8, bytes cut off, unknown fields, bad paths and headers) plus raw garbage on the socket.

It fails (exit 1) when the server dies, answers a 5xx other than the documented 503s (loading, draining,
queue_timeout), does not answer within --timeout-s, counts an internal error (fathom_internal_errors_total), or when
its RSS after warm-up (the first --warmup-fraction of the soak) grows more than --rss-tolerance. Standard library only.
"""
import argparse
import collections
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.parse


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Client:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def request(self, method, path, body=None, headers=None, read_limit=None, stream_cut=None):
        """(status, body bytes, response headers); status 0 when the connection failed."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        h = dict(self.headers)
        h.update(headers or {})
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
                h.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            if stream_cut is not None:  # a client that hangs up part-way through a stream
                data = r.read(stream_cut)
                conn.sock.close()
                return r.status, data, dict(r.getheaders())
            return r.status, r.read(read_limit) if read_limit else r.read(), dict(r.getheaders())
        except (socket.timeout, TimeoutError):
            return -1, b"", {}
        except (ConnectionError, http.client.HTTPException, OSError):
            return 0, b"", {}
        finally:
            conn.close()

    def raw(self, data):
        """Sends bytes as they are; returns the status of the first response line (0: none)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout) as s:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                got = b""
                while len(got) < 64:
                    b = s.recv(4096)
                    if not b:
                        break
                    got += b
            parts = got.split(b" ", 2)
            return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else 0
        except (socket.timeout, TimeoutError):
            return -1
        except (OSError, ValueError):
            return 0


WORDS = "the quick brown fox jumps over a lazy dog while thinking about prime numbers and tensors".split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def valid_request(rng):
    """(method, path, body, extra) of a well-formed request; extra: stream_cut / resume."""
    k = rng.random()
    if k < 0.35:
        body = {"messages": [{"role": "user", "content": text(rng, rng.randint(1, 30))}],
                "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.7, 1.0])}
        if rng.random() < 0.3:
            body["messages"].insert(0, {"role": "system", "content": "be brief"})
        if rng.random() < 0.2:
            body["n"] = rng.randint(1, 3)
        if rng.random() < 0.2:
            body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 5)
        if rng.random() < 0.5:
            body["stream"] = True
            body["stream_options"] = {"include_usage": rng.random() < 0.5}
            if rng.random() < 0.2:
                body["stream_options"]["resumable"] = True
                return "POST", "/v1/chat/completions", body, {"resume": True}
            if rng.random() < 0.15:
                return "POST", "/v1/chat/completions", body, {"stream_cut": rng.randint(1, 400)}
        return "POST", "/v1/chat/completions", body, {}
    if k < 0.65:
        body = {"prompt": text(rng, rng.randint(1, 40)), "max_tokens": rng.randint(1, 24), "seed": rng.randint(0, 99)}
        if rng.random() < 0.3:
            body["stop"] = [rng.choice(WORDS)]
        if rng.random() < 0.3:
            body["prompt"] = [rng.randint(0, 129279) for _ in range(rng.randint(1, 20))]
        if rng.random() < 0.4:
            body["stream"] = True
        return "POST", "/v1/completions", body, {}
    if k < 0.78:
        return "POST", "/tokenize", {"prompt": text(rng, rng.randint(1, 50))}, {}
    if k < 0.86:
        return "POST", "/detokenize", {"tokens": [rng.randint(0, 129279) for _ in range(rng.randint(1, 30))]}, {}
    if k < 0.92:
        return "GET", "/v1/models", None, {}
    if k < 0.97:
        return "GET", "/health", None, {}
    return "GET", "/metrics", None, {}


NASTY = [None, True, False, -1, 0, 2**63, -2**63 - 1, 1e308, -1e-320, "x", "", "\ud800", [], {}, [[[[]]]],
         {"a": {"b": {}}}, "9" * 400, ["x"] * 50]


def mutate_json(rng, body):
    b = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        k = rng.random()
        if k < 0.4 and isinstance(b, dict) and b:
            b[rng.choice(list(b))] = rng.choice(NASTY)
        elif k < 0.55 and isinstance(b, dict):
            b[rng.choice(["n", "max_tokens", "temperature", "top_p", "top_k", "stop", "logit_bias", "seed",
                          "priority", "stream_options", "response_format", "tools", "min_p", "best_of",
                          "add_special_tokens", "messages", "prompt", "tokens", "logprobs", "echo", "suffix"])] = \
                rng.choice(NASTY)
        elif k < 0.62:  # deep nesting, written as text below (Python's own parser would recurse)
            depth = rng.choice([10, 63, 65, 200, 5000])
            return b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"
        elif k < 0.68:
            b = {"prompt": "hi", **{f"k{i}": i for i in range(rng.choice([100, 1025, 5000]))}}
        elif k < 0.74 and isinstance(b, dict) and "messages" in b:
            b["messages"] = [{"role": rng.choice(["user", "assistant", "system", "tool", "x", 1, None]),
                              "content": rng.choice(NASTY + ["hi"])} for _ in range(rng.randint(0, 5))]
    raw = json.dumps(b).encode()
    k = rng.random()
    if k < 0.1:
        raw = raw[: rng.randint(0, len(raw))]
    elif k < 0.2:
        i = rng.randint(0, len(raw))
        raw = raw[:i] + bytes([rng.randint(0x80, 0xff)]) + raw[i:]
    elif k < 0.25:
        raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 200)))
    return raw


def fuzz_request(rng, client):
    """Returns the status of one hostile request."""
    k = rng.random()
    if k < 0.08:  # raw garbage, or a request head mangled
        junk = [b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"GET /\xff\xfe HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00",
                b"GET /v1/streams/\xc3\x28 HTTP/1.1\r\nLast-Event-ID: -1\r\n\r\n",
                b"POST /tokenize HTTP/1.1\r\nContent-Length: 5\r\n\r\n{\"pr",
                bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 300)))]
        return client.raw(rng.choice(junk))
    if k < 0.14:
        path = rng.choice(["/v1/streams/" + "".join(rng.choice("0123456789abcdef") for _ in range(32)),
                           "/v1/streams/chatcmpl-1", "/v1/../../etc/passwd", "/%00", "/v1/models/" + "x" * 3000,
                           "/debug/trace?seconds=-1", "/debug/trace?seconds=nan", "/v1/chat/completions?x=%C3%A9%00"])
        headers = rng.choice([{}, {"Last-Event-ID": rng.choice(["-1", " 1", "+1", "1e3", "x", "18446744073709551616"])}])
        return client.request(rng.choice(["GET", "POST", "PUT", "DELETE"]), path, b"", headers=headers)[0]
    if k < 0.18:
        h = rng.choice([{"Authorization": "bearer " + rng.choice(["k", "wrong", ""])}, {"Authorization": "Basic x"},
                        {"Content-Type": "text/plain"}, {"X-Request-Id": "\x7f" * 10}, {"X-Fathom-Resumable": "2"}])
        method, path, body, _ = valid_request(rng)
        return client.request(method, path, json.dumps(body) if body else None, headers=h)[0]
    method, path, body, _ = valid_request(rng)
    if body is None:
        method, path, body = "POST", rng.choice(["/v1/chat/completions", "/v1/completions", "/tokenize"]), {}
    return client.request(method, path, mutate_json(rng, body), headers={"Content-Type": "application/json"})[0]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.status = collections.Counter()
        self.failures = []

    def add(self, phase, status, what):
        with self.lock:
            self.status[f"{phase}:{status}"] += 1
            if status == -1 or (status >= 500 and status != 503):
                if len(self.failures) < 50:
                    self.failures.append({"phase": phase, "status": status, "request": what[:300]})


def soak_worker(client, rng, deadline, stats):
    while time.time() < deadline:
        method, path, body, extra = valid_request(rng)
        if "stream_cut" in extra:
            st, _, _ = client.request(method, path, body, stream_cut=extra["stream_cut"])
        elif extra.get("resume"):
            # Read the first bytes, drop, then resume with the id the server named.
            st, data, hdrs = client.request(method, path, body, stream_cut=200)
            sid = {k.lower(): v for k, v in hdrs.items()}.get("x-fathom-stream-id")
            if st == 200 and sid:
                time.sleep(rng.random() * 0.2)
                st2, data2, _ = client.request("GET", "/v1/streams/" + sid, headers={"Last-Event-ID": "0"})
                stats.add("soak-resume", st2, sid)
                if st2 == 200 and b"[DONE]" not in data2:
                    stats.add("soak-resume-no-done", 599, sid)
        else:
            st, _, _ = client.request(method, path, body)
        stats.add("soak", st, f"{method} {path} {json.dumps(body)[:200] if body else ''}")


def fuzz_worker(client, rng, n, stats):
    for i in range(n):
        try:
            stats.add("fuzz", fuzz_request(random.Random(rng.random()), client), f"fuzz #{i}")
        except Exception as e:  # a request this client could not even send (its own encoding rules)
            stats.add("fuzz-unsent", 0, repr(e))


def internal_errors(client):
    st, body, _ = client.request("GET", "/metrics")
    total = 0.0
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("fathom_internal_errors_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total if st == 200 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--pid", type=int, required=True, help="the server's pid, for RSS")
    ap.add_argument("--soak-s", type=float, default=1800)
    ap.add_argument("--fuzz-requests", type=int, default=30000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=60)
    ap.add_argument("--warmup-fraction", type=float, default=0.1)
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    client = Client(a.url, a.api_key, a.timeout_s)
    stats = Stats()
    samples = []  # (seconds since start, phase, rss MB)
    t0 = time.time()
    phase = ["soak"]
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append((round(time.time() - t0, 1), phase[0], rss_mb(a.pid)))
            stop.wait(a.sample_s)

    threading.Thread(target=sampler, daemon=True).start()
    rng = random.Random(a.seed)

    print(f"soak: {a.soak_s:.0f} s with {a.concurrency} clients", flush=True)
    deadline = time.time() + a.soak_s
    ts = [threading.Thread(target=soak_worker, args=(client, random.Random(rng.random()), deadline, stats))
          for _ in range(a.concurrency)]
    for t in ts:
        t.start()
    while any(t.is_alive() for t in ts):
        time.sleep(min(60, a.soak_s))
        done = sum(v for k, v in stats.status.items() if k.startswith("soak"))
        print(f"  {time.time() - t0:7.0f} s  {done} requests  RSS {rss_mb(a.pid)} MB", flush=True)
    soak_end = time.time() - t0

    phase[0] = "fuzz"
    print(f"fuzz: {a.fuzz_requests} requests with {a.concurrency} clients", flush=True)
    per = a.fuzz_requests // a.concurrency
    ts = [threading.Thread(target=fuzz_worker, args=(client, random.Random(rng.random()), per, stats))
          for _ in range(a.concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    phase[0] = "after"
    time.sleep(2)
    stop.set()
    samples.append((round(time.time() - t0, 1), "after", rss_mb(a.pid)))

    alive = rss_mb(a.pid) is not None
    health = client.request("GET", "/health")[0]
    ierr = internal_errors(client)
    soak_rss = [s[2] for s in samples if s[1] == "soak" and s[2] is not None]
    warm_i = max(1, int(len(soak_rss) * a.warmup_fraction))
    warm = soak_rss[warm_i - 1] if soak_rss else None
    after_warm = [s[2] for s in samples[warm_i:] if s[2] is not None]
    peak = max(after_warm) if after_warm else None
    growth = (peak - warm) / warm if warm and peak else None
    result = {
        "soak_s": round(soak_end, 1), "fuzz_requests": per * a.concurrency, "concurrency": a.concurrency,
        "status_counts": dict(sorted(stats.status.items())), "failures": stats.failures,
        "server_alive": alive, "health_after": health, "internal_errors_total": ierr,
        "rss_mb": {"warm": warm, "peak_after_warmup": peak, "end": samples[-1][2], "growth": growth,
                   "tolerance": a.rss_tolerance},
        "rss_samples": samples,
    }
    ok = (alive and health == 200 and ierr == 0 and not stats.failures and growth is not None and
          growth <= a.rss_tolerance)
    result["pass"] = ok
    print(json.dumps({k: v for k, v in result.items() if k != "rss_samples"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
