"""test_daemon.py - the real nxd end to end: requests, bad requests, slow and vanishing clients, batching, worker deaths, signals, sockets."""
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time

import pytest

from conftest import build_dir
from nxd_helpers import Client, Daemon, DaemonError, pid_alive, wait_until

# Small limits so the limit paths run in seconds.
MAX_LINE = 8192
MAX_CLIENTS = 12
OUT_LIMIT = 16384
SLOTS = 4
MAX_QUEUE = 2
FIXTURE_ARGS = ["--ctx", "512", "--slots", str(SLOTS), "--batch", "64", "--max-queue", str(MAX_QUEUE),
                "--max-clients", str(MAX_CLIENTS), "--max-line", str(MAX_LINE), "--out-limit", str(OUT_LIMIT),
                "--line-timeout", "3", "--log-level", "debug"]

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colors are"]
GREEDY = dict(raw=True, temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def nxd_bin():
    p = build_dir() / "nxd"
    if not p.is_file():
        pytest.fail(f"{p} is missing: build it with `make B={build_dir().name}`")
    return p


@pytest.fixture(scope="module")
def daemon(model_path, nxd_bin, tmp_path_factory):
    d = Daemon(model_path, tmp_path_factory.mktemp("nxd"), workers=2, args=FIXTURE_ARGS)
    with d:
        yield d


@pytest.fixture(scope="module")
def reference(daemon):
    """Greedy output of each prompt, generated alone (one client, nothing else running)."""
    ref = {}
    with Client(daemon.sock) as c:
        for i, p in enumerate(PROMPTS):
            toks, text, done = c.generate(rid=i, prompt=p, **GREEDY)
            assert done["event"] == "done" and done["reason"] == "length", done
            assert len(toks) == GREEDY["max_tokens"]
            ref[p] = (toks, text)
    return ref


# ---------------------------------------------------------------- command line

def test_cli(nxd_bin, model_path, tmp_path):
    r = subprocess.run([nxd_bin, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--model" in r.stdout and "--mmap" in r.stdout
    r = subprocess.run([nxd_bin, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("nxd ")
    for argv, msg in [([], "--model PATH is required"),
                      (["--model", str(model_path), "--workers", "0"], "--workers must be"),
                      (["--model", str(model_path), "--workers", "x"], "--workers must be"),
                      (["--model", str(model_path), "--slots", "8", "--batch", "4"], "--batch (4) must be at least"),
                      (["--model", str(model_path), "--log-level", "loud"], "--log-level"),
                      (["--model", str(model_path), "--activations", "loose"],
                       "--activations: 'loose' is neither precise nor fast"),
                      (["--model", str(model_path), "--frobnicate"], "unknown option"),
                      (["--model", str(model_path), "extra"], "unexpected argument")]:
        r = subprocess.run([nxd_bin] + argv, capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, (argv, r.stderr)
        assert msg in r.stderr, (argv, r.stderr)
    # Not a model / not a regular file: exit 1 with the reason, socket not left behind.
    sock = tmp_path / "x.sock"
    for path, msg in [(tmp_path / "absent.gguf", "cannot open"), ("/dev/null", "not a regular file"),
                      ("/proc/self/status", "/proc"), (__file__, "gguf")]:
        r = subprocess.run([nxd_bin, "--model", str(path), "--socket", str(sock)], capture_output=True,
                           text=True, timeout=20)
        assert r.returncode == 1, (path, r.stderr)
        assert msg in r.stderr, (path, r.stderr)
        assert "listening" not in r.stderr, r.stderr  # said only once the model is loaded and workers ready
        assert not sock.exists()


def test_short_options_and_workers_warning(nxd_bin, model_path, tmp_path):
    """-m, -s, -w, -h, -V as users expect; --workers past the CPUs nxd may use is warned about at
    start; "listening" is logged once, in the ready line."""
    for flag, want in (("-h", "usage: nxd"), ("-V", "nxd ")):
        r = subprocess.run([nxd_bin, flag], capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and r.stdout.startswith(want), (flag, r.stdout, r.stderr)
    r = subprocess.run([nxd_bin, "-m"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "option -m needs a value" in r.stderr, r.stderr
    sock = tmp_path / "short.sock"
    log = tmp_path / "short.log"
    with open(log, "wb") as f:
        p = subprocess.Popen(["taskset", "-c", "0", str(nxd_bin), "-m", str(model_path), "-s", str(sock), "-w", "2",
                              "--ctx", "256"], stdout=f, stderr=f)
    try:
        wait_until(lambda: "ready:" in log.read_text() or p.poll() is not None, timeout=60, what="ready")
        text = log.read_text()
        assert p.poll() is None, text
        assert "--workers 2 is more than the 1 CPU nxd may run on" in text, text
        assert text.count("listening") == 1 and f"ready: listening on {sock}, 2 workers" in text, text
        with Client(str(sock)) as c:
            assert c.request({"op": "hello", "version": 1})["event"] == "hello"
    finally:
        p.terminate()
        p.wait(15)
    # one worker per CPU by default: no warning
    with open(log, "wb") as f:
        p = subprocess.Popen(["taskset", "-c", "0", str(nxd_bin), "-m", str(model_path), "-s", str(sock),
                              "--ctx", "256"], stdout=f, stderr=f)
    try:
        wait_until(lambda: "ready:" in log.read_text() or p.poll() is not None, timeout=60, what="ready")
        text = log.read_text()
        assert "ready: listening on" in text and ", 1 workers" in text and "more than" not in text, text
    finally:
        p.terminate()
        p.wait(15)


# ---------------------------------------------------------------- requests

def test_hello_status_socket_mode(daemon):
    assert stat.S_IMODE(os.stat(daemon.sock).st_mode) == 0o660
    with Client(daemon.sock) as c:
        h = c.request({"op": "hello", "version": 1})
        assert h["event"] == "hello" and h["version"] == 1 and h["n_ctx"] == 512 and h["n_vocab"] == 49152
        st = c.request({"op": "status", "id": 7})
        assert st["id"] == 7 and st["event"] == "status" and st["activations"] == "precise"
        assert set(st["kernels"]) == {"dot", "norm", "pack", "pack_act", "attn", "lora"}, st["kernels"]
        assert all(v in ("ref", "avx2", "avx512", "amx") for v in st["kernels"].values()), st["kernels"]
        assert st["slots"] == {"total": SLOTS, "used": 0, "queued": 0}
        assert len(st["workers"]) == 2
        assert {w["cpu"] for w in st["workers"]} == {0, 1} or os.cpu_count() < 2
        for w in st["workers"]:
            assert pid_alive(w["pid"]) and w["state"] in ("idle", "busy")
    # SO_PEERCRED is read at accept (debug log names the peer).
    assert f"(pid {os.getpid()}, uid {os.getuid()})" in daemon.log()


def test_logprobs_not_streamed_are_the_streamed_ones(daemon):
    """stream false with logprobs: the done event holds, per token, what its token event would have carried
    (they used to be dropped in silence), greedy and seeded alike."""
    for sampling in (dict(temperature=0), dict(temperature=0.9, seed=7)):
        req = dict(op="generate", prompt=PROMPTS[0], raw=True, max_tokens=12, ignore_eos=True, logprobs=3, **sampling)
        with Client(daemon.sock) as c:
            toks, lps, _ = c.generate_logprobs("s", req)
            c.send(dict(req, id="n", stream=False))
            done = next(e for e in c.events("n") if e["event"] in ("done", "error"))
        assert done["event"] == "done" and done["tokens"] == toks, done
        got = [(e["logprob"], [(a["token"], a["logprob"]) for a in e["logprobs"]]) for e in done["logprobs"]]
        assert [e["token"] for e in done["logprobs"]] == toks and got == lps, (got, lps)


def test_status_rates_are_recent(daemon):
    """tokens_per_s and sequences_per_step are those of the last 10 s of wall time: an idle daemon's fall
    to 0 (they used to stay at the last busy steps' rate for ever)."""
    with Client(daemon.sock) as c:
        c.generate(rid="r", prompt=PROMPTS[0], **GREEDY)
        st = c.request({"op": "status", "id": "s"})
        assert st["tokens_per_s"] > 0 and st["sequences_per_step"]["mean"] >= 1, st
        time.sleep(10.5)
        st = c.request({"op": "status", "id": "s2"})
        assert st["tokens_per_s"] == 0 and st["sequences_per_step"] == {"mean": 0, "max": 0}, st


def test_generate_stream_and_not(daemon, reference):
    p = PROMPTS[0]
    with Client(daemon.sock) as c:
        toks, text, done = c.generate(rid="s", prompt=p, **GREEDY)
        assert (toks, text) == reference[p]
        u = done["usage"]
        assert (u["prompt_tokens"], u["completion_tokens"]) == (5, 12) and 0 <= u["cached_tokens"] <= 4, u
        t = done["timing"]  # the 11 tokens after the first (which came from the prefill) over the decode time
        assert t["tokens_per_s"] == pytest.approx(11 / (t["decode_ms"] / 1e3), rel=1e-3), t
        _, _, one = c.generate(rid="1", prompt=p, **dict(GREEDY, max_tokens=1))
        assert one["timing"]["tokens_per_s"] is None, one  # one token: no decode to take a rate of
        toks2, text2, done2 = c.generate(rid="n", prompt=p, stream=False, **GREEDY)
        assert done2["event"] == "done" and done2["reason"] == "length"
        assert (toks2, text2) == reference[p]
    assert "Paris" in text
    # A client that sends its request and half-closes still gets every answer.
    with Client(daemon.sock) as c:
        c.send({"op": "generate", "id": "h", "prompt": p, **GREEDY})
        c.s.shutdown(socket.SHUT_WR)
        evs = list(c.events("h"))
        assert [e["token"] for e in evs[:-1]] == reference[p][0] and evs[-1]["event"] == "done"
        assert c.recv() is None  # closed once everything was sent


def test_generate_eos_and_stop(daemon):
    with Client(daemon.sock) as c:
        # A chat answer ends on its own (end-of-turn token) well before 200 tokens.
        toks, text, done = c.generate(rid=1, prompt="Say hello.", temperature=0, max_tokens=200)
        assert done["reason"] == "eos", done
        assert "<|im_end|>" not in text
        # The end-of-turn token is not part of the answer: no event, not counted.
        assert len(toks) == done["usage"]["completion_tokens"] and 2 not in toks
        toks2, text2, done2 = c.generate(rid=3, prompt="Say hello.", temperature=0, max_tokens=200, stream=False)
        assert (toks2, text2, done2["reason"]) == (toks, text, "eos")
        # A stop string cuts the text before it and ends the stream.
        toks, text, done = c.generate(rid=2, prompt="The capital of France is", raw=True, temperature=0,
                                      max_tokens=20, stop=["."])
        assert done["reason"] == "stop" and text == " Paris", (text, done)


def test_chat_messages(daemon):
    with Client(daemon.sock) as c:
        msgs = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2?"}]
        toks, text, done = c.generate(rid="chat", messages=msgs, temperature=0, max_tokens=16, stream=False)
        assert done["event"] == "done"
        assert done["usage"]["prompt_tokens"] > 10
        assert len(toks) == done["usage"]["completion_tokens"] >= 1
        bad = c.request({"op": "generate", "id": "b", "messages": [{"role": "robot", "content": "x"}]})
        assert bad["event"] == "error" and bad["id"] == "b"


def test_done_seed_reproduces_and_chosen_logprob(daemon):
    """done reports the seed a sampled answer used: sent back, it gives the same answer. With
    logprobs, every token event carries the drawn token's own logprob, also when a hot draw took
    it from outside the top N listed."""
    hot = dict(prompt="Write a word.", temperature=3.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24, ignore_eos=True)
    with Client(daemon.sock) as c:
        toks, text, done = c.generate(rid=1, **hot)
        seed = done["seed"]
        assert isinstance(seed, int) and 0 <= seed < 2 ** 63, done
        again, _, done2 = c.generate(rid=2, seed=seed, **hot)
        assert again == toks and done2["seed"] == seed
        _, _, other = c.generate(rid=3, **hot)
        assert other["seed"] != seed  # a fresh seed per request
        c.send(dict(op="generate", id=4, logprobs=1, **hot))
        evs = [e for e in c.events(4) if e["event"] == "token"]
    outside = 0
    for e in evs:
        lp = e["logprobs"]
        assert len(lp) == 1 and isinstance(e["logprob"], float), e
        if lp[0]["token"] != e["token"]:
            outside += 1
            assert e["logprob"] <= lp[0]["logprob"], e
        else:
            assert e["logprob"] == lp[0]["logprob"], e
    assert outside > 0  # at temperature 3 over 24 tokens the draw leaves the top 1


def test_tokenize_roundtrip(daemon):
    text = "Hello, world! Ünïcödé 😀 and\tspaces  "
    with Client(daemon.sock) as c:
        t = c.request({"op": "tokenize", "id": 1, "text": text})
        assert t["event"] == "tokens" and len(t["tokens"]) > 5
        back = c.request({"op": "detokenize", "id": 2, "tokens": t["tokens"]})
        assert back["event"] == "text" and back["text"] == text
        t = c.request({"op": "tokenize", "id": 3, "text": "<|im_start|>user", "special": True})
        assert t["tokens"][0] == 1  # <|im_start|> is one special token
        # and back: control tokens as their text (as docs/protocol.md's example), or dropped with special false
        back = c.request({"op": "detokenize", "id": 4, "tokens": t["tokens"]})
        assert back["text"] == "<|im_start|>user", back
        back = c.request({"op": "detokenize", "id": 5, "tokens": t["tokens"], "special": False})
        assert back["text"] == "user", back


def test_cancel(daemon):
    with Client(daemon.sock) as c:
        c.send({"op": "generate", "id": "long", "prompt": "Count:", "raw": True, "max_tokens": 400,
                "ignore_eos": True, "temperature": 0})
        n = 0
        for ev in c.events("long"):
            assert ev["event"] == "token"
            n += 1
            if n == 2:
                break
        c.send({"op": "cancel", "id": "c1", "target": "long"})
        ok = done = None
        while ok is None or done is None:
            ev = c.recv()
            if ev["id"] == "c1":
                ok = ev
            elif ev["event"] != "token":
                done = ev
        assert ok["event"] == "ok", ok
        assert done["event"] == "done" and done["reason"] == "cancelled", done
        assert done["usage"]["completion_tokens"] < 100
        nf = c.request({"op": "cancel", "id": "c2", "target": "long"})
        assert nf["event"] == "error" and nf["code"] == "not_found"
    wait_until(lambda: daemon.status()["slots"]["used"] == 0, what="slot freed")


def test_disconnect_mid_stream(daemon):
    c = Client(daemon.sock)
    c.send({"op": "generate", "id": 1, "prompt": "Tell a story.", "max_tokens": 400, "ignore_eos": True})
    assert c.recv()["event"] == "token"
    c.close()
    wait_until(lambda: daemon.status()["slots"]["used"] == 0, timeout=10, what="slot freed after disconnect")
    # Non-streamed: nothing is sent until the end, the hang-up alone frees the slot.
    c = Client(daemon.sock)
    c.send({"op": "generate", "id": 2, "prompt": "Tell a story.", "max_tokens": 400, "ignore_eos": True,
            "stream": False})
    wait_until(lambda: daemon.status()["slots"]["used"] == 1, what="request running")
    c.close()
    wait_until(lambda: daemon.status()["slots"]["used"] == 0, timeout=10, what="slot freed after hang-up")
    with Client(daemon.sock) as c2:
        toks, text, done = c2.generate(prompt="Hi", max_tokens=3, temperature=0)
        assert done["event"] == "done"


BAD = [
    (b"{not json}\n", "parse_error"),
    (b"[1,2,3]\n", "parse_error"),
    (b'{"id":1}\n', "bad_request"),
    (b'{"op":"frobnicate","id":1}\n', "unknown_op"),
    (b'{"op":"generate","prompt":"x"}\n', "bad_request"),
    (b'{"op":"generate","id":1,"prompt":7}\n', "bad_request"),
    (b'{"op":"generate","id":1,"prompt":"x","max_tokens":0}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"prompt":"x","max_tokens":-1}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"prompt":"x","temperature":-1}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"prompt":"x","temperature":NaN}\n', "parse_error"),
    (b'{"op":"generate","id":1,"prompt":"x","top_p":1.5}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"tokens":[1,49152]}\n', "out_of_range"),
    (b'{"op":"generate","id":1,"tokens":[-1]}\n', "out_of_range"),
    (b'{"op":"detokenize","id":1,"tokens":[99999999]}\n', "out_of_range"),
    (b'{"op":"hello","version":99}\n', "unsupported_version"),
    (b'{"op":"cancel","id":1,"target":"nope"}\n', "not_found"),
    (b'{"op":"generate","id":1,"prompt":"\xff\xfe"}\n', "parse_error"),
]


def test_bad_requests(daemon):
    with Client(daemon.sock) as c:
        for line, code in BAD:
            ev = c.request(line)
            assert ev["event"] == "error" and ev["code"] == code, (line, ev)
            assert ev["message"]
        # Context overflow: a prompt longer than the context.
        ev = c.request({"op": "generate", "id": "big", "tokens": [100] * 600})
        assert ev["code"] == "context_overflow", ev
        ev = c.request({"op": "generate", "id": "big2", "prompt": "word " * 700, "raw": True})
        assert ev["code"] == "context_overflow", ev
        # Over the line limit: too_large, the rest of the line skipped, the connection lives.
        c.send(b'{"op":"tokenize","id":1,"text":"' + b"a" * (MAX_LINE * 3) + b'"}\n')
        ev = c.recv()
        assert ev["code"] == "too_large", ev
        st = c.request({"op": "status", "id": "after"})
        assert st["event"] == "status" and st["id"] == "after"
        # Blank lines are ignored, several requests in one write all answered.
        c.send(b'\n\r\n{"op":"status","id":"a"}\n{"op":"status","id":"b"}\n')
        assert c.recv()["id"] == "a" and c.recv()["id"] == "b"
    # A last request without its newline, then the end of input: the end ends the line, and it is answered.
    for tail in (b'{"op":"status","id":"last"}', b'{"op":"generate","id":"last","prompt":"Hi","max_tokens":2}'):
        with Client(daemon.sock) as c:
            c.send(b'{"op":"status","id":"first"}\n' + tail)
            c.s.shutdown(socket.SHUT_WR)
            assert c.recv()["id"] == "first"
            evs = []
            while (ev := c.recv()) is not None:
                evs.append(ev)
            assert evs and all(e["id"] == "last" for e in evs) and evs[-1]["event"] in ("status", "done"), evs
    assert daemon.proc.poll() is None


def test_queue_full_is_busy(daemon):
    with Client(daemon.sock) as c:
        n = SLOTS + MAX_QUEUE
        for i in range(n + 1):
            c.send({"op": "generate", "id": i, "prompt": "Go", "max_tokens": 300, "ignore_eos": True,
                    "stream": False})
        ev = c.recv()
        assert ev["event"] == "error" and ev["code"] == "busy" and ev["id"] == n, ev
        st = daemon.status()
        assert st["slots"]["used"] == SLOTS and st["slots"]["queued"] == MAX_QUEUE
        for i in range(n):
            c.send({"op": "cancel", "id": f"c{i}", "target": i})
        dones = set()
        while len(dones) < n:
            ev = c.recv()
            if ev["event"] == "done":
                assert ev["reason"] == "cancelled"
                dones.add(ev["id"])
    wait_until(lambda: daemon.status()["slots"] == {"total": SLOTS, "used": 0, "queued": 0}, what="all freed")


def test_silent_and_slow_clients_do_not_block(daemon, reference):
    silent = Client(daemon.sock)
    slow = Client(daemon.sock)
    stop = threading.Event()

    def dribble():
        line = b'{"op":"status","id":"slow"}\n'
        try:
            for b in line[:-1]:
                if stop.wait(0.5):
                    return
                slow.s.send(bytes([b]))
        except OSError:
            pass

    t = threading.Thread(target=dribble)
    t.start()
    try:
        t0 = time.time()
        with Client(daemon.sock) as c:
            toks, text, done = c.generate(prompt=PROMPTS[1], **GREEDY)
        assert (toks, text) == reference[PROMPTS[1]]
        assert time.time() - t0 < 30
        # The dribbling client's line is not finished within --line-timeout 3: error, closed.
        ev = slow.recv()
        assert ev["event"] == "error" and "not finished" in ev["message"], ev
        assert slow.recv() is None
    finally:
        stop.set()
        t.join()
        silent.close()
        slow.close()


def test_connection_limit(daemon):
    held = []

    def one_more():
        # Earlier clients' connections are freed asynchronously: retry a refusal briefly.
        c = Client(daemon.sock, timeout=10)
        try:
            ev = c.request({"op": "status", "id": 1})
        except OSError:
            ev = None
        if ev and ev["event"] == "status":
            held.append(c)
            return True
        c.close()
        return False

    try:
        for _ in range(MAX_CLIENTS):
            wait_until(one_more, timeout=5, what="connection accepted")
        extra = Client(daemon.sock, timeout=10)
        ev = extra.recv()
        assert ev["event"] == "error" and ev["code"] == "busy" and "too many connections" in ev["message"]
        assert extra.recv() is None  # closed right after
        extra.close()
        # nxctl says so too, not "Broken pipe" from the hello it sent into the closed socket
        r = subprocess.run([str(build_dir() / "nxctl"), "--socket", daemon.sock, "status"], capture_output=True,
                           timeout=10)
        assert r.returncode == 1 and b"too many connections" in r.stderr and b"(busy)" in r.stderr, r
    finally:
        for c in held:
            c.close()
    wait_until(lambda: daemon.status()["event"] == "status", what="daemon serving again")


def test_reader_that_never_reads(daemon, reference):
    # Each token event carries 20 alternatives (~2 KB): the socket buffer and then
    # the daemon's --out-limit fill within ~150 tokens.
    stalled = Client(daemon.sock, rcvbuf=4096)
    stalled.send({"op": "generate", "id": "flood", "prompt": "List words:", "raw": True, "max_tokens": 450,
                  "ignore_eos": True, "logprobs": 20, "temperature": 0})
    try:
        with Client(daemon.sock) as c:
            toks, text, done = c.generate(prompt=PROMPTS[2], **GREEDY)
            assert (toks, text) == reference[PROMPTS[2]]
        daemon.wait_log("over the limit", timeout=90)
        wait_until(lambda: daemon.status()["slots"]["used"] == 0, what="stalled client's slot freed")
    finally:
        stalled.close()


def test_batching_gives_the_same_greedy_output(daemon, reference):
    results = {}

    def run(p):
        with Client(daemon.sock) as c:
            toks, text, done = c.generate(rid=p, prompt=p, **GREEDY)
            results[p] = (toks, text)

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in PROMPTS:
        assert results[p] == reference[p], p
    st = daemon.status()
    assert st["sequences_per_step"]["max"] >= 2, st


def test_worker_killed_mid_step(daemon, reference):
    """kill -9 a worker during a generation: the step is retried, the output is unchanged."""
    pids = daemon.worker_pids()
    before = daemon.status()
    with Client(daemon.sock) as c:
        c.send({"op": "generate", "id": "k", "prompt": PROMPTS[3], **GREEDY})
        toks, text = [], []
        for ev in c.events("k"):
            if ev["event"] == "token":
                toks.append(ev["token"])
                text.append(ev["text"])
                if len(toks) == 3:
                    os.kill(pids[1], signal.SIGKILL)
            else:
                assert ev["event"] == "done", ev
    assert (toks, "".join(text)) == reference[PROMPTS[3]]
    daemon.wait_log("killed by signal 9")
    st = daemon.status()
    assert st["workers"][1]["restarts"] == before["workers"][1]["restarts"] + 1
    assert st["workers"][1]["pid"] != pids[1] and pid_alive(st["workers"][1]["pid"])


# ---------------------------------------------------------------- separate daemons

@pytest.mark.parametrize("call", ["open", "execve", "ptrace"])
def test_forbidden_syscall_kills_worker(model_path, nxd_bin, tmp_path, reference, call):
    """Worker 0 calls open(), execve() or ptrace() inside its 3rd step: seccomp kills it (SIGSYS), it is
    logged and replaced, the step runs again and the client gets exactly the output it would have got."""
    with Daemon(model_path, tmp_path, args=FIXTURE_ARGS, env={"NXD_TEST_WORKER_SYSCALL": f"{call}:3"}) as d:
        with Client(d.sock) as c:
            toks, text, done = c.generate(prompt=PROMPTS[0], **GREEDY)
        assert done["event"] == "done"
        assert (toks, text) == reference[PROMPTS[0]]
        log = d.log()
        assert "killed by seccomp (SIGSYS)" in log, log
        assert "respawned" in log
        st = d.status()
        assert st["workers"][0]["restarts"] == 1 and st["steps_retried"] >= 1
        # It keeps serving.
        with Client(d.sock) as c:
            assert c.generate(prompt=PROMPTS[0], **GREEDY)[:2] == reference[PROMPTS[0]]


def test_step_that_keeps_killing_workers_fails_alone(model_path, nxd_bin, tmp_path):
    """Worker 0 dies in the first step of every process: after 3 tries the request of that
    step gets an error (not a retry loop), and the daemon still answers."""
    with Daemon(model_path, tmp_path, args=["--ctx", "256"], env={"NXD_TEST_WORKER_SYSCALL": "open:1+"}) as d:
        with Client(d.sock) as c:
            toks, text, ev = c.generate(prompt="Hi", max_tokens=4)
            assert ev["event"] == "error" and ev["code"] == "internal" and "repeatedly" in ev["message"], ev
            assert c.request({"op": "status", "id": 2})["event"] == "status"
        assert d.log().count("killed by seccomp (SIGSYS)") == 3


def test_worker_dying_at_start_gives_up(model_path, nxd_bin, tmp_path):
    """A worker that dies at every start: back-off, a clear error, exit 1, no tight loop."""
    d = Daemon(model_path, tmp_path, args=["--ctx", "256"], env={"NXD_TEST_WORKER_SYSCALL": "socket"})
    t0 = time.time()
    d.spawn()
    rc = d.proc.wait(30)
    elapsed = time.time() - t0
    log = d.log()
    assert rc == 1, log
    assert "failed to start 5 times in a row" in log and "killed by seccomp (SIGSYS)" in log, log
    assert log.count("start-up failure") == 4
    assert elapsed >= 1.4, elapsed  # 0.1 + 0.2 + 0.4 + 0.8 s of back-off
    assert not os.path.exists(d.sock)


def test_sigterm_mid_stream(model_path, nxd_bin, tmp_path):
    d = Daemon(model_path, tmp_path, args=FIXTURE_ARGS).start()
    try:
        workers = d.worker_pids()
        c = Client(d.sock)
        c2 = Client(d.sock)
        c.send({"op": "generate", "id": 1, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True})
        c2.send({"op": "generate", "id": 2, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True,
                 "stream": False})
        assert c.recv()["event"] == "token"
        d.proc.send_signal(signal.SIGTERM)
        evs = list(c.events(1))
        assert evs[-1]["event"] == "done" and evs[-1]["reason"] == "shutdown", evs[-1]
        ev = c2.recv()
        assert ev["event"] == "done" and ev["reason"] == "shutdown", ev
        assert d.proc.wait(15) == 0
        assert not os.path.exists(d.sock)
        for p in workers:
            wait_until(lambda: not pid_alive(p), timeout=5, what=f"worker {p} gone")
        assert "stopped" in d.log()
    finally:
        d.kill()


def test_stale_socket_replaced_and_live_one_kept(model_path, nxd_bin, tmp_path):
    sock = tmp_path / "s.sock"
    # A stale socket: bound, never listened on, left behind (like a kill -9'd daemon).
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    assert sock.exists()
    d = Daemon(model_path, tmp_path, args=["--ctx", "256"], socket_path=sock, name="a").start()
    try:
        assert "replaced stale" in d.log()
        # A second daemon on the same live socket: refuses, exit 1, does not touch it.
        d2 = Daemon(model_path, tmp_path, args=["--ctx", "256"], socket_path=sock, name="b")
        d2.spawn()
        assert d2.proc.wait(20) == 1
        assert f"belongs to another nxd (pid {d.pid} holds" in d2.log(), d2.log()
        assert d.status()["event"] == "status"
        # A file that is not a socket is never removed.
        other = tmp_path / "plain"
        other.write_text("x")
        d3 = Daemon(model_path, tmp_path, args=["--ctx", "256"], socket_path=other, name="c")
        d3.spawn()
        assert d3.proc.wait(20) == 1 and "not a socket" in d3.log()
        assert other.read_text() == "x"
        # kill -9 the supervisor: the workers follow (parent-death signal); the socket stays stale.
        workers = d.worker_pids()
        d.proc.kill()
        d.proc.wait(5)
        for p in workers:
            wait_until(lambda: not pid_alive(p), timeout=5, what=f"worker {p} gone after the supervisor")
        assert sock.exists()
        d4 = Daemon(model_path, tmp_path, args=["--ctx", "256"], socket_path=sock, name="d").start()
        assert d4.status()["event"] == "status"
        assert d4.stop() == 0
    finally:
        d.kill()


def test_two_daemons_started_at_once_on_a_stale_socket(model_path, nxd_bin, tmp_path):
    """Both see the stale socket; exactly one replaces it and serves, the other is refused naming the
    one that holds it, and the socket at the path is the server's."""
    for round_ in range(4):
        sock = tmp_path / f"r{round_}.sock"
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock))
        s.close()
        ds = [Daemon(model_path, tmp_path, args=["--ctx", "256"], socket_path=sock, name=f"r{round_}{k}")
              for k in "ab"]
        for d in ds:
            d.spawn()
        try:
            wait_until(lambda: any(d.proc.poll() is not None for d in ds), timeout=60, what="one of two refused")
            loser = next(d for d in ds if d.proc.poll() is not None)
            winner = next(d for d in ds if d is not loser)
            assert loser.proc.returncode == 1 and "belongs to another nxd" in loser.log(), loser.log()
            wait_until(lambda: "ready:" in winner.log(), timeout=60, what="the other ready")
            assert winner.status()["event"] == "status"
            assert winner.stop() == 0 and not sock.exists()
        finally:
            for d in ds:
                d.kill()


def test_futex_thread_fallback_and_context_end(model_path, nxd_bin, tmp_path, reference):
    """The step wait without IORING_OP_FUTEX_WAIT (helper thread + eventfd) gives the same
    results; a sequence that reaches the end of its context stops with reason "length"."""
    args = ["--ctx", "64", "--slots", "2", "--batch", "16"]
    with Daemon(model_path, tmp_path, args=args, env={"NXD_FUTEX_THREAD": "1"}) as d:
        assert "a futex thread and an eventfd" in d.log()
        with Client(d.sock) as c:
            assert c.generate(prompt=PROMPTS[0], **GREEDY)[:2] == reference[PROMPTS[0]]
            # 60 prompt tokens, 64 positions: tokens at positions 60..63 can be fed, so
            # 5 come out (the last one is sampled but has no position to be fed at).
            toks, text, done = c.generate(tokens=[504] * 60, max_tokens=50, ignore_eos=True, temperature=0)
            assert done["reason"] == "length" and done["usage"]["completion_tokens"] == 5, done
            ev = c.request({"op": "generate", "id": 9, "tokens": [504] * 64})
            assert ev["code"] == "context_overflow", ev


STRACE_ALLOWED = {"futex", "write", "exit_group", "exit", "restart_syscall", "rt_sigreturn", "sched_yield",
                  "clock_nanosleep", "clock_gettime", "getpid"}


def test_worker_syscalls(model_path, nxd_bin, tmp_path):
    """What a sandboxed worker really calls, watched with strace through start-up, prefill,
    decode, batching, a cancel and shutdown: only what the seccomp allowlist names, and
    futex only as the shared FUTEX_WAIT / FUTEX_WAKE."""
    import shutil
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    trace = tmp_path / "strace.out"
    d = Daemon(model_path, tmp_path, args=["--ctx", "256"],
               wrapper=["strace", "-f", "-qq", "-o", str(trace)]).start(timeout=60)
    try:
        with Client(d.sock) as c:
            c.generate(prompt=PROMPTS[0], **GREEDY)
            c.send({"op": "generate", "id": "x", "prompt": "Go", "max_tokens": 300, "ignore_eos": True})
            c.recv()
            c.request({"op": "cancel", "id": "c", "target": "x"})
        children = open(f"/proc/{d.pid}/task/{d.pid}/children").read().split()
        nxd_pid = int(children[0])
        os.kill(nxd_pid, signal.SIGTERM)
        assert d.proc.wait(30) == 0
    finally:
        d.kill()
    sandboxed, calls = set(), {}
    for line in trace.read_text().splitlines():
        parts = line.split(None, 1)
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        pid, rest = int(parts[0]), parts[1]
        if rest.startswith("seccomp(SECCOMP_SET_MODE_FILTER, 0,"):
            sandboxed.add(pid)
            continue
        if pid in sandboxed and not rest.startswith(("<...", "---", "+++")):
            name = rest.split("(", 1)[0]
            calls.setdefault(name, []).append(rest)
    assert len(sandboxed) == 2, sandboxed
    assert set(calls) <= STRACE_ALLOWED, {k: v[:2] for k, v in calls.items() if k not in STRACE_ALLOWED}
    assert "futex" in calls
    for call in calls["futex"]:
        op = call.split(",")[1].strip()
        assert op in ("FUTEX_WAIT", "FUTEX_WAKE"), call


def test_cancel_reaches_only_ones_own_requests(model_path, nxd_bin, tmp_path):
    """Request ids are per connection: another client cancelling the same id gets not_found and the
    stream goes on to its end; its owner can cancel it."""
    with Daemon(model_path, tmp_path, args=["--ctx", "256"]) as d:
        with Client(d.sock) as a, Client(d.sock) as b:
            a.send({"op": "generate", "id": "g", "prompt": "Hi", "max_tokens": 40, "ignore_eos": True,
                    "temperature": 0})
            assert a.recv()["event"] == "token"
            ev = b.request({"op": "cancel", "id": "c", "target": "g"})
            assert ev["event"] == "error" and ev["code"] == "not_found", ev
            done = [e for e in a.events("g")][-1]
            assert done["event"] == "done" and done["reason"] == "length", done
            a.send({"op": "generate", "id": "g", "prompt": "Hi", "max_tokens": 200, "ignore_eos": True})
            assert a.recv()["event"] == "token"
            assert a.request({"op": "cancel", "id": "c", "target": "g"})["event"] in ("ok", "token")
            done = [e for e in a.events("g")][-1]
            assert done["event"] == "done" and done["reason"] == "cancelled", done
