#!/usr/bin/env python3
"""Re-runs the hostile-client probes that once hurt `fathom serve`, checking that each fix holds and printing what it
measured: one result line per probe, then a JSON summary.

    scripts/hostile_probe.py                                     # every probe, with build/cpu-release/bin/fathom
    scripts/hostile_probe.py --fathom build/asan/bin/fathom --only head,wrapped_ints --out /tmp/hostile.json
    scripts/hostile_probe.py --list                              # the probes' names

It starts and stops the servers itself: `fathom serve` with the built-in demo model (no --model), on free ports of
127.0.0.1 only, each ready once GET /health answers 200 (a process sharing its port: once it logs "ready: serving"),
and stopped with SIGTERM (SIGKILL if it does not exit). Every server it started is stopped whatever happens (finally,
atexit, SIGTERM). Their logs (stderr) and access logs (stdout) are files in a work folder, kept when a probe fails.

Probes (--only NAME[,NAME]):
  json_in_string       guided_json as a string holding JSON nested 200,000 deep: 400, the server alive
  gbnf_chain           a GBNF chain of 150,000 rules (r_i ::= r_i+1): 400 "too deep" within 30 s
  tp_kv_split          `fathom logits` with 3 KV heads over 2 tensor-parallel ranks: exit 1 "does not split", no SIGFPE
  te_cl                Transfer-Encoding that is not exactly chunked, or with Content-Length: one 400, connection closed
  head                 HEAD then GET on one connection: nothing between HEAD's head and the next status line
  pipeline_halfclose   three pipelined requests, then a half-close: three answers
  chunk_lines          chunk extensions and trailers that never end: a 4xx and little RSS; a stalled second request
                       on a keep-alive connection gets 408 after the header timeout, not the idle timeout
  buffered_cap         120 stalled 7.9 MiB uploads: about 32 held (256 MiB in all), the rest 503 server_busy
  io_stall             /health and a stream stay responsive while two clients loop 8 MiB /tokenize requests
  heavy_work           large GBNF compiles, long chats to /tokenize, SIGTERM during compiles: timings
  large_answers        a ~7.5 MiB /detokenize answer many times larger, and ~8 MiB of CJK to /tokenize, arrive whole
  wrapped_ints         priority and top_k past 2^64 - 1 (they once wrapped): 400
  choice_min_tokens    guided_choice with min_tokens past the longest choice: 400 naming min_tokens
  prefix_side_channel  API keys do not see each other's prefix cache (cached_tokens 0) unless the operator opts in
  rolling_restart      a second process takes the shared port (--reuse-port), the first drains: no failed request

Each probe is bounded in time and count. Exit code 1 when any probe's expectation fails, else 0. Standard library
only. Heavy probes (chunk_lines, buffered_cap, io_stall, heavy_work, large_answers) move gigabytes over loopback and
keep cores busy for a while: run them on a machine that is otherwise quiet, or the timings say little.
"""
import argparse
import atexit
import http.client
import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import rss_mb  # noqa: E402  (the RSS reader soak.py samples with)

LOOPBACK = "127.0.0.1"  # never any other address: these probes are hostile by design
MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS_LINE = re.compile(rb"HTTP/1\.1 (\d{3}) ")
BIG = ["--max-request-bytes", "8MiB"]


class ProbeError(Exception):
    """A probe could not go on (a server did not start, say): the probe fails with this message."""


def default_fathom():
    for preset in ("cpu-release", "asan"):
        path = os.path.join(ROOT, "build", preset, "bin", "fathom")
        if os.path.exists(path):
            return path
    return os.path.join(ROOT, "build", "asan", "bin", "fathom")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---------------------------------------------------------------------------------------------------------------------
# Clients


def request(port, method, path, body=None, headers=None, timeout=60.0, on_sent=None):
    """(status, body bytes, seconds) of one request on a new connection; status 0 when the connection failed or closed
    without a whole answer, -1 on a timeout. on_sent is called once the request has left (the answer not yet in)."""
    h = {}
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    if body is not None:
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request(method, path, body=body, headers=h)
        if on_sent:
            on_sent()
        r = conn.getresponse()
        data = r.read()
        return r.status, data, time.monotonic() - t0
    except (socket.timeout, TimeoutError):
        return -1, b"", time.monotonic() - t0
    except (OSError, http.client.HTTPException):
        return 0, b"", time.monotonic() - t0
    finally:
        conn.close()


def json_of(data):
    try:
        v = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return v if isinstance(v, dict) else {}


def error_of(data):
    e = json_of(data).get("error")
    return e if isinstance(e, dict) else {}


def health(port, timeout=10.0):
    return request(port, "GET", "/health", timeout=timeout)[0]


def connect(port, timeout):
    return socket.create_connection((LOOPBACK, port), timeout=timeout)


def read_until_closed(s, timeout_s, limit=64 * MiB):
    """Reads until the server closes the connection, `limit` bytes, or timeout_s: (bytes, how), how one of closed,
    reset, timeout, limit, error. A reset after the answer counts as a close: the answer was read first."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, "timeout"
        s.settimeout(left)
        try:
            b = s.recv(65536)
        except (socket.timeout, TimeoutError):
            return data, "timeout"
        except ConnectionResetError:
            return data, "reset"
        except OSError:
            return data, "error"
        if not b:
            return data, "closed"
        data += b
        if len(data) >= limit:
            return data, "limit"


def recv_while(s, data, more, timeout_s):
    """Appends what `s` sends to `data` while more(data) holds (or until timeout_s, or a close); returns it."""
    deadline = time.monotonic() + timeout_s
    while more(data):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        s.settimeout(left)
        try:
            b = s.recv(65536)
        except OSError:
            break
        if not b:
            break
        data += b
    return data


def read_until(s, marker, timeout_s):
    """Reads until `marker` has arrived (or timeout_s, or a close); returns all bytes read, the marker's and after."""
    return recv_while(s, b"", lambda d: marker not in d, timeout_s)


