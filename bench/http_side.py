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
import socket
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


class _Stream:
    """The body of one HTTP/1.1 response read straight off its socket, chunked framing undone, as lines.

    The benchmark times the servers, so its client should cost as little CPU as the socket side's
    (a file's readline and json.loads per event): http.client's chunked readline is several times
    that in Python, and on a 2-CPU machine the client's CPU is taken from the server's workers."""

    def __init__(self, sock):
        self.s, self.raw, self.body, self.chunked, self.left, self.eof = sock, b"", b"", False, 0, False

    def _fill(self):
        k = self.s.recv(65536)
        if not k:
            self.eof = True
        self.raw += k

    def head(self):
        while b"\r\n\r\n" not in self.raw:
            if self.eof:
                raise RuntimeError("the server closed the connection before its response head")
            self._fill()
        head, self.raw = self.raw.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        self.chunked = hdrs.get("transfer-encoding", "").lower() == "chunked"
        return status, hdrs

    def _unframe(self):
        """Moves what has arrived of the body from raw to body; False at its end."""
        if not self.chunked:
            self.body += self.raw
            self.raw = b""
            return not self.eof
        while True:
            if self.left:
                take = self.raw[:self.left]
                self.body += take
                self.raw = self.raw[len(take):]
                self.left -= len(take)
                if self.left:
                    return True
            nl = self.raw.find(b"\r\n")
            if nl < 0:
                return True
            if nl == 0:  # the CRLF after a chunk's data
                self.raw = self.raw[2:]
                continue
            size = int(self.raw[:nl].split(b";")[0], 16)
            if size == 0:
                return False
            self.raw, self.left = self.raw[nl + 2:], size

    def lines(self):
        more = True
        while True:
            nl = self.body.find(b"\n")
            if nl >= 0:
                line, self.body = self.body[:nl], self.body[nl + 1:]
                yield line
                continue
            if not more or self.eof:
                return
            self._fill()
            more = self._unframe()


def chat(port, msgs, n, model):
    """One streamed greedy chat completion of exactly n tokens (ignore_eos, which nxd-http and llama-server
    both take). Returns the send time, the arrival time of every chunk with text, the text, and usage."""
    body = json.dumps({"model": model, "messages": msgs, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    cpu0 = time.thread_time()
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    try:
        t_send = time.perf_counter()
        s.sendall(req)
        st = _Stream(s)
        status, _ = st.head()
        if status != 200:
            raise RuntimeError(f"POST /v1/chat/completions on port {port}: HTTP {status}: {st.raw[:300]!r}")
        times, text, usage, done, t_end = [], [], None, False, None
        for line in st.lines():
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
    finally:
        s.close()
    now = time.perf_counter()
    if not done:
        raise RuntimeError(f"stream on port {port} ended without [DONE]")
    if not usage:
        raise RuntimeError(f"stream on port {port} sent no usage (stream_options.include_usage)")
    return {"t_send": t_send, "times": times, "t_end": t_end or now, "n": usage["completion_tokens"],
            "text": "".join(text), "usage": usage, "t_done": now, "client_cpu_s": time.thread_time() - cpu0}


def socket_chat(conn, msgs, n, rid=1):
    """The same request over nxd's socket (nxd_side.Conn): the times of token events with text."""
    # Read as the HTTP side is (_Stream), off the socket: conn's file has nothing buffered past the
    # hello, and every request ends with its done event.
    if not hasattr(conn, "lean"):
        conn.lean = _Stream(conn.s)
    lines = conn.lean.lines()
    cpu0 = time.thread_time()
    t_send = time.perf_counter()
    conn.send({"id": rid, "op": "generate", "messages": msgs, "max_tokens": n, "temperature": 0,
               "ignore_eos": True, "stream": True})
    times, text = [], []
    while True:
        line = next(lines, None)
        if line is None:
            raise RuntimeError("nxd closed the connection")
        ev = json.loads(line)
        kind = ev.get("event")
        if kind == "token":
            if ev.get("text"):
                times.append(time.perf_counter())
                text.append(ev["text"])
        elif kind == "done":
            now = time.perf_counter()
            return {"t_send": t_send, "times": times, "t_end": now, "n": ev["usage"]["completion_tokens"],
                    "text": "".join(text), "usage": ev.get("usage"), "t_done": now,
                    "client_cpu_s": time.thread_time() - cpu0}
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
