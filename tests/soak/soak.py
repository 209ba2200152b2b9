#!/usr/bin/env python3
"""soak.py - load and soak test of nxd (docs/reliability.md 15, 16): many clients on the Unix socket,
mixed requests, for a bounded time; then checks that nothing leaked and that a stalled reader does not slow
the others down.

    tests/soak/soak.py --model PATH [--build build] [--seconds 600] [--clients 40] [--slots 4] [--json OUT]

Starts its own nxd on a temporary socket. The clients (asyncio, one task each) loop over request kinds:

  short      generate, 1-8 tokens                         -> done
  long       generate, 24-96 tokens                       -> done
  nonstream  generate, 16-64 tokens, stream false         -> done
  cancel     generate, cancel after a few tokens          -> ok, then done (cancelled)
  abandon    generate, hang up after a few tokens         -> (the client is gone; its slot must be freed)
  slow       generate, read a few bytes every 50 ms       -> done
  malformed  bad JSON, unknown op, bad fields, huge line  -> an error with the expected code, connection lives
  dribble    half a line, then nothing                    -> error (line not finished), then closed
  silent     connect, send nothing                        -> closed after --idle-timeout
  info       status, tokenize, detokenize                 -> their event
  churn      connect and close at once

Every request must end the way its kind says (a done, or an error with a stable code). Before the load, at
the end of a warm-up and at the end, it reads the supervisor's and the workers' memory (RssAnon, VmRSS) and
the supervisor's open fds from /proc. Then, alone: a normal client's decode speed by itself, beside a client
that reads its stream and beside one that never reads. Exit status 0 when every check holds; the report lists what failed."""
import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are",
           "In 1969, the first", "A good recipe for bread", "The mitochondria is", "To be or not to be"]

KINDS = {  # kind: weight
    "short": 20, "long": 8, "nonstream": 6, "cancel": 8, "abandon": 6, "slow": 4, "malformed": 10,
    "dribble": 2, "silent": 2, "info": 10, "churn": 4,
}

# Malformed lines and the code each must get (docs/reliability.md 13, 14).
MALFORMED = [
    (b"{not json}\n", "parse_error"),
    (b"[1,2]\n", "parse_error"),
    (b'{"op":"frobnicate","id":1}\n', "unknown_op"),
    (b'{"op":"generate","id":1}\n', "bad_request"),
    (b'{"op":"generate","id":1,"prompt":7}\n', "bad_request"),
    (b'{"op":"generate","id":1,"prompt":"x","max_tokens":0}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"prompt":"x","temperature":-1}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"tokens":[1,99999999]}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"tokens":[-5]}\n', "out_of_range"),
    (b'{"op":"detokenize","id":1,"tokens":[99999999]}\n', "out_of_range"),
    (b'{"op":"cancel","id":1,"target":"nope"}\n', "not_found"),
    (b'{"op":"hello","version":99}\n', "unsupported_version"),
    (b'{"op":"generate","id":1,"prompt":"\xff\xfe"}\n', "parse_error"),
]

REQ_TIMEOUT = 180.0  # s: a request not ended by then is a hang
DRAIN = 10.0         # s: after the end, time given to the requests in flight


# ---------------------------------------------------------------- /proc

