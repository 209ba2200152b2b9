"""llama_server.py - llama.cpp's llama-server as the peer for concurrent clients (-np slots, continuous batching).

llama-cpp-python's own server (python -m llama_cpp.server) serializes requests behind a lock, so it has
no parallel sequences; scripts/bench-venv builds llama-server from the same vendored llama.cpp instead.
Requests go to POST /completion with token ids as the prompt, greedy, ignore_eos, streamed as SSE;
token arrival times are taken client-side exactly as for nxd.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Server:
    def __init__(self, binary, model, threads=2, parallel=4, ctx_per_slot=2048, batch=512, ready_timeout=300,
                 extra=()):
        """extra: more llama-server options (its speculation: --spec-type, -md)."""
        self.port = free_port()
        self.log_path = os.path.join(tempfile.mkdtemp(prefix="llama-server-"), "server.log")
        self.log = open(self.log_path, "w")
        self.args = [binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-np", str(parallel),
                     "-c", str(ctx_per_slot * parallel), "-b", str(batch), "-ub", str(batch),
                     "--host", "127.0.0.1", "--port", str(self.port), "--no-warmup", *extra]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # start-to-ready: spawn to the first 200 from /health (503 while loading).
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.tail()}")
                if time.perf_counter() - t0 > ready_timeout:
                    raise RuntimeError(f"llama-server not ready after {ready_timeout} s")
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                    c.request("GET", "/health")
                    r = c.getresponse()
                    r.read()
                    c.close()
                    if r.status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - t0

    def tail(self, n=15):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def pss(self):
        return {self.proc.pid: pss_kib(self.proc.pid)}

    def generate(self, tokens, n_predict, cache_prompt=False, on_first=None, ignore_eos=True):
        """Streamed greedy completion; returns token arrival times and the final event's timings.
        cache_prompt: let the server reuse a slot's KV cache for a shared prefix (the chat case);
        on_first: called when the first token arrives; ignore_eos False: stop at the model's end of
        generation, as a chat does."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        body = json.dumps({"prompt": list(tokens), "n_predict": n_predict, "temperature": 0, "top_k": 1,
                           "ignore_eos": ignore_eos, "cache_prompt": cache_prompt, "stream": True, "return_tokens": True})
        t_send = time.perf_counter()
        c.request("POST", "/completion", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"llama-server /completion: HTTP {r.status}: {r.read()[:300]!r}")
        times, ids, final = [], [], None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            ev = json.loads(line[6:])
            toks = ev.get("tokens") or []
            if toks:
                now = time.perf_counter()
                first = not times
                for t in toks:
                    times.append(now)
                    ids.append(t)
                if on_first and first:
                    on_first()
            if ev.get("stop"):
                final = ev
                break
        c.close()
        return {"t_send": t_send, "times": times, "ids": ids, "done": final or {}, "t_done": time.perf_counter()}

    def concurrent(self, prompts, n_predict):
        out = [None] * len(prompts)
        errs = []
        barrier = threading.Barrier(len(prompts))

        def run(i):
            try:
                barrier.wait()
                out[i] = self.generate(prompts[i], n_predict)
            except Exception as e:
                errs.append(e)

        th = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        if errs:
            raise errs[0]
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
