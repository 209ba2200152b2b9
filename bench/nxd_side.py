"""nxd_side.py - our side of the benchmark: start build/nxd on a temp socket, wait for READY=1 (sd_notify),
send generate requests over the NDJSON protocol (docs/protocol.md), time token events, read PSS.

Decode tok/s is measured both ways and both are kept: the daemon's own `timing` in the done event
((completion_tokens - 1) / decode_ms: decode_ms starts at the first generated token) and client-side
from the arrival of the first to the last token event. The table uses the client-side number, which
is what llama.cpp's side measures too (first sampled token to last, prefill excluded).
"""
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time


class DaemonError(RuntimeError):
    pass


def pss_kib(pid):
    """Proportional set size of one process in KiB (smaps_rollup), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


class Daemon:
    def __init__(self, nxd, model, workers=2, slots=4, ctx=2048, batch=None, extra=(), log_path=None,
                 ready_timeout=300, env=None):
        self.dir = tempfile.mkdtemp(prefix="nxd-bench-")
        self.sock = os.path.join(self.dir, "nxd.sock")
        notify = os.path.join(self.dir, "notify")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify)
        args = [nxd, "--model", model, "--socket", self.sock, "--workers", str(workers), "--slots", str(slots),
                "--ctx", str(ctx)]
        if batch:
            args += ["--batch", str(batch)]
        args += list(extra)
        self.args = args
        self.log_path = log_path or os.path.join(self.dir, "nxd.log")
        self.log = open(self.log_path, "w")
        env = dict(os.environ, **(env or {}), NOTIFY_SOCKET=notify)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        # start-to-ready: fork+exec to READY=1, which nxd sends once every worker is up.
        deadline = t0 + ready_timeout
        ready = False
        try:
            while not ready:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise DaemonError(f"nxd not ready after {ready_timeout} s (log: {self.log_path})")
                r, _, _ = select.select([ns], [], [], min(left, 0.2))
                if r:
                    msg = ns.recv(4096).decode(errors="replace")
                    ready = any(l == "READY=1" for l in msg.split("\n"))
                if not ready and self.proc.poll() is not None:
                    raise DaemonError(f"nxd exited with {self.proc.returncode} before ready: {self.tail()}")
        except BaseException:
            self.stop()
            raise
        finally:
            ns.close()
        self.ready_s = time.perf_counter() - t0

    def tail(self, n=15):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def pids(self):
        return [self.proc.pid] + children(self.proc.pid)

    def pss(self):
        """{pid: PSS KiB} of the supervisor and its workers."""
        return {p: pss_kib(p) for p in self.pids()}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        for name in ("nxd.sock", "notify"):
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Conn:
    """One client connection: hello, then requests; events read line by line."""

    def __init__(self, path, timeout=600):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.f = self.s.makefile("rwb")
        self.send({"op": "hello", "version": 1})
        ev = self.recv()
        if ev.get("event") != "hello":
            raise DaemonError(f"hello: {ev}")
        self.hello = ev

    def send(self, obj):
        self.f.write((json.dumps(obj) + "\n").encode())
        self.f.flush()

    def recv(self):
        line = self.f.readline()
        if not line:
            raise DaemonError("nxd closed the connection")
        return json.loads(line)

    def generate(self, tokens, max_tokens, rid=1, on_first=None):
        """Greedy, ignore_eos, streamed. Returns dict with token arrival times and the done event.
        on_first: called when the first token arrives."""
        t0 = time.perf_counter()
        self.send({"id": rid, "op": "generate", "tokens": list(tokens), "max_tokens": max_tokens,
                   "temperature": 0, "ignore_eos": True, "stream": True})
        times, ids = [], []
        while True:
            ev = self.recv()
            kind = ev.get("event")
            if kind == "token":
                times.append(time.perf_counter())
                ids.append(ev.get("token"))
                if on_first and len(times) == 1:
                    on_first()
            elif kind == "done":
                return {"t_send": t0, "times": times, "ids": ids, "done": ev, "t_done": time.perf_counter()}
            elif kind == "error":
                raise DaemonError(f"generate: {ev.get('code')}: {ev.get('message')}")

    def request(self, req, rid=1):
        """Any streamed generate (req without op and id): token arrival times, ids and the done event."""
        t0 = time.perf_counter()
        self.send(dict(req, id=rid, op="generate", stream=True))
        times, ids = [], []
        while True:
            ev = self.recv()
            kind = ev.get("event")
            if kind == "token":
                times.append(time.perf_counter())
                ids.append(ev.get("token"))
            elif kind == "done":
                return {"t_send": t0, "times": times, "ids": ids, "done": ev, "t_done": time.perf_counter()}
            elif kind == "error":
                raise DaemonError(f"generate: {ev.get('code')}: {ev.get('message')}")

    def tokenize(self, text, special=True):
        self.send({"id": "tk", "op": "tokenize", "text": text, "special": special})
        ev = self.recv()
        if "tokens" not in ev:
            raise DaemonError(f"tokenize: {ev}")
        return ev["tokens"]

    def status(self):
        self.send({"id": "st", "op": "status"})
        while True:
            ev = self.recv()
            if ev.get("event") in ("status", "error"):
                return ev

    def close(self):
        try:
            self.f.close()
            self.s.close()
        except OSError:
            pass


def decode_rates(res):
    """(client tok/s, server tok/s or None) for one generate result, prefill excluded."""
    times = res["times"]
    client = (len(times) - 1) / (times[-1] - times[0]) if len(times) >= 2 and times[-1] > times[0] else None
    server = None
    d = res["done"]
    tm, usage = d.get("timing") or {}, d.get("usage") or {}
    n = usage.get("completion_tokens")
    if tm.get("decode_ms") and n and n > 1:
        server = (n - 1) / (tm["decode_ms"] / 1000.0)
    return client, server


def prefill_rate(res, n_prompt):
    """Prompt tok/s from the daemon's prefill_ms (first prompt step to first generated token), else
    client-side send-to-first-token."""
    tm = res["done"].get("timing") or {}
    if tm.get("prefill_ms"):
        return n_prompt / (tm["prefill_ms"] / 1000.0), "server"
    if res["times"]:
        return n_prompt / (res["times"][0] - res["t_send"]), "client"
    return None, None


def concurrent(sock, prompts, max_tokens):
    """One connection and one thread per prompt, all sent at once. Returns per-client results."""
    conns = [Conn(sock) for _ in prompts]
    out = [None] * len(prompts)
    errs = []
    barrier = threading.Barrier(len(prompts))

    def run(i):
        try:
            barrier.wait()
            out[i] = conns[i].generate(prompts[i], max_tokens, rid=i + 1)
        except Exception as e:  # reported below, the others finish
            errs.append(e)

    th = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    for c in conns:
        c.close()
    if errs:
        raise errs[0]
    return out
