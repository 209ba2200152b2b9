"""http_side.py - the HTTP path of the benchmark: nxd-http in front of a bench nxd, and one streaming client of
/v1/chat/completions for both it and llama-server (the same request, the same timing).

A stream's decode tok/s is its completion tokens after the first (usage.completion_tokens - 1) over the
time from its first chunk with text to the chunk with its finish_reason, which follows the last token at
once; prefill is excluded, as in the other cases. Counting the tokens from usage, not the chunks, matters:
with ignore_eos nxd goes on past an end-of-sequence token, whose text is empty and which nxd-http sends
no chunk for, while llama-server never samples one. The socket side of the comparison is timed alike: its
first token event with text to its done event.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time

SYSTEM = "You are a helpful assistant."  # given, so neither side adds a default system prompt of its own


def messages(question):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


class Gateway:
    """build/nxd-http on 127.0.0.1 (a port the kernel picks) in front of nxd's socket."""

    def __init__(self, binary, sock, ready_timeout=30):
        self.dir = tempfile.mkdtemp(prefix="nxd-http-bench-")
        self.log_path = os.path.join(self.dir, "nxd-http.log")
        self.log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k not in ("LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET")}
        self.proc = subprocess.Popen([binary, "--socket", sock, "--listen", "127.0.0.1:0"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        t_end = time.time() + ready_timeout
        self.port = None
        try:
            while self.port is None:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"nxd-http exited with {self.proc.returncode}: {self.tail()}")
                if time.time() > t_end:
                    raise RuntimeError(f"nxd-http did not listen within {ready_timeout} s: {self.tail()}")
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.tail(50))
                if m:
                    self.port = int(m.group(1))
                time.sleep(0.02)
            while health(self.port) != 200:
                if time.time() > t_end:
                    raise RuntimeError(f"nxd-http's /health not 200 within {ready_timeout} s: {self.tail()}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def tail(self, n=15):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        """Stops the gateway; returns the CPU seconds it used in all (user + system, from wait4), or None."""
        cpu = None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            t_end = time.time() + 15
            while True:
                pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
                if pid:
                    self.proc.returncode = os.waitstatus_to_exitcode(status)
                    cpu = ru.ru_utime + ru.ru_stime
                    break
                if time.time() > t_end:
                    self.proc.kill()
                    self.proc.wait()
                    break
                time.sleep(0.02)
        self.log.close()
        return cpu

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def health(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        c.close()
        return r.status
    except OSError:
        return None


def model_id(port):
    """The id GET /v1/models names first (nxd-http checks `model`; llama-server takes any)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", "/v1/models")
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"GET /v1/models on port {port}: HTTP {r.status}: {body[:300]!r}")
        return json.loads(body)["data"][0]["id"]
    finally:
        c.close()


def chat(port, msgs, n, model, conn=None):
    """One streamed greedy chat completion of exactly n tokens (ignore_eos, which nxd-http and llama-server
    both take). Returns the send time, the arrival time of every chunk with text, the text, and usage."""
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": model, "messages": msgs, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}})
    t_send = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"POST /v1/chat/completions on port {port}: HTTP {r.status}: {r.read()[:300]!r}")
    times, text, usage, done, t_end = [], [], None, False, None
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        d = line[6:].strip()
        if d == b"[DONE]":
            done = True
            break
        ev = json.loads(d)
        if "error" in ev:
            raise RuntimeError(f"stream error on port {port}: {ev['error']}")
        now = time.perf_counter()
        for ch in ev.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                times.append(now)
                text.append(piece)
            if ch.get("finish_reason") and t_end is None:
                t_end = now
        if ev.get("usage"):
            usage = ev["usage"]
    r.read()
    if conn is None:
        c.close()
    if not done:
        raise RuntimeError(f"stream on port {port} ended without [DONE]")
    if not usage:
        raise RuntimeError(f"stream on port {port} sent no usage (stream_options.include_usage)")
    return {"t_send": t_send, "times": times, "t_end": t_end or now, "n": usage["completion_tokens"],
            "text": "".join(text), "usage": usage, "t_done": time.perf_counter()}


def socket_chat(conn, msgs, n, rid=1):
    """The same request over nxd's socket (nxd_side.Conn): the times of token events with text."""
    t_send = time.perf_counter()
    conn.send({"id": rid, "op": "generate", "messages": msgs, "max_tokens": n, "temperature": 0,
               "ignore_eos": True, "stream": True})
    times, text = [], []
    while True:
        ev = conn.recv()
        kind = ev.get("event")
        if kind == "token":
            if ev.get("text"):
                times.append(time.perf_counter())
                text.append(ev["text"])
        elif kind == "done":
            now = time.perf_counter()
            return {"t_send": t_send, "times": times, "t_end": now, "n": ev["usage"]["completion_tokens"],
                    "text": "".join(text), "usage": ev.get("usage"), "t_done": now}
        elif kind == "error":
            raise RuntimeError(f"generate: {ev.get('code')}: {ev.get('message')}")


def rate(res):
    """Decode tok/s of one stream: its tokens after the first, from the first text to the finish."""
    t0 = res["times"][0] if res["times"] else None
    return (res["n"] - 1) / (res["t_end"] - t0) if t0 is not None and res["n"] >= 2 and res["t_end"] > t0 else None


def together(fns):
    """Runs each fn() in its own thread, released at once; their results in order."""
    out, errs = [None] * len(fns), []
    go = threading.Barrier(len(fns))

    def one(i):
        try:
            go.wait()
            out[i] = fns[i]()
        except Exception as e:  # reported below, the others finish
            errs.append(e)

    th = [threading.Thread(target=one, args=(i,)) for i in range(len(fns))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errs:
        raise errs[0]
    return out


def total_rate(results):
    """All decode tokens over the span from the first client's first text to the last client's finish."""
    rs = [r for r in results if r["times"] and r["n"] >= 2]
    return sum(r["n"] - 1 for r in rs) / (max(r["t_end"] for r in rs) - min(r["times"][0] for r in rs))