def proc_mem(pid):
    """(RssAnon, VmRSS) in KiB, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            kv = dict(line.split(":", 1) for line in f if ":" in line)
        return int(kv["RssAnon"].split()[0]), int(kv["VmRSS"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


def proc_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# ---------------------------------------------------------------- a small async client

class Conn:
    def __init__(self, reader, writer):
        self.r, self.w = reader, writer

    @classmethod
    async def open(cls, path, rcvbuf=None):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.setblocking(False)
        await asyncio.get_running_loop().sock_connect(s, path)
        r, w = await asyncio.open_unix_connection(sock=s, limit=1 << 24)
        return cls(r, w)

    async def send(self, obj):
        self.w.write(obj if isinstance(obj, bytes) else (json.dumps(obj) + "\n").encode())
        await self.w.drain()

    async def recv(self):
        line = await self.r.readline()
        return json.loads(line) if line else None

    async def until_end(self, rid):
        """Events of rid up to its done/error; returns (n_tokens, final event or None at EOF)."""
        n = 0
        while True:
            ev = await self.recv()
            if ev is None:
                return n, None
            if ev.get("id") != rid:
                continue
            if ev["event"] == "token":
                n += 1
            elif ev["event"] in ("done", "error"):
                return n, ev

    def close(self):
        try:
            self.w.close()
        except Exception:
            pass


# ---------------------------------------------------------------- the load

class Soak:
    def __init__(self, sock, seconds, clients, seed, idle_timeout):
        self.sock, self.seconds, self.n_clients = sock, seconds, clients
        self.rng = random.Random(seed)
        self.idle_timeout = idle_timeout
        self.kinds = Counter()      # requests started, by kind
        self.outcomes = Counter()   # "kind: outcome"
        self.errors = Counter()     # error code -> count
        self.failures = []          # unexpected outcomes, with detail
        self.tokens = 0

    def fail(self, kind, what):
        if len(self.failures) < 50:
            self.failures.append(f"{kind}: {what}")
        self.outcomes[f"{kind}: UNEXPECTED"] += 1

    def gen_req(self, rid, n, **kw):
        req = {"op": "generate", "id": rid, "prompt": self.rng.choice(PROMPTS), "max_tokens": n}
        if self.rng.random() < 0.5:
            req.update(raw=True, temperature=0)
        else:
            req.update(temperature=0.8, top_p=0.9, seed=self.rng.randrange(1 << 30))
        req.update(kw)
        return req

    def ended(self, kind, ev, want=("done",)):
        if ev is None:
            self.fail(kind, "connection closed before the request ended")
            return
        if ev["event"] == "error":
            self.errors[ev["code"]] += 1
            if ev["code"] == "busy" or ("error" in want):
                self.outcomes[f"{kind}: error {ev['code']}"] += 1
            else:
                self.fail(kind, f"error {ev['code']}: {ev.get('message')}")
            return
        if ev["event"] not in want:
            self.fail(kind, f"ended with {ev}")
            return
        reason = ev.get("reason", "")
        self.outcomes[f"{kind}: {ev['event']} {reason}".rstrip()] += 1
        self.tokens += ev.get("usage", {}).get("completion_tokens", 0)

    async def one(self, kind, rid):
        rng = self.rng
        if kind == "churn":
            c = await Conn.open(self.sock)
            c.close()
            self.outcomes["churn: closed"] += 1
            return
        c = await Conn.open(self.sock, rcvbuf=4096 if kind == "slow" else None)
        try:
            if kind in ("short", "long", "nonstream"):
                n = rng.randint(1, 8) if kind == "short" else rng.randint(24, 96) if kind == "long" else \
                    rng.randint(16, 64)
                extra = {"stream": False} if kind == "nonstream" else {}
                if kind == "long":
                    extra["ignore_eos"] = True
                await c.send(self.gen_req(rid, n, **extra))
                _, ev = await c.until_end(rid)
                self.ended(kind, ev)
            elif kind == "cancel":
                await c.send(self.gen_req(rid, 200, ignore_eos=True))
                k = rng.randint(1, 6)
                n = 0
                ev = None
                while n < k:
                    ev = await c.recv()
                    if ev is None or ev["event"] != "token":
                        break
                    n += 1
                if ev is not None and ev["event"] == "token":
                    await c.send({"op": "cancel", "id": f"c{rid}", "target": rid})
                    ok = done = None
                    while ok is None or done is None:
                        ev = await c.recv()
                        if ev is None:
                            break
                        if ev.get("id") == f"c{rid}":
                            ok = ev
                        elif ev["event"] in ("done", "error"):
                            done = ev
                    if ok is None or ok["event"] not in ("ok", "error"):
                        self.fail(kind, f"cancel answered {ok}")
                    elif ok["event"] == "error" and ok["code"] != "not_found":
                        self.fail(kind, f"cancel answered {ok}")
                    self.ended(kind, done)
                else:
                    self.ended(kind, ev)
            elif kind == "abandon":
                await c.send(self.gen_req(rid, 200, ignore_eos=True, stream=rng.random() < 0.8))
                await asyncio.sleep(rng.uniform(0, 0.5))
                self.outcomes["abandon: hung up"] += 1
            elif kind == "slow":
                await c.send(self.gen_req(rid, rng.randint(16, 48), ignore_eos=True))
                buf, ev = b"", None
                while ev is None:
                    chunk = await c.r.read(256)
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        e = json.loads(line)
                        if e.get("id") == rid and e["event"] in ("done", "error"):
                            ev = e
                    await asyncio.sleep(0.05)
                self.ended(kind, ev)
            elif kind == "malformed":
                line, code = rng.choice(MALFORMED)
                if rng.random() < 0.15:
                    line, code = b'{"op":"tokenize","id":1,"text":"' + b"a" * 9000 + b'"}\n', "too_large"
                await c.send(line)
                ev = await c.recv()
                if ev is None or ev.get("event") != "error" or ev.get("code") != code:
                    self.fail(kind, f"{line[:60]!r} answered {ev}, wanted {code}")
                else:
                    self.errors[code] += 1
                    # The connection lives on.
                    await c.send({"op": "status", "id": "after"})
                    ev = await c.recv()
                    if ev is None or ev.get("event") != "status":
                        self.fail(kind, f"status after a malformed line answered {ev}")
                    else:
                        self.outcomes[f"malformed: error {code}"] += 1
            elif kind == "dribble":
                await c.send(b'{"op":"status","id":')
                ev = await c.recv()
                if ev is None or ev.get("code") != "bad_request" or "not finished" not in ev.get("message", ""):
                    self.fail(kind, f"half a line answered {ev}")
                elif await c.recv() is not None:
                    self.fail(kind, "connection not closed after the line timeout")
                else:
                    self.errors["bad_request"] += 1
                    self.outcomes["dribble: error bad_request, closed"] += 1
            elif kind == "silent":
                t0 = time.monotonic()
                ev = await c.recv()
                dt = time.monotonic() - t0
                if ev is not None or dt < self.idle_timeout * 0.8:
                    self.fail(kind, f"silent client got {ev} after {dt:.1f} s")
                else:
                    self.outcomes["silent: closed (idle)"] += 1
            elif kind == "info":
                op = rng.choice(["status", "tokenize", "detokenize"])
                req = {"op": op, "id": rid}
                if op == "tokenize":
                    req["text"] = rng.choice(PROMPTS)
                elif op == "detokenize":
                    req["tokens"] = [rng.randrange(49152) for _ in range(rng.randint(1, 20))]
                await c.send(req)
                ev = await c.recv()
                want = {"status": "status", "tokenize": "tokens", "detokenize": "text"}[op]
                if ev is None or ev.get("event") != want:
                    self.fail(kind, f"{op} answered {ev}")
                else:
                    self.outcomes[f"info: {want}"] += 1
        finally:
            c.close()

    async def client(self, idx, deadline):
        rid = 0
        kinds, weights = zip(*KINDS.items())
        while time.monotonic() < deadline:
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "silent" and deadline - time.monotonic() < self.idle_timeout * 2:
                continue
            rid += 1
            self.kinds[kind] += 1
            try:
                await asyncio.wait_for(self.one(kind, f"{idx}.{rid}"), REQ_TIMEOUT)
            except asyncio.CancelledError:
                # The run is over and this one was still queued or running: hung up on (its
                # connection is closed in one()'s finally), like an abandoned request.
                self.outcomes[f"{kind}: cut at the end"] += 1
                raise
            except asyncio.TimeoutError:
                self.fail(kind, f"no end within {REQ_TIMEOUT:.0f} s (a hang)")
            except (ConnectionError, OSError) as e:
                self.fail(kind, f"{type(e).__name__}: {e}")
            except json.JSONDecodeError as e:
                self.fail(kind, f"not JSON: {e}")
            await asyncio.sleep(self.rng.uniform(0, 0.2))

    async def run(self, on_warm):
        deadline = time.monotonic() + self.seconds
        tasks = [asyncio.create_task(self.client(i, deadline)) for i in range(self.n_clients)]
        warm_at = min(max(10.0, self.seconds * 0.25), self.seconds * 0.6)
        await asyncio.sleep(warm_at)
        on_warm()
        # 40 clients on 4 slots keep the queue full: what is still waiting DRAIN s after the end
        # is hung up on, so the run ends in bounded time.
        done, pending = await asyncio.wait(tasks, timeout=deadline + DRAIN - time.monotonic())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            t.result()


# ---------------------------------------------------------------- speed with and without a stalled reader

def status(sock):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock)
    s.sendall(b'{"op":"status","id":"st"}\n')
    f = s.makefile("rb")
    ev = json.loads(f.readline())
    s.close()
    return ev


def decode_speed(sock, n=40):
    """Decode tok/s of one greedy client: tokens after the first over the time from first to last."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(120)
    s.connect(sock)
    req = {"op": "generate", "id": 1, "prompt": "Once upon a time", "raw": True, "temperature": 0,
           "max_tokens": n, "ignore_eos": True}
    s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile("rb")
    stamps = []
    while True:
        ev = json.loads(f.readline())
        if ev["event"] == "token":
            stamps.append(time.perf_counter())
        else:
            break
    s.close()
    if ev["event"] != "done" or len(stamps) < 2:
        raise RuntimeError(f"speed probe ended with {ev}")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def competitor(sock, read):
    """A second client in the batch: the same long request with 5 alternatives a token (~600-byte events),
    read as it comes (read=True) or never read at all (its socket buffer fills in a few tokens; then it sits
    in its slot until its unread output passes --out-limit, ~400 tokens later)."""
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(sock)
    s.sendall((json.dumps({"op": "generate", "id": "other", "prompt": "List words:", "raw": True,
                           "max_tokens": 480, "ignore_eos": True, "logprobs": 5, "temperature": 0})
               + "\n").encode())
    if read:
        def drain():
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
        threading.Thread(target=drain, daemon=True).start()
    return s