def read_response(s, timeout_s):
    """One whole Content-Length-framed answer on a keep-alive connection (its head and body)."""
    data = read_until(s, b"\r\n\r\n", timeout_s)
    head, _, rest = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    need = int(m.group(1)) if m else 0
    rest = recv_while(s, rest, lambda d: len(d) < need, timeout_s)
    return head + b"\r\n\r\n" + rest


def statuses(data):
    return [int(x) for x in STATUS_LINE.findall(data)]


class RssWatch:
    """A process's RSS sampled every 50 ms while the block runs: before, peak, after and growth (peak - before), MB."""

    def __init__(self, pid):
        self.pid, self.before, self.peak, self.after = pid, None, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            v = rss_mb(self.pid)
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)
            self._stop.wait(0.05)

    def __enter__(self):
        self.before = rss_mb(self.pid)
        self.peak = self.before
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.after = rss_mb(self.pid)

    @property
    def growth(self):
        return None if self.before is None or self.peak is None else round(self.peak - self.before, 1)


class HealthPoller:
    """GET /health on a new connection every interval_s from its own thread (as a load balancer would): each answer's
    latency in ms, and the answers that were not 200."""

    def __init__(self, port, interval_s=0.05, timeout_s=5.0):
        self.port, self.interval_s, self.timeout_s = port, interval_s, timeout_s
        self.latencies_ms, self.bad = [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            st, _, secs = request(self.port, "GET", "/health", timeout=self.timeout_s)
            self.latencies_ms.append(secs * 1000)
            if st != 200 and len(self.bad) < 20:
                self.bad.append(st)
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(self.timeout_s + 5)

    def stats(self):
        xs = self.latencies_ms
        r = lambda v: None if v is None else round(v, 1)  # noqa: E731
        return {"n": len(xs), "p50_ms": r(percentile(xs, 0.50)), "p99_ms": r(percentile(xs, 0.99)),
                "max_ms": r(max(xs) if xs else None), "not_200": self.bad}


def run_threads(target, arg_lists, join_s):
    """Runs target(*args) for each args at once; returns once all ended or join_s passed."""
    ts = [threading.Thread(target=target, args=args, daemon=True) for args in arg_lists]
    for t in ts:
        t.start()
    deadline = time.monotonic() + join_s
    for t in ts:
        t.join(max(0.0, deadline - time.monotonic()))


# ---------------------------------------------------------------------------------------------------------------------
# Servers


class Server:
    """One `fathom serve` this script started; its stdout (the access log) and stderr (its log) go to files."""

    started = []  # every one, so that stop_all ends them whatever happens
    lock = threading.Lock()
    counter = itertools.count(1)

    def __init__(self, ctx, label, port, flags):
        self.name = f"{label}-{next(Server.counter)}"
        self.port = port
        self.out_path = os.path.join(ctx.workdir, self.name + ".out")
        self.err_path = os.path.join(ctx.workdir, self.name + ".err")
        self.cmd = [ctx.fathom, "serve", "--host", LOOPBACK, "--port", str(port), *flags, *ctx.serve_args]
        self.killed = False
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err, Server.lock:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            Server.started.append(self)

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        try:
            with open(self.err_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def tail(self, chars=1200):
        text = self.log().strip()
        return ("..." + text[-chars:]) if len(text) > chars else text

    def access_log(self):
        """The access log's JSON lines (one per request answered)."""
        lines = []
        try:
            with open(self.out_path, errors="replace") as f:
                for line in f:
                    try:
                        v = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(v, dict):
                        lines.append(v)
        except OSError:
            pass
        return lines

    def wait_ready(self, timeout_s, mode="health"):
        """mode health: GET /health answers 200; log: it logged "ready: serving" (a process that shares its port
        cannot be told apart from the others by /health on that port)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ProbeError(f"{self.name} exited ({self.proc.returncode}) before it was ready: {self.tail()}")
            if mode == "log":
                if "ready: serving" in self.log():
                    return
            elif health(self.port, timeout=2) == 200:
                return
            time.sleep(0.1)
        raise ProbeError(f"{self.name} was not ready within {timeout_s:.0f} s: {self.tail()}")

    def stop(self, timeout_s=45.0, sig=signal.SIGTERM):
        """SIGTERM (or sig), then SIGKILL if it has not exited within timeout_s; returns the exit status."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait(15)
        return self.proc.returncode


def stop_all(timeout_s=15.0):
    for s in list(Server.started):
        try:
            s.stop(timeout_s)
        except Exception:  # one that cannot be stopped must not keep the others running
            try:
                s.proc.kill()
            except OSError:
                pass


def start_server(ctx, label, flags=(), port=None, ready="health"):
    """Starts `fathom serve` on `port` (a free one when None) and waits until it is ready. A free port taken by someone
    else between our look and the server's bind is retried on another."""
    for attempt in range(3):
        srv = Server(ctx, label, port or free_port(), list(flags))
        try:
            srv.wait_ready(ctx.start_timeout_s, ready)
            return srv
        except ProbeError:
            in_use = "address already in use" in srv.log().lower()
            srv.stop(10)
            if port is None and in_use and attempt < 2:
                continue
            raise
    raise ProbeError("unreachable")


class Context:
    def __init__(self, fathom, workdir, start_timeout_s, serve_args):
        self.fathom, self.workdir, self.start_timeout_s, self.serve_args = fathom, workdir, start_timeout_s, serve_args
        self.shared = {}  # label -> Server, for probes that leave it as they found it

    def shared_server(self, label, flags=()):
        s = self.shared.get(label)
        if s is None or not s.alive():
            s = start_server(self, label, flags)
            self.shared[label] = s
        return s


class Result:
    def __init__(self, name):
        self.name, self.failures, self.numbers, self.seconds = name, [], {}, 0.0

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
        return bool(ok)

    def note(self, **numbers):
        self.numbers.update(numbers)

    @property
    def ok(self):
        return not self.failures


# ---------------------------------------------------------------------------------------------------------------------
# Probes. Each takes (ctx, res), records its numbers with res.note and its expectations with res.expect.


def probe_json_in_string(ctx, res):
    # The string is parsed as a schema: 200,000 nested arrays once recursed the parser off the stack.
    srv = ctx.shared_server("default")
    deep = "[" * 200000 + "]" * 200000
    st, data, secs = request(srv.port, "POST", "/v1/completions",
                             {"prompt": "x", "max_tokens": 4, "guided_json": deep}, timeout=60)
    h = health(srv.port)
    res.note(status=st, param=error_of(data).get("param"), seconds=round(secs, 2), health=h)
    res.expect(st == 400, f"status {st}, expected 400: {data[:200]!r}")
    res.expect(h == 200, f"/health {h} afterwards, expected 200")


def probe_gbnf_chain(ctx, res):
    # Each rule inlines the next: 150,000 deep, once a stack overflow; now refused at the compiler's depth bound.
    srv = ctx.shared_server("big", BIG)
    n = 150000
    gbnf = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f'r{n} ::= "x"\n'
    st, data, secs = request(srv.port, "POST", "/v1/completions",
                             {"prompt": "x", "max_tokens": 4, "guided_grammar": gbnf}, timeout=90)
    msg = str(error_of(data).get("message", ""))
    h = health(srv.port)
    res.note(grammar_bytes=len(gbnf), status=st, seconds=round(secs, 2), message=msg[:120], health=h)
    res.expect(st == 400, f"status {st}, expected 400")
    res.expect("too deep" in msg, f"the message does not say 'too deep': {msg[:200]!r}")
    res.expect(0 <= secs < 30, f"answered in {secs:.1f} s, expected under 30 s")
    res.expect(h == 200, f"/health {h} afterwards, expected 200")


def probe_tp_kv_split(ctx, res):
    # 3 KV heads over 2 ranks: the split once divided by zero (SIGFPE, exit 136) instead of refusing the layout.
    d = os.path.join(ctx.workdir, "tp_kv_split")
    os.makedirs(d, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 48,
              "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 6, "num_key_value_heads": 3,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000, "torch_dtype": "bfloat16"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    cmd = [ctx.fathom, "logits", "--load-format", "dummy", "--tensor-parallel-size", "2", "--model", d,
           "--tokens", "1,2"]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        res.expect(False, "fathom logits did not exit within 120 s")
        return
    code = p.returncode if p.returncode >= 0 else 128 - p.returncode  # a signal as a shell shows it (SIGFPE: 136)
    err = p.stderr.decode(errors="replace")
    line = next((ln.strip() for ln in err.splitlines() if "does not split" in ln), "")
    res.note(exit=code, seconds=round(time.monotonic() - t0, 2), message=line[:160])
    res.expect(code == 1, f"exit {code}, expected 1: {err.strip()[-300:]!r}")
    res.expect(bool(line), "stderr does not say 'does not split'")


TE_VARIANTS = [
    ("chunked+CL", b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n"),
    ("xchunked+CL", b"Transfer-Encoding: xchunked\r\nContent-Length: 4\r\n"),
    ("identity+CL", b"Transfer-Encoding: identity\r\nContent-Length: 4\r\n"),
    ("gzip+CL", b"Transfer-Encoding: gzip\r\nContent-Length: 4\r\n"),
    ("obs-fold+CL", b"Transfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n"),
]


def probe_te_cl(ctx, res):
    # Framed by Content-Length, the body ends after "0\r\n"; a proxy that reads it as chunked sees the GET inside as a
    # second request (smuggling). The server must refuse the framing and close, answering exactly once.
    srv = ctx.shared_server("default")
    smuggled = b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for name, te in TE_VARIANTS:
        with connect(srv.port, 5) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + te + b"\r\n" + smuggled)
            data, how = read_until_closed(s, 5)
        sts = statuses(data)
        res.note(**{name: f"{sts} {how}"})
        res.expect(sts == [400], f"{name}: answers {sts}, expected exactly one 400")
        res.expect(how in ("closed", "reset"), f"{name}: the connection was not closed within 5 s ({how})")
    h = health(srv.port)
    res.note(health=h)
    res.expect(h == 200, f"/health {h} afterwards, expected 200")


def probe_head(ctx, res):
    # A body after HEAD's head would be read by the client (or a proxy) as the start of the next response.
    srv = ctx.shared_server("default")
    with connect(srv.port, 5) as s:
        s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = read_until(s, b"\r\n\r\n", 5)
        extra, _ = read_until_closed(s, 0.3)  # a wrongly sent body arrives meanwhile
        s.settimeout(5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        rest, how = read_until_closed(s, 5)
    data += extra + rest
    head, sep, after = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    res.note(head_status=(statuses(head) or [None])[0], head_content_length=int(m.group(1)) if m else None,
             after_head=after.split(b"\r\n", 1)[0].decode(errors="replace"), responses=len(statuses(data)))
    res.expect(bool(sep) and head.startswith(b"HTTP/1.1 200"), f"HEAD answered {head[:60]!r}")
    res.expect(after.startswith(b"HTTP/1.1 200"), f"after HEAD's head came {after[:40]!r}, expected 'HTTP/1.1 200'")


def probe_pipeline_halfclose(ctx, res):
    # A client may pipeline and then shut down its sending side; it still reads every answer.
    srv = ctx.shared_server("default")
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    gen = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    with connect(srv.port, 30) as s:
        s.sendall(get + gen + get)
        s.shutdown(socket.SHUT_WR)
        data, how = read_until_closed(s, 30)
    sts = statuses(data)
    res.note(statuses=sts, end=how)
    res.expect(len(sts) == 3, f"{len(sts)} answers, expected 3")


CHUNKED_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def send_endless(port, prefix, seconds, out):
    """Sends prefix, then 'a' bytes with no line end for up to `seconds`, reading meanwhile; stops once the server
    answers and closes. Fills out: status (of the first answer), end (closed/reset/timeout), sent_kb, answer_s."""
    block = b"a" * 65536
    data, end, sent, answer_s = b"", None, 0, None
    t0 = time.monotonic()
    s = connect(port, 5)
    try:
        s.sendall(prefix)
        s.setblocking(False)
        while end is None and time.monotonic() - t0 < seconds:
            readable, writable, _ = select.select([s], [s], [], 0.1)
            if readable:
                try:
                    b = s.recv(65536)
                except BlockingIOError:
                    b = None
                except OSError:
                    end = "reset"
                    break
                if b == b"":
                    end = "closed"
                    break
                if b:
                    data += b
                    answer_s = answer_s or time.monotonic() - t0
            if writable:
                try:
                    sent += s.send(block)
                except BlockingIOError:
                    pass
                except OSError:  # the server closed: its answer may still be waiting to be read
                    break
        if end is None:
            more, end = read_until_closed(s, 5)
            if more and answer_s is None:
                answer_s = time.monotonic() - t0
            data += more
    finally:
        s.close()
    sts = statuses(data)
    out.update(status=sts[0] if sts else None, end=end, sent_kb=sent // 1024,
               answer_s=None if answer_s is None else round(answer_s, 2))


def probe_chunk_lines(ctx, res):
    # A chunk-size line (with its extension) or a trailer must fit the read buffer; one that never ends once grew the
    # server's memory without bound.
    srv = ctx.shared_server("default")
    pid = srv.proc.pid
    limit_mb = 64

    def check(label, outs, watch):
        res.note(**{label: {"answers": [o.get("status") for o in outs], "ends": [o.get("end") for o in outs],
                            "sent_kb": [o.get("sent_kb") for o in outs], "rss_growth_mb": watch.growth}})
        for o in outs:
            st = o.get("status")
            res.expect(st is not None and 400 <= st < 500, f"{label}: answer {st}, expected a 4xx")
            res.expect(o.get("end") in ("closed", "reset"), f"{label}: the connection was not closed ({o.get('end')})")
        res.expect(watch.growth is not None and watch.growth < limit_mb,
                   f"{label}: RSS grew {watch.growth} MB, expected under {limit_mb} MB")

    for label, prefix, conns in [("extension", CHUNKED_HEAD + b"5;ext=", 1),
                                 ("extension_x4", CHUNKED_HEAD + b"5;ext=", 4),
                                 ("trailer", CHUNKED_HEAD + b"0\r\nX: ", 1)]:
        outs = [{} for _ in range(conns)]
        with RssWatch(pid) as w:
            run_threads(send_endless, [(srv.port, prefix, 4.0, o) for o in outs], join_s=20)
        check(label, outs, w)

    # After one complete request, the next begins and stalls: the header timeout (10 s by default) applies to it, not
    # the keep-alive idle timeout (60 s).
    with connect(srv.port, 30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = statuses(read_response(s, 10))
        s.settimeout(5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{")
        t0 = time.monotonic()
        data = read_until(s, b"\r\n\r\n", 25)  # the 408's head, or a close
        waited = time.monotonic() - t0
    sts = statuses(data)
    res.note(stalled={"first": first, "answer": sts, "after_s": round(waited, 1), "header_timeout_s": 10})
    res.expect(first == [200], f"stalled: the first request got {first}, expected 200")
    res.expect(sts == [408], f"stalled: answer {sts}, expected 408")
    res.expect(waited < 15, f"stalled: the 408 came after {waited:.1f} s, expected about 10 s (the header timeout)")
    h = health(srv.port)
    res.expect(h == 200, f"/health {h} afterwards, expected 200")


def stalled_upload(port, head, body, stop, out):
    """Sends a request head and most of its body, then waits (reading) until stop is set. Fills out: send (ok or the
    error), sent_at, data (any answer), end (closed/reset) when the server closed."""
    try:
        s = connect(port, 60)
    except OSError as e:
        out.update(send=type(e).__name__, sent_at=time.monotonic(), end="connect")
        return
    out["data"] = b""
    try:
        try:
            s.sendall(head)
            s.sendall(body)
            out["send"] = "ok"
        except (socket.timeout, TimeoutError):
            out["send"] = "timeout"
        except OSError as e:  # refused part-way (503 and closed): the answer is still to read
            out["send"] = type(e).__name__
        out["sent_at"] = time.monotonic()
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                b = s.recv(65536)
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                out["end"] = "reset"
                break
            if not b:
                out["end"] = "closed"
                break
            out["data"] += b
    finally:
        s.close()


def probe_buffered_cap(ctx, res):
    # 120 uploads that stall near their end once held 957 MB. Bodies being received are capped over all connections
    # (--max-buffered-request-bytes, 256 MiB by default); past it an upload is answered 503 server_busy. The header
    # timeout (which covers the whole request) is raised from 10 s so that the held uploads are still held when they
    # are counted, however long a slow machine takes to push 950 MB through loopback.
    srv = start_server(ctx, "buffered_cap", BIG + ["--header-timeout-s", "120"])
    n, length, part, cap = 120, 8 * MiB, int(7.9 * MiB), 256 * MiB
    head = (f"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()
    body = b"x" * part
    stop = threading.Event()
    outs = [{} for _ in range(n)]
    threads = [threading.Thread(target=stalled_upload, args=(srv.port, head, body, stop, o), daemon=True)
               for o in outs]
    t0 = time.monotonic()
    try:
        with RssWatch(srv.proc.pid) as w:
            for t in threads:
                t.start()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and not all("sent_at" in o for o in outs):
                time.sleep(0.1)
            time.sleep(1.0)  # answers to the last refused uploads land
            counted_s = time.monotonic() - t0
            held, busy, other = 0, 0, {}
            for o in outs:
                data = o.get("data", b"")
                sts = statuses(data)
                if sts and sts[0] == 503 and b"server_busy" in data:
                    busy += 1
                elif sts:
                    other[sts[0]] = other.get(sts[0], 0) + 1
                elif o.get("end"):
                    other[o["end"]] = other.get(o["end"], 0) + 1  # closed without an answer
                else:
                    held += 1
            still_sending = sum(1 for o in outs if "sent_at" not in o)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    time.sleep(0.5)
    after = rss_mb(srv.proc.pid)
    h = health(srv.port)
    most = cap // part
    res.note(uploads=n, held=held, server_busy=busy, other=other, still_sending=still_sending,
             counted_after_s=round(counted_s, 1), rss_before_mb=w.before, rss_growth_mb=w.growth,
             rss_after_close_mb=after, most_held=most, health=h)
    res.expect(held <= most, f"{held} uploads held, expected at most {most} (256 MiB / 7.9 MiB)")
    res.expect(held + busy == n, f"outcomes other than held or 503 server_busy: {other}")
    # 957 MB before the cap; the cap itself allows 256 MiB and each held body its string's slack.
    res.expect(w.growth is not None and w.growth < 480, f"RSS grew {w.growth} MB, expected far below 957 MB (< 480)")
    res.expect(h == 200, f"/health {h} afterwards, expected 200")
    srv.stop()


def tokenize_loop(port, body, stop, out):
    while not stop.is_set():
        st, _, secs = request(port, "POST", "/tokenize", body, timeout=60)
        out.append((st, secs))


def stream_gaps(port, stop, out):
    """Keeps a streaming completion open until stop (a new one when one ends): the largest gap between two SSE
    events of one stream, and the events seen."""
    body = json.dumps({"prompt": "hi", "max_tokens": 2000, "stream": True, "ignore_eos": True})
    max_gap, events, streams, errors = 0.0, 0, 0, []
    while not stop.is_set() and len(errors) < 20:
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
        try:
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                errors.append(r.status)
                r.read()
                stop.wait(0.2)
                continue
            streams += 1
            last = None
            while not stop.is_set():
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    now = time.monotonic()
                    if last is not None:
                        max_gap = max(max_gap, now - last)
                    last = now
                    events += 1
                    if line.strip() == b"data: [DONE]":
                        break
        except (socket.timeout, TimeoutError):
            errors.append("timeout")
        except (OSError, http.client.HTTPException) as e:
            errors.append(type(e).__name__)
        finally:
            conn.close()
    out.update(max_gap_s=round(max_gap, 3), events=events, streams=streams, errors=errors)


def probe_io_stall(ctx, res):
    # Copying and parsing 8 MiB bodies once ran on the I/O threads, stalling every other connection behind them.
    srv = start_server(ctx, "io_stall", BIG)
    n = (8 * MiB - 100) // 5
    body = json.dumps({"prompt": "word " * n}).encode()
    stop = threading.Event()
    loops = [[], []]
    stream = {}
    seconds = 10.0
    ts = [threading.Thread(target=tokenize_loop, args=(srv.port, body, stop, out), daemon=True) for out in loops]
    ts.append(threading.Thread(target=stream_gaps, args=(srv.port, stop, stream), daemon=True))
    try:
        with HealthPoller(srv.port) as hp:
            for t in ts:
                t.start()
            stop.wait(seconds)
            stop.set()
    finally:
        stop.set()
        for t in ts:
            t.join(65)
    hs = hp.stats()
    tok = [st for out in loops for st, _ in out]
    res.note(body_bytes=len(body), tokenize_requests=len(tok), tokenize_not_200=[st for st in tok if st != 200][:10],
             health=hs, health_p99_target_ms=50, stream=stream, stream_max_gap_target_s=1.0,
             health_p99_met=hs["p99_ms"] is not None and hs["p99_ms"] < 50,
             stream_gap_met=stream.get("max_gap_s") is not None and stream.get("max_gap_s", 9) < 1.0)
    res.expect(tok and all(st == 200 for st in tok), f"/tokenize answers other than 200: {tok[:10]}")
    res.expect(not hs["not_200"], f"/health answered {hs['not_200']}")
    # The target is 50 ms; only 250 ms fails, so that a loaded machine does not flap.
    res.expect(hs["p99_ms"] is not None and hs["p99_ms"] < 250, f"/health p99 {hs['p99_ms']} ms (fails at 250 ms)")
    res.expect(stream.get("events", 0) > 0, f"the stream delivered no event: {stream}")
    srv.stop()


def gbnf_rules(n, segment=250):
    """A valid GBNF of n one-line rules besides root: r_i ::= "x" | r_(i+1) in chains of `segment` rules, each chain
    ending in a literal, and root choosing among the chains' heads. Every rule is used and no chain nests deeper than
    the compiler's bound (2,000), so the grammar is parsed and compiled whole (or refused as too large)."""
    lines = ["root ::= " + " | ".join(f"r{h}" for h in range(0, n, segment))]
    for i in range(n):
        last = (i + 1) % segment == 0 or i == n - 1
        lines.append(f'r{i} ::= "x"' if last else f'r{i} ::= "x" | r{i + 1}')
    return "\n".join(lines) + "\n"


def post_recording(port, path, body, out, sent=None, timeout=180):
    st, data, secs = request(port, "POST", path, body, timeout=timeout, on_sent=sent.set if sent else None)
    out.update(status=st, code=error_of(data).get("code"), seconds=round(secs, 2))
    if sent:
        sent.set()


def probe_heavy_work(ctx, res):
    # Parsing and compiling large grammars and rendering long chats once ran where they blocked the I/O threads, and
    # some of it was quadratic (counting lines from the start for every rule: 200k rules took minutes).
    srv = start_server(ctx, "heavy_work", BIG)
    grammar = gbnf_rules(60000)
    body = json.dumps({"prompt": "x", "max_tokens": 4, "guided_grammar": grammar}).encode()

    # (a) two compiles at once while /health is polled
    outs = [{}, {}]
    with HealthPoller(srv.port) as hp:
        run_threads(post_recording, [(srv.port, "/v1/completions", body, o) for o in outs], join_s=200)
        time.sleep(0.2)
    hs = hp.stats()
    res.note(compile_60k={"grammar_bytes": len(grammar), "answers": outs, "health_max_ms": hs["max_ms"],
                          "health_p99_ms": hs["p99_ms"]})
    for o in outs:
        res.expect(o.get("status", 0) > 0, f"a 60k-rule compile got no answer: {o}")
    res.expect(not hs["not_200"], f"/health answered {hs['not_200']} during the compiles")

    # (b) parse time as the rule count doubles
    parse = {}
    for n in (100000, 200000):
        g = gbnf_rules(n)
        o = {}
        post_recording(srv.port, "/v1/completions", {"prompt": "x", "max_tokens": 4, "guided_grammar": g}, o)
        parse[f"{n // 1000}k"] = {"bytes": len(g), "status": o["status"], "seconds": o["seconds"]}
        res.expect(o["status"] in (200, 400), f"{n} rules: status {o['status']}, expected 400 or 200")
    res.note(gbnf_parse=parse)

    # (c) chats of many system messages to /tokenize: roughly linear, seconds not minutes
    chats = {}
    for n in (1000, 2000, 4000, 8000):
        msgs = [{"role": "system", "content": (f"rule {i}: " + "keep answers short and plain. " * 8)[:200]}
                for i in range(n)]
        msgs.append({"role": "user", "content": "hi"})
        st, data, secs = request(srv.port, "POST", "/tokenize", {"messages": msgs}, timeout=180)
        chats[n] = {"status": st, "seconds": round(secs, 2), "tokens": json_of(data).get("count")}
        res.expect(st == 200, f"{n} messages: status {st}, expected 200")
        res.expect(secs < 60, f"{n} messages took {secs:.0f} s, expected seconds")
    if chats[1000]["seconds"] > 0:
        res.note(chat_8000_over_1000=round(chats[8000]["seconds"] / chats[1000]["seconds"], 1))
    res.note(tokenize_chat=chats)
    srv.stop()

    # (d) SIGTERM with --shutdown-grace-s 2 while two compiles run: each gets an answer, /health says draining.
    srv = start_server(ctx, "heavy_drain", BIG + ["--shutdown-grace-s", "2"])
    outs, sent = [{}, {}], [threading.Event(), threading.Event()]
    ts = [threading.Thread(target=post_recording, args=(srv.port, "/v1/completions", body, o, e), daemon=True)
          for o, e in zip(outs, sent)]
    for t in ts:
        t.start()
    for e in sent:
        e.wait(30)
    time.sleep(0.05)
    t_sig = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    draining = None
    while time.monotonic() - t_sig < 1.0:
        if not srv.alive():
            draining = "exited first"
            break
        st, data, _ = request(srv.port, "GET", "/health", timeout=1)
        if st == 503 and b"draining" in data:
            draining = round(time.monotonic() - t_sig, 3)
            break
        time.sleep(0.05)
    try:
        srv.proc.wait(30)
        exit_s = round(time.monotonic() - t_sig, 2)
    except subprocess.TimeoutExpired:
        exit_s = None
        srv.stop(5, signal.SIGKILL)
    for t in ts:
        t.join(30)
    res.note(sigterm={"exit_s": exit_s, "exit": srv.proc.returncode, "health_draining_after_s": draining,
                      "in_flight": outs})
    res.expect(exit_s is not None, "the server had not exited 30 s after SIGTERM (grace 2 s)")
    res.expect(draining is not None, "/health did not answer 503 draining within 1 s of SIGTERM")
    for o in outs:
        res.expect(o.get("status") in (200, 400, 503), f"an in-flight compile got {o} (expected an answer)")


def probe_large_answers(ctx, res):
    # Answers many times the request's size once hit the cap on unread output and were cut off.
    srv = ctx.shared_server("big", BIG)
    st, data, _ = request(srv.port, "POST", "/tokenize", {"prompt": "=" * 64})
    toks = json_of(data).get("tokens") or []
    res.expect(st == 200 and toks, f"/tokenize of '='*64: status {st}")
    best, text = None, ""
    for t in sorted(set(toks))[:64]:
        _, d, _ = request(srv.port, "POST", "/detokenize", {"tokens": [t]})
        piece = json_of(d).get("prompt", "")
        if isinstance(piece, str) and len(piece) > len(text):
            best, text = t, piece
    if best is not None:
        # At most 1M ids: a request's JSON holds at most 2^20 values (the finding's 1M long tokens fit).
        count = min(int(7.5 * MiB) // (len(str(best)) + 1), 1_000_000)
        body = ('{"tokens":[' + ",".join([str(best)] * count) + "]}").encode()
        st, data, secs = request(srv.port, "POST", "/detokenize", body, timeout=180)
        got = json_of(data).get("prompt")
        got_len = len(got) if isinstance(got, str) else None
        res.note(detokenize={"token": best, "token_text": text, "count": count, "request_bytes": len(body),
                             "status": st, "answer_bytes": len(data), "prompt_chars": got_len,
                             "expected_chars": count * len(text), "seconds": round(secs, 2)})
        res.expect(st == 200, f"/detokenize: status {st}, expected 200")
        res.expect(got_len == count * len(text), f"/detokenize: {got_len} chars, expected {count * len(text)}")

    n = (8 * MiB - 100) // 6  # '漢字' is 6 bytes of UTF-8
    body = json.dumps({"prompt": "漢字" * n}, ensure_ascii=False).encode()
    st, data, secs = request(srv.port, "POST", "/tokenize", body, timeout=180)
    v = json_of(data)
    tokens = v.get("tokens")
    whole = isinstance(tokens, list) and v.get("count") == len(tokens)
    res.note(tokenize_cjk={"request_bytes": len(body), "status": st, "answer_bytes": len(data),
                           "count": v.get("count"), "whole": whole, "seconds": round(secs, 2)})
    res.expect(st == 200, f"/tokenize of 8 MiB of CJK: status {st}, expected 200")
    res.expect(whole, "/tokenize of 8 MiB of CJK: the answer is not a whole JSON body with count == len(tokens)")


def probe_wrapped_ints(ctx, res):
    # Read into a 64-bit integer, these once wrapped to a small (valid) number instead of being refused.
    srv = ctx.shared_server("default")
    for field, value in [("priority", 18446744073708551616), ("top_k", 18446744073709551615)]:
        text = json.dumps({"prompt": "ok", "max_tokens": 2, field: value})  # the number as written, not a float
        st, data, _ = request(srv.port, "POST", "/v1/completions", text)
        res.note(**{field: {"status": st, "param": error_of(data).get("param")}})
        res.expect(st == 400, f"{field} {value}: status {st}, expected 400")


def probe_choice_min_tokens(ctx, res):
    # min_tokens past every choice cannot be met: the grammar ends the output first; refused up front.
    srv = ctx.shared_server("default")
    st, data, _ = request(srv.port, "POST", "/v1/completions",
                          {"prompt": "ok?", "guided_choice": ["yes"], "min_tokens": 3, "max_tokens": 8})
    param = error_of(data).get("param")
    res.note(status=st, param=param)
    res.expect(st == 400, f"status {st}, expected 400")
    res.expect(param == "min_tokens", f"param {param!r}, expected 'min_tokens'")


def cached_tokens(port, key, prompt, salt=None):
    """(status, usage.prompt_tokens_details.cached_tokens, prompt_tokens) of a one-token completion."""
    body = {"prompt": prompt, "max_tokens": 1}
    if salt:
        body["cache_salt"] = salt
    st, data, _ = request(port, "POST", "/v1/completions", body, headers={"Authorization": f"Bearer {key}"})
    usage = json_of(data).get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return st, details.get("cached_tokens"), usage.get("prompt_tokens")


def probe_prefix_side_channel(ctx, res):
    # With one prefix cache for all, cached_tokens tells client B whether client A's prompt began as B guessed. The
    # secret leads the prompt, so that B's wrong guess shares no cache block with the right one.
    filler = " ".join(f"item{i} is filed under shelf {i % 7}." for i in range(9))
    prompt = "Alice's card PIN is 4417 and her account is 0098-1123-5813. " + filler
    wrong = "Bob's card PIN is 9921 and his account is 7730-4410-2281. " + filler
    srv = start_server(ctx, "per_key", ["--api-key", "k1,k2"])
    a = cached_tokens(srv.port, "k1", prompt)
    b_wrong = cached_tokens(srv.port, "k2", wrong)
    b_right = cached_tokens(srv.port, "k2", prompt)
    a_again = cached_tokens(srv.port, "k1", prompt)  # the cache works: A sees its own prompt cached
    s1 = [cached_tokens(srv.port, "k1", prompt, "s1") for _ in range(2)]
    s2 = cached_tokens(srv.port, "k1", prompt, "s2")
    res.note(prompt_tokens=a[2], per_key={"a": a[1], "b_wrong_guess": b_wrong[1], "b_right_guess": b_right[1],
                                          "a_again": a_again[1], "salt_s1": [x[1] for x in s1], "salt_s2": s2[1]})
    for what, r in [("A", a), ("B wrong", b_wrong), ("B right", b_right), ("A again", a_again), ("s1 first", s1[0]),
                    ("s1 second", s1[1]), ("s2", s2)]:
        res.expect(r[0] == 200, f"{what}: status {r[0]}, expected 200")
    res.expect(b_wrong[1] == 0, f"B's wrong guess: cached_tokens {b_wrong[1]}, expected 0")
    res.expect(b_right[1] == 0, f"B's right guess: cached_tokens {b_right[1]}, expected 0 (per-key isolation)")
    res.expect((a_again[1] or 0) > 0, f"A's repeat: cached_tokens {a_again[1]}, expected > 0 (is caching on?)")
    res.expect((s1[1][1] or 0) > 0, f"the second request salted s1: cached_tokens {s1[1][1]}, expected > 0")
    res.expect(s2[1] == 0, f"salted s2: cached_tokens {s2[1]}, expected 0")
    srv.stop()

    # The opt-in: keys share the cache, and B's right guess is served from A's blocks.
    srv = start_server(ctx, "shared", ["--api-key", "k1,k2", "--prefix-cache-isolation", "shared"])
    a = cached_tokens(srv.port, "k1", prompt)
    b_right = cached_tokens(srv.port, "k2", prompt)
    res.note(shared_opt_in={"a": a[1], "b_right_guess": b_right[1]})
    res.expect((b_right[1] or 0) > 0,
               f"with --prefix-cache-isolation shared, B's right guess: cached_tokens {b_right[1]}, expected > 0")
    srv.stop()


def load_client(port, stop, out, lock):
    """Short completions, each on a new connection (Connection: close), until stop. A reset with no answer (the
    connection was in the draining process's accept queue when it closed its listener) is retried once, as clients
    do."""
    body = json.dumps({"prompt": "hi", "max_tokens": 4})
    while not stop.is_set():
        for attempt in range(2):
            conn = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
            err = None
            try:
                conn.request("POST", "/v1/completions", body=body,
                             headers={"Content-Type": "application/json", "Connection": "close"})
                r = conn.getresponse()
                r.read()
                st = r.status
            except (ConnectionResetError, BrokenPipeError):  # http.client.RemoteDisconnected is one
                st, err = 0, "reset"
            except (socket.timeout, TimeoutError):
                st, err = -1, "timeout"
            except (OSError, http.client.HTTPException) as e:
                st, err = 0, type(e).__name__
            finally:
                conn.close()
            if err == "reset" and attempt == 0:
                with lock:
                    out["retried"] += 1
                continue
            break
        with lock:
            out["total"] += 1
            if st != 200:
                out["failed"] += 1
                if len(out["failures"]) < 20:
                    out["failures"].append(err or st)


def probe_rolling_restart(ctx, res):
    # Two processes share the port (SO_REUSEPORT); the new one binds only once ready, the old one hands its queued
    # connections over as it drains: no client sees an error.
    port = free_port()
    flags = ["--reuse-port"]
    a = start_server(ctx, "rolling_a", flags, port=port, ready="log")
    if health(port) != 200:
        raise ProbeError(f"process A logged ready but /health on {port} is not 200")
    stop, lock = threading.Event(), threading.Lock()
    out = {"total": 0, "failed": 0, "retried": 0, "failures": []}
    ts = [threading.Thread(target=load_client, args=(port, stop, out, lock), daemon=True) for _ in range(6)]
    b = None
    try:
        for t in ts:
            t.start()
        time.sleep(2.0)
        b = Server(ctx, "rolling_b", port, flags)
        b.wait_ready(ctx.start_timeout_s, "log")
        t_sig = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        time.sleep(2.0)
    finally:
        stop.set()
        for t in ts:
            t.join(40)
    try:
        a.proc.wait(45)
        a_exit_s = round(time.monotonic() - t_sig, 1)
    except subprocess.TimeoutExpired:
        a_exit_s = None
        a.stop(5)
    served = {}
    for label, srv in [("a", a), ("b", b)]:
        lines = [x for x in srv.access_log() if x.get("path") == "/v1/completions"]
        served[label] = {"requests": len(lines), "not_200": sum(1 for x in lines if x.get("status") != 200)}
    res.note(total=out["total"], failed=out["failed"], retried=out["retried"], failures=out["failures"],
             served=served, a_exit=a.proc.returncode, a_exited_after_s=a_exit_s)
    res.expect(out["total"] > 0, "the load sent no request")
    res.expect(out["failed"] == 0, f"{out['failed']} of {out['total']} requests failed: {out['failures']}")
    res.expect(a_exit_s is not None, "process A had not exited 45 s after SIGTERM")
    b.stop()


PROBES = [
    ("json_in_string", probe_json_in_string, 120),
    ("gbnf_chain", probe_gbnf_chain, 240),
    ("tp_kv_split", probe_tp_kv_split, 150),
    ("te_cl", probe_te_cl, 120),
    ("head", probe_head, 60),
    ("pipeline_halfclose", probe_pipeline_halfclose, 120),
    ("chunk_lines", probe_chunk_lines, 240),
    ("buffered_cap", probe_buffered_cap, 420),
    ("io_stall", probe_io_stall, 300),
    ("heavy_work", probe_heavy_work, 1200),
    ("large_answers", probe_large_answers, 420),
    ("wrapped_ints", probe_wrapped_ints, 120),
    ("choice_min_tokens", probe_choice_min_tokens, 120),
    ("prefix_side_channel", probe_prefix_side_channel, 420),
    ("rolling_restart", probe_rolling_restart, 420),
]


# ---------------------------------------------------------------------------------------------------------------------


def run_probe(ctx, name, fn, cap_s):
    """Runs one probe in a thread, at most cap_s seconds (its sockets have their own timeouts; this bounds the rest).
    Stops the servers it started, and fails it when a shared server it used died."""
    res = Result(name)
    first = len(Server.started)

    def body():
        try:
            fn(ctx, res)
        except ProbeError as e:
            res.failures.append(str(e))
        except Exception as e:  # a probe that breaks fails alone; the others still run
            res.failures.append(f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    t = threading.Thread(target=body, daemon=True, name=name)
    t.start()
    t.join(cap_s)
    if t.is_alive():
        res.failures.append(f"did not finish within {cap_s} s")
        stop_all()  # what it waits on goes away
        ctx.shared.clear()
        t.join(20)
    shared = list(ctx.shared.values())
    for s in Server.started[first:]:
        if s not in shared:
            s.stop()
    for label, s in list(ctx.shared.items()):
        if not s.alive():
            res.failures.append(f"server {s.name} died (exit {s.proc.returncode}): {s.tail()}")
            del ctx.shared[label]
    res.seconds = time.monotonic() - t0
    return res


def compact(v):
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    return str(v)


def on_signal(signum, _frame):
    sys.exit(128 + signum)  # unwinds through the finally blocks, which stop the servers


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--fathom", default=default_fathom(),
                    help="the fathom binary (default: build/cpu-release/bin/fathom, else build/asan/bin/fathom)")
    ap.add_argument("--only", default="", help="NAME[,NAME]: run only these probes")
    ap.add_argument("--out", default="", help="write the JSON summary to this file")
    ap.add_argument("--start-timeout-s", type=float, default=180, help="how long a server may take to be ready")
    ap.add_argument("--serve-args", default="", help="more flags for every `fathom serve`, e.g. '--threads 2'")
    ap.add_argument("--keep-logs", action="store_true", help="keep the servers' logs even when every probe passes")
    ap.add_argument("--list", action="store_true", help="print the probes' names and exit")
    a = ap.parse_args()

    if a.list:
        print("\n".join(name for name, _, _ in PROBES))
        return
    names = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = sorted(set(names) - {name for name, _, _ in PROBES})
    if unknown:
        ap.error(f"unknown probes: {', '.join(unknown)} (--list names them)")
    selected = [p for p in PROBES if not names or p[0] in names]
    fathom = os.path.abspath(a.fathom)
    if not os.access(fathom, os.X_OK):
        ap.error(f"{fathom} is not an executable (--fathom)")

    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, on_signal)
    workdir = tempfile.mkdtemp(prefix="fathom-hostile-")
    ctx = Context(fathom, workdir, a.start_timeout_s, shlex.split(a.serve_args))
    print(f"hostile probes against {fathom} (logs in {workdir})", flush=True)
    results = []
    try:
        for name, fn, cap_s in selected:
            res = run_probe(ctx, name, fn, cap_s)
            results.append(res)
            nums = "  ".join(f"{k}={compact(v)}" for k, v in res.numbers.items())
            print(f"{'PASS' if res.ok else 'FAIL'}  {name:<20} {res.seconds:6.1f} s  {nums}", flush=True)
            for f in res.failures:
                print(f"      - {f}", flush=True)
    finally:
        stop_all()

    ok = all(r.ok for r in results)
    keep = a.keep_logs or not ok
    summary = {
        "fathom": fathom,
        "logs": workdir if keep else None,
        "probes": [{"name": r.name, "pass": r.ok, "seconds": round(r.seconds, 1), "numbers": r.numbers,
                    "failures": r.failures} for r in results],
        # A sanitizer build reports what it found at exit through the exit status.
        "servers": [{"name": s.name, "exit": s.proc.returncode, "killed": s.killed} for s in Server.started],
        "passed": sum(1 for r in results if r.ok),
        "failed": sum(1 for r in results if not r.ok),
        "pass": ok,
    }
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1, ensure_ascii=False)
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
