#!/usr/bin/env python3
"""clients.py - decode throughput of nxd: one client alone, then N clients at once (greedy, fixed length).

    bench/clients.py --model PATH [--workers 2] [--tokens 128] [--clients 4] [--build build]
    bench/clients.py --socket PATH ...   (an nxd that is already running)

Starts its own nxd on a temporary socket unless --socket is given. Decode
tok/s counts tokens after the first (the first comes out of prefill) over the
time from the first token to the last."""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are",
           "In 1969, the first", "A good recipe for bread", "The mitochondria is", "To be or not to be"]


def stream(path, prompt, n, rid=1):
    """Returns (token timestamps, tokens) of one greedy generation of exactly n tokens."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    req = {"op": "generate", "id": rid, "prompt": prompt, "raw": True, "temperature": 0, "max_tokens": n,
           "ignore_eos": True}
    s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile("rb")
    stamps, toks = [], []
    t_send = time.perf_counter()
    while True:
        ev = json.loads(f.readline())
        if ev["event"] == "token":
            stamps.append(time.perf_counter())
            toks.append(ev["token"])
        elif ev["event"] == "done":
            break
        else:
            raise SystemExit(f"bench: {ev}")
    s.close()
    return t_send, stamps, toks


def stall(path, n_prompt, n):
    """A decoder runs; a long prompt arrives after its 10th token (chunked prefill at work)."""
    out = {}
    def decoder():
        out["dec"] = stream(path, PROMPTS[1], n, rid="dec")
    t = threading.Thread(target=decoder)
    t.start()
    while True:  # wait for the decoder to be under way
        time.sleep(0.01)
        if status(path)["slots"]["used"] >= 1:
            break
    time.sleep(0.3)
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    req = {"op": "generate", "id": "long", "tokens": [504] * n_prompt, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile("rb")
    while json.loads(f.readline())["event"] != "done":
        pass
    ttft = time.perf_counter() - t0
    s.close()
    t.join()
    stamps = out["dec"][1]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    gaps.sort()
    print(f"stall  : {n_prompt}-token prompt: first token after {ttft * 1e3:.0f} ms; decoder's gaps "
          f"median {gaps[len(gaps) // 2] * 1e3:.0f} ms, longest {gaps[-1] * 1e3:.0f} ms")


def status(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b'{"op":"status","id":0}\n')
    line = s.makefile("rb").readline()
    s.close()
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--socket")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--build", default=os.environ.get("NX_BUILD", "build"))
    ap.add_argument("--nxd-arg", action="append", default=[], help="extra nxd option (repeatable)")
    ap.add_argument("--stall", type=int, default=0, metavar="N",
                    help="also: a prompt of N tokens arrives while a client decodes; report the decoder's "
                         "longest gap between tokens and the prompt's time to first token")
    a = ap.parse_args()

    proc = None
    tmp = None
    path = a.socket
    if not path:
        if not a.model:
            ap.error("--model or --socket is required")
        tmp = tempfile.mkdtemp(prefix="nxd-bench-")
        path = os.path.join(tmp, "nxd.sock")
        log = open(os.path.join(tmp, "nxd.log"), "wb")
        nxd = os.path.join(a.build, "nxd")
        proc = subprocess.Popen([nxd, "--model", a.model, "--socket", path, "--workers", str(a.workers),
                                 "--slots", str(max(4, a.clients)), "--ctx", "1024"] + a.nxd_arg,
                                stdout=log, stderr=log)
        t0 = time.time()
        while True:
            try:
                status(path)
                break
            except OSError:
                if proc.poll() is not None or time.time() - t0 > 60:
                    raise SystemExit(f"bench: nxd did not start; see {tmp}/nxd.log")
                time.sleep(0.05)
    try:
        stream(path, "Warm up", 4)
        _, stamps, toks1 = stream(path, PROMPTS[0], a.tokens)
        single = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        print(f"1 client : {single:7.1f} tok/s decode ({a.tokens} tokens, greedy, {a.workers} workers)")

        res = [None] * a.clients
        def run(i):
            res[i] = stream(path, PROMPTS[i % len(PROMPTS)], a.tokens, rid=i)
        th = [threading.Thread(target=run, args=(i,)) for i in range(a.clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        first = min(r[1][0] for r in res)
        last = max(r[1][-1] for r in res)
        total = sum(len(r[1]) - 1 for r in res)
        per = [(len(r[1]) - 1) / (r[1][-1] - r[1][0]) for r in res]
        print(f"{a.clients} clients: {total / (last - first):7.1f} tok/s decode in total "
              f"(per client {min(per):.1f}..{max(per):.1f} tok/s)")
        if a.stall:
            stall(path, a.stall, a.tokens)
        same = res[0][2] == toks1
        st = status(path)
        print(f"status: sequences per step mean {st['sequences_per_step']['mean']:.2f} max "
              f"{st['sequences_per_step']['max']}; client 0 batched output == alone: {same}")
        return 0 if same else 1
    finally:
        if proc:
            proc.terminate()
            proc.wait(15)


if __name__ == "__main__":
    sys.exit(main())
