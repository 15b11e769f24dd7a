#!/usr/bin/env python3
"""Runs the README's marked shell examples as printed (the `docs_readme` ctest).

    scripts/check_readme.py REPO_ROOT FATHOM_BINARY

A fenced block whose info string is `sh readme-test` (GitHub renders it as `sh`) is a test: before the first one,
`fathom serve` starts on its built-in demo at 127.0.0.1:8000, where the README's examples talk to it. Each command
of a block (backslash-continued lines joined) runs in bash from the repository root, with the binary's folder first
on PATH, so that `fathom ...` is the binary under test. It must exit 0, and where the README quotes what a command
prints, as a trailing `# prints: TEXT`, its output (stdout and stderr) must contain TEXT. Commands run in a scratch
HOME; files they name under /tmp are theirs.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

PORT = 8000


def blocks(readme):
    """Yields (first line number, [lines]) of every `sh readme-test` block."""
    lines = readme.split("\n")
    i = 0
    while i < len(lines):
        if re.fullmatch(r"```sh readme-test\s*", lines[i]):
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise SystemExit(f"README.md:{i + 1}: a readme-test block is never closed")
            yield start + 1, lines[start:j]
            i = j
        i += 1


def commands(first_line, lines):
    """Joins continued lines; yields (line number, command, expected text or None)."""
    cmd, at = "", first_line
    for n, line in enumerate(lines, first_line):
        if not cmd:
            at = n
        if line.endswith("\\"):
            cmd += line[:-1] + " "
            continue
        cmd += line
        if cmd.strip():
            expect = None
            m = re.search(r"\s#\s*prints:\s*(.*)$", cmd)
            if m:
                expect = m.group(1).strip()
            yield at, cmd, expect
        cmd = ""


def wait_healthy(proc, deadline_s):
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"fathom serve exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"fathom serve was not healthy within {deadline_s} s")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    root, binary = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        found = list(blocks(f.read()))
    if not found:
        raise SystemExit("README.md has no `sh readme-test` block: nothing would be tested")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(binary) + os.pathsep + env.get("PATH", "")
    home = tempfile.mkdtemp(prefix="fathom-readme-")
    env["HOME"] = home
    port_free_or_exit()
    server = subprocess.Popen([binary, "serve", "--access-log", "off"], cwd=root, env=env,
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(home, "serve.log"), "w"))
    failures, ran = [], 0
    try:
        wait_healthy(server, 300)
        for first, lines in found:
            for at, cmd, expect in commands(first, lines):
                ran += 1
                t0 = time.time()
                r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=root, env=env, capture_output=True,
                                   text=True, timeout=600)
                took = time.time() - t0
                out = r.stdout + r.stderr
                ok = r.returncode == 0 and (expect is None or expect in out)
                print(f"{'ok  ' if ok else 'FAIL'} README.md:{at} ({took:.1f} s): {cmd.strip()[:100]}", flush=True)
                if not ok:
                    why = f"exit {r.returncode}" if r.returncode != 0 else f"output lacks {expect!r}"
                    failures.append(f"README.md:{at}: {why}\n  $ {cmd.strip()}\n" +
                                    "".join(f"  | {l}\n" for l in out.splitlines()[-15:]))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    if server.returncode not in (0, None):
        failures.append(f"fathom serve exited with {server.returncode} on SIGTERM")
    print(f"{ran - len(failures)} of {ran} README commands ran as printed")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        with open(os.path.join(home, "serve.log")) as f:
            print("fathom serve's log (tail):\n" + "".join(f.readlines()[-20:]), file=sys.stderr)
        sys.exit(1)


def port_free_or_exit():
    """Fails at once, saying so, when something already listens on the README's port."""
    import socket
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", PORT)) == 0:
            raise SystemExit(f"port {PORT} is taken: the README's examples need it for `fathom serve`")


if __name__ == "__main__":
    main()