def speed_beside(sock, read):
    """Best of two decode speeds of a normal client while a competitor runs; and whether the competitor
    was still in its slot at the end (else the speed was not measured beside it)."""
    s = competitor(sock, read)
    try:
        # Long enough for it to be in the batch (and a stalled one's socket full: a few tokens), short
        # against its life: 480 tokens, or --out-limit's ~400 unread, are about a second on a fast host.
        time.sleep(0.25)
        speed = max(decode_speed(sock) for _ in range(2))
        still = status(sock)["slots"]["used"] == 1
    finally:
        s.close()
    wait_until_idle(sock)
    return speed, still


def stall_probe(sock):
    """tok/s of a normal client: alone, beside a client that reads its stream, beside one that never reads.
    The kernels' cost grows with the tokens in a step, so any second sequence slows the first; the stall
    must not cost more than that: the fair comparison is reading vs stalled competitor."""
    alone = max(decode_speed(sock) for _ in range(2))
    reading, still_r = speed_beside(sock, True)
    stalled, still_s = speed_beside(sock, False)
    return alone, reading, stalled, still_r and still_s


# ---------------------------------------------------------------- the run

def snapshot(sock, sup_pid):
    st = status(sock)
    workers = [w["pid"] for w in st["workers"]]
    return {
        "supervisor": proc_mem(sup_pid), "supervisor_fds": proc_fds(sup_pid),
        "workers": {p: proc_mem(p) for p in workers},
        "slots": st["slots"], "conns_time": time.time(),
    }


def run(nxd, model, seconds=60.0, clients=40, slots=4, workers=2, seed=None, log_dir=None, env=None,
        extra_args=()):
    """Starts nxd, runs the soak and the stall probe, stops nxd; returns the report dict."""
    seed = seed if seed is not None else int(time.time()) % 100000
    tmp = Path(tempfile.mkdtemp(prefix="nxd-soak-", dir=log_dir))
    sock = str(tmp / "nxd.sock")
    log_path = tmp / "nxd.log"
    idle_timeout = 5.0
    argv = [str(nxd), "--model", str(model), "--socket", sock, "--workers", str(workers), "--ctx", "512",
            "--slots", str(slots), "--max-clients", "128", "--max-queue", "64", "--max-line", "8192",
            "--out-limit", "262144", "--idle-timeout", str(idle_timeout), "--line-timeout", "3"] + list(extra_args)
    penv = dict(os.environ)
    for k in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID"):
        penv.pop(k, None)
    penv.update(env or {})
    logf = open(log_path, "wb")
    proc = subprocess.Popen(argv, stdout=logf, stderr=logf, env=penv)
    report = {"seed": seed, "seconds": seconds, "clients": clients, "slots": slots, "log": str(log_path),
              "failures": []}
    try:
        t0 = time.time()
        while "ready:" not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.time() - t0 > 120:
                raise RuntimeError(f"nxd did not start:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.05)
        sup = proc.pid
        # Warm the model's pages and the allocator before the baseline.
        decode_speed(sock, 16)
        base = snapshot(sock, sup)
        soak = Soak(sock, seconds, clients, seed, idle_timeout)
        warm = {}
        t_start = time.monotonic()
        asyncio.run(soak.run(lambda: warm.update(snapshot(sock, sup))))
        elapsed = time.monotonic() - t_start
        time.sleep(1.0)  # the daemon frees what the last clients held
        end = snapshot(sock, sup)
        if proc.poll() is not None:
            report["failures"].append(f"nxd exited with {proc.returncode} during the soak")
        report.update(requests=dict(soak.kinds), outcomes=dict(sorted(soak.outcomes.items())),
                      errors=dict(soak.errors), completion_tokens=soak.tokens, elapsed=elapsed,
                      mem={"baseline": base, "warm": warm, "end": end})
        report["failures"] += soak.failures
        report["failures"] += check_leaks(base, warm, end)
        alone, reading, stalled, still = stall_probe(sock)
        report["speed"] = {"alone_tok_s": alone, "beside_reader_tok_s": reading, "beside_stalled_tok_s": stalled,
                           "ratio": stalled / reading, "ratio_to_alone": stalled / alone}
        if not still:
            report["failures"].append("the competitor was gone before the speed beside it was measured")
        if stalled < 0.5 * reading:
            report["failures"].append(f"beside a stalled reader a normal client made {stalled:.1f} tok/s, beside a "
                                      f"reading one {reading:.1f} (< 0.5x)")
        wait_until_idle(sock)
        log = log_path.read_text(errors="replace")
        for bad in ("control block inconsistent", "step watchdog", "killed by", "AddressSanitizer",
                    "runtime error:"):
            if bad in log:
                report["failures"].append(f"the daemon's log says '{bad}'")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        if rc != 0:
            report["failures"].append(f"nxd exited with {rc} after SIGTERM")
        log = log_path.read_text(errors="replace")
        if "ERROR: AddressSanitizer" in log or "ERROR: LeakSanitizer" in log or "runtime error:" in log:
            report["failures"].append("sanitizer report in the daemon's log")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        logf.close()
    return report


def wait_until_idle(sock, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if status(sock)["slots"]["used"] == 0:
            return
        time.sleep(0.2)


# Leak bounds: after the warm-up, anonymous memory may still grow a little (allocator
# high-water marks, a first long prompt...), not by the run's length.
SUP_GROWTH_KIB = 8 * 1024
WORKER_GROWTH_KIB = 2 * 1024
FD_SLACK = 2


def check_leaks(base, warm, end):
    out = []
    if end["slots"]["used"] != 0 or end["slots"]["queued"] != 0:
        out.append(f"slots not back to 0 at the end: {end['slots']}")
    if end["supervisor_fds"] is None or end["supervisor_fds"] > base["supervisor_fds"] + FD_SLACK:
        out.append(f"supervisor fds: {base['supervisor_fds']} before the load, {end['supervisor_fds']} after")
    sw, se = warm["supervisor"][0], end["supervisor"][0]
    if se - sw > max(SUP_GROWTH_KIB, sw // 10):
        out.append(f"supervisor RssAnon grew {se - sw} KiB after the warm-up ({sw} -> {se} KiB)")
    for pid, m in end["workers"].items():
        w = warm["workers"].get(pid)
        if w is None or m is None:
            out.append(f"worker {pid} was replaced or vanished during the soak")
            continue
        if m[0] - w[0] > WORKER_GROWTH_KIB:
            out.append(f"worker {pid} RssAnon grew {m[0] - w[0]} KiB after the warm-up ({w[0]} -> {m[0]} KiB)")
    return out


def print_report(r, f=sys.stdout):
    p = lambda *a: print(*a, file=f)
    p(f"soak: {r['seconds']:.0f} s, {r['clients']} clients, {r['slots']} slots, seed {r['seed']}")
    p("requests by kind:")
    for k, v in sorted(r.get("requests", {}).items()):
        p(f"  {k:10s} {v}")
    p("outcomes:")
    for k, v in r.get("outcomes", {}).items():
        p(f"  {k:40s} {v}")
    p("errors by code:")
    for k, v in sorted(r.get("errors", {}).items()):
        p(f"  {k:20s} {v}")
    m = r.get("mem")
    if m:
        def mem(s):
            sup = s["supervisor"]
            ws = ", ".join(f"{pid}: {v[0] / 1024:.1f}/{v[1] / 1024:.1f}" for pid, v in s["workers"].items() if v)
            return (f"supervisor RssAnon/VmRSS {sup[0] / 1024:.1f}/{sup[1] / 1024:.1f} MiB, fds {s['supervisor_fds']};"
                    f" workers (MiB) {ws}; slots {s['slots']}")
        p(f"start:   {mem(m['baseline'])}")
        if m["warm"]:
            p(f"warm:    {mem(m['warm'])}")
        p(f"end:     {mem(m['end'])}")
    if "completion_tokens" in r:
        p(f"completion tokens: {r['completion_tokens']} in {r['elapsed']:.0f} s")
    s = r.get("speed")
    if s:
        p(f"decode speed of a normal client: alone {s['alone_tok_s']:.1f} tok/s, beside a reading client "
          f"{s['beside_reader_tok_s']:.1f}, beside a stalled reader {s['beside_stalled_tok_s']:.1f} "
          f"({s['ratio']:.2f}x of beside a reader, {s['ratio_to_alone']:.2f}x of alone)")
    p(f"daemon log: {r['log']}")
    if r["failures"]:
        p(f"FAILED ({len(r['failures'])}):")
        for x in r["failures"]:
            p(f"  {x}")
    else:
        p("soak: all checks passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("NX_BUILD", "build"))
    ap.add_argument("--model", default=os.environ.get("NXD_MODEL"))
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--json", help="write the report as JSON here too")
    a = ap.parse_args()
    if not a.model:
        ap.error("--model (or NXD_MODEL) is required")
    build = Path(a.build) if Path(a.build).is_absolute() else ROOT / a.build
    r = run(build / "nxd", a.model, a.seconds, a.clients, a.slots, a.workers, a.seed)
    if not r["failures"]:
        # Nothing to look into: the temporary socket directory and the log go.
        shutil.rmtree(Path(r["log"]).parent, ignore_errors=True)
        r["log"] += " (removed: every check passed)"
    print_report(r)
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1, default=str))
    sys.exit(1 if r["failures"] else 0)


if __name__ == "__main__":
    main()
