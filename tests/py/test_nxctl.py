"""test_nxctl.py - nxctl against a fake nxd that speaks the protocol on a temporary Unix socket.

The fake server records every request line and answers through per-test
handlers, so these tests check what nxctl sends, prints and exits with; the
end-to-end tests against the real daemon live elsewhere.
"""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import termios
import time
import tty

import pytest

BUILD = os.environ.get("NX_BUILD", "build")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NXCTL = os.path.join(ROOT, BUILD, "nxctl")

pytestmark = pytest.mark.skipif(not os.path.exists(NXCTL), reason=f"{NXCTL} not built")


def hello_ok(req, send):
    send({"event": "hello", "version": 1, "server": "nxd", "model": "fake", "arch": "llama",
          "n_ctx": 2048, "n_vocab": 49152})


def stream_pieces(pieces, reason="eos"):
    def gen(req, send):
        for i, p in enumerate(pieces):
            send({"id": req["id"], "event": "token", "token": 100 + i, "text": p})
        send({"id": req["id"], "event": "done", "reason": reason,
              "usage": {"prompt_tokens": 3, "completion_tokens": len(pieces)},
              "timing": {"prefill_ms": 1.0, "decode_ms": 2.0, "tokens_per_s": 10.0}})
    return gen


class FakeNxd:
    """Accepts connections one after another; each request line is recorded
    and handed to handlers[op](req, send)."""

    def __init__(self, path):
        self.path = path
        self.requests = []
        self.raw = []
        self.handlers = {"hello": hello_ok}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                self._serve(conn)

    def _serve(self, conn):
        f = conn.makefile("rb")
        lock = threading.Lock()

        def send(obj, raw=None):
            line = raw if raw is not None else json.dumps(obj, ensure_ascii=False).encode() + b"\n"
            with lock:
                try:
                    conn.sendall(line)
                except OSError:
                    pass

        for line in f:
            self.raw.append(line)
            req = json.loads(line)
            self.requests.append(req)
            h = self.handlers.get(req.get("op"))
            if h is None:
                send({"id": req.get("id"), "event": "error", "code": "unknown_op",
                      "message": f"field 'op' names no known operation, got {req.get('op')!r}"})
            elif h(req, send) == "close":
                return

    def close(self):
        self.stop = True
        self.sock.close()
        self.thread.join(2)

    def ops(self):
        return [r.get("op") for r in self.requests]


@pytest.fixture
def procs():
    """Popen objects a test starts; killed if the test fails half-way."""
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def spawn(procs, sock, args):
    p = subprocess.Popen([NXCTL, "--socket", sock] + args, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(p)
    return p


@pytest.fixture
def nxd(tmp_path):
    s = FakeNxd(str(tmp_path / "nxd.sock"))
    yield s
    s.close()


def run(args, sock=None, stdin=None, timeout=10, env_extra=None):
    env = dict(os.environ)
    env.pop("NXD_SOCKET", None)
    if env_extra:
        env.update(env_extra)
    cmd = [NXCTL] + (["--socket", sock] if sock else []) + args
    return subprocess.run(cmd, input=stdin if stdin is not None else b"", capture_output=True,
                          timeout=timeout, env=env)


def test_not_running(tmp_path):
    path = str(tmp_path / "absent.sock")
    r = run(["generate", "hi"], sock=path)
    assert r.returncode == 3
    assert r.stderr.decode() == f"nxctl: cannot connect to {path}: No such file or directory (is nxd running?)\n"
    assert r.stdout == b""
    # the same through $NXD_SOCKET, and for a socket file nobody listens on
    r = run(["status"], env_extra={"NXD_SOCKET": path})
    assert r.returncode == 3 and path in r.stderr.decode()
    dead = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(dead)
    s.close()
    r = run(["status"], sock=dead)
    assert r.returncode == 3
    assert "Connection refused (is nxd running?)" in r.stderr.decode()


def test_generate_streams(nxd):
    nxd.handlers["generate"] = stream_pieces(["Hel", "lo", ", w\u00f6rld \U0001F600"])
    r = run(["generate", "--max-tokens", "5", "--temp", "0", "--top-k", "3", "--top-p", "0.5",
             "--min-p", "0.1", "--repeat-penalty", "1.1", "--repeat-last-n", "16",
             "--seed", "9007199254740993", "--stop", "\n\n", "--stop", "END", "--ignore-eos",
             "--system", "be brief", "--logprobs", "2", "--lora", "style:0.5",
             "Say", "hello"], sock=nxd.path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "Hello, w\u00f6rld \U0001F600\n"
    assert r.stderr == b""
    assert nxd.ops() == ["hello", "generate"]
    assert nxd.requests[0] == {"op": "hello", "version": 1}
    g = nxd.requests[1]
    assert isinstance(g["id"], int)
    assert g["prompt"] == "Say hello"
    assert g["system"] == "be brief"
    assert g["max_tokens"] == 5 and g["temperature"] == 0 and g["top_k"] == 3
    assert g["top_p"] == 0.5 and g["min_p"] == 0.1 and g["repeat_penalty"] == 1.1
    assert g["repeat_last_n"] == 16 and g["seed"] == 9007199254740993
    assert g["stop"] == ["\n\n", "END"] and g["ignore_eos"] is True
    assert g["logprobs"] == 2 and g["stream"] is True
    assert g["lora"] == [{"name": "style", "scale": 0.5}]
    assert "raw" not in g and "tokens" not in g and "messages" not in g
    # each request is one line of compact JSON
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in nxd.raw)
    # more tokens than nxd allows is nxd's limit (docs/nxctl.1), not a usage error
    r = run(["generate", "-n", "99999999999", "hi"], sock=nxd.path)
    assert r.returncode == 0 and nxd.requests[-1]["max_tokens"] == 99999999999, r.stderr


def test_output_that_cannot_be_written_is_an_error(nxd):
    """An answer written to a full disk is no answer: an error on stderr and exit 1, not 0."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    nxd.handlers["generate"] = stream_pieces(["Hel", "lo"])
    nxd.handlers["tokenize"] = lambda req, send: send({"id": req["id"], "event": "tokens", "tokens": [1, 2]})
    for args in (["generate", "hi"], ["generate", "--json", "hi"], ["tokenize", "hi"]):
        with open("/dev/full", "wb") as full:
            r = subprocess.run([NXCTL, "--socket", nxd.path] + args, stdout=full, stderr=subprocess.PIPE,
                               timeout=10)
        assert r.returncode == 1 and b"nxctl: cannot write the output" in r.stderr, (args, r)


def test_generate_speculate(nxd):
    nxd.handlers["generate"] = stream_pieces(["ok"])
    r = run(["generate", "--speculate", "prompt:6", "hi"], sock=nxd.path)
    assert r.returncode == 0, r.stderr
    assert nxd.requests[-1]["speculate"] == {"mode": "prompt", "k": 6}
    r = run(["generate", "--speculate", "off", "hi"], sock=nxd.path)
    assert r.returncode == 0 and nxd.requests[-1]["speculate"] == {"mode": "off"}
    r = run(["generate", "--speculate", "draft:3", "hi"], sock=nxd.path)
    assert r.returncode == 0 and nxd.requests[-1]["speculate"] == {"mode": "draft", "k": 3}
    for bad in ("lookahead", "prompt:0", "prompt:17", "prompt:x"):
        r = run(["generate", "--speculate", bad, "hi"], sock=nxd.path)
        assert r.returncode == 2 and b"--speculate" in r.stderr, (bad, r.stderr)


def test_generate_stdin_raw_tokens(nxd):
    nxd.handlers["generate"] = stream_pieces(["ok"])
    r = run(["generate", "--raw", "-"], sock=nxd.path, stdin="line one\nline two\n".encode())
    assert r.returncode == 0, r.stderr
    assert nxd.requests[-1]["prompt"] == "line one\nline two"  # one trailing newline removed
    assert nxd.requests[-1]["raw"] is True
    # no PROMPT and stdin not a terminal: stdin is the prompt
    r = run(["generate"], sock=nxd.path, stdin=b"from stdin")
    assert r.returncode == 0 and nxd.requests[-1]["prompt"] == "from stdin"
    r = run(["generate", "--tokens", "1,2 3"], sock=nxd.path)
    assert r.returncode == 0, r.stderr
    assert nxd.requests[-1]["tokens"] == [1, 2, 3] and "prompt" not in nxd.requests[-1]
    # flags after the prompt still count
    r = run(["generate", "hi", "-n", "7"], sock=nxd.path)
    assert r.returncode == 0 and nxd.requests[-1]["max_tokens"] == 7
    assert nxd.requests[-1]["prompt"] == "hi"


def test_error_event(nxd):
    def bad(req, send):
        send({"id": req["id"], "event": "error", "code": "out_of_range",
              "message": "field 'max_tokens' must be in 1..2048, got 999999"})
    nxd.handlers["generate"] = bad
    r = run(["generate", "-n", "999999", "hi"], sock=nxd.path)
    assert r.returncode == 1
    assert r.stderr.decode() == \
        "nxctl: field 'max_tokens' must be in 1..2048, got 999999 (out_of_range)\n"
    assert r.stdout == b""


def test_error_mid_stream_and_close(nxd):
    def half(req, send):
        send({"id": req["id"], "event": "token", "token": 1, "text": "par"})
        return "close"
    nxd.handlers["generate"] = half
    r = run(["generate", "hi"], sock=nxd.path)
    assert r.returncode == 1
    assert r.stdout.decode() == "par\n"
    assert "closed the connection before the answer was done" in r.stderr.decode()

    def garbage(req, send):
        send(None, raw=b"this is not json\n")
    nxd.handlers["generate"] = garbage
    r = run(["generate", "hi"], sock=nxd.path)
    assert r.returncode == 1 and "not a JSON object" in r.stderr.decode()


def test_json_mode(nxd):
    nxd.handlers["generate"] = stream_pieces(["a", "\"b\"\n"], reason="length")
    r = run(["generate", "--json", "hi"], sock=nxd.path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    events = [json.loads(l) for l in lines]
    assert [e["event"] for e in events] == ["token", "token", "done"]
    assert events[1]["text"] == "\"b\"\n"
    assert events[2]["reason"] == "length"
    # verbatim: the same bytes the server sent (json.dumps spacing kept)
    assert lines[0] == json.dumps(events[0], ensure_ascii=False)


def test_version_mismatch(nxd):
    def old(req, send):
        send({"id": None, "event": "error", "code": "unsupported_version",
              "message": "protocol version 1 is not supported; this server speaks version 2"})
    nxd.handlers["hello"] = old
    r = run(["generate", "hi"], sock=nxd.path)
    assert r.returncode == 1
    assert "unsupported_version" in r.stderr.decode()
    assert nxd.ops() == ["hello"]


def test_version_mismatch_names_both(nxd):
    nxd.handlers["hello"] = lambda req, send: send({"event": "hello", "version": 99, "server": "nxd"})
    r = run(["status"], sock=nxd.path)
    assert r.returncode == 1 and r.stdout == b""
    assert r.stderr.decode() == f"nxctl: nxd at {nxd.path} speaks protocol version 99; nxctl speaks version 1\n"
    nxd.handlers["hello"] = lambda req, send: send({"event": "hello", "version": "1"})
    r = run(["status"], sock=nxd.path)
    assert r.returncode == 1
    assert r.stderr.decode() == (f"nxctl: nxd at {nxd.path} sent a hello whose 'version' is not an integer (got "
                                 f"string); nxctl speaks protocol version 1\n")
    assert nxd.ops() == ["hello", "hello"]  # nothing sent past the hello


def test_ctrl_c_cancels(nxd, procs):
    gen_id = {}
    started = threading.Event()

    def slow(req, send):
        gen_id["id"] = req["id"]
        send({"id": req["id"], "event": "token", "token": 1, "text": "first"})
        started.set()

    def cancel(req, send):
        send({"id": req["id"], "event": "ok"})
        send({"id": req["target"], "event": "done", "reason": "cancelled",
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "timing": {}})

    nxd.handlers["generate"] = slow
    nxd.handlers["cancel"] = cancel
    p = spawn(procs, nxd.path, ["generate", "hi"])
    assert started.wait(5)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=5)
    assert p.returncode == 130, err
    assert out.decode() == "first\n"
    assert nxd.ops() == ["hello", "generate", "cancel"]
    assert nxd.requests[2]["target"] == gen_id["id"]


def test_second_ctrl_c_exits(nxd, procs):
    started = threading.Event()

    def slow(req, send):
        send({"id": req["id"], "event": "token", "token": 1, "text": "x"})
        started.set()

    nxd.handlers["generate"] = slow
    nxd.handlers["cancel"] = lambda req, send: None  # never answers
    p = spawn(procs, nxd.path, ["generate", "hi"])
    assert started.wait(5)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert p.poll() is None  # still waiting for done after the first one
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=5)
    assert p.returncode == 130


def test_tokenize_detokenize_status(nxd):
    nxd.handlers["tokenize"] = lambda req, send: send(
        {"id": req["id"], "event": "tokens", "tokens": [1, 22, 333]})
    nxd.handlers["detokenize"] = lambda req, send: send(
        {"id": req["id"], "event": "text", "text": "caf\u00e9 \U0001F600"})
    r = run(["tokenize", "--special", "<|im_start|>hi"], sock=nxd.path)
    assert r.returncode == 0 and r.stdout == b"1 22 333\n"
    t = nxd.requests[-1]
    assert t["op"] == "tokenize" and t["text"] == "<|im_start|>hi" and t["special"] is True
    assert "add_bos" not in t
    r = run(["tokenize", "--bos", "-"], sock=nxd.path, stdin=b"abc")
    assert r.returncode == 0 and nxd.requests[-1]["text"] == "abc"
    assert nxd.requests[-1]["add_bos"] is True
    r = run(["detokenize", "5", "6,7"], sock=nxd.path)
    assert r.returncode == 0
    assert r.stdout.decode() == "caf\u00e9 \U0001F600\n"
    assert nxd.requests[-1]["tokens"] == [5, 6, 7] and nxd.requests[-1]["special"] is True
    r = run(["detokenize", "--no-special", "--", "-1", "2"], sock=nxd.path)  # after --, ids; nxd checks them
    assert r.returncode == 0, r.stderr
    assert nxd.requests[-1]["tokens"] == [-1, 2] and nxd.requests[-1]["special"] is False

    status = {"event": "status", "model": "SmolLM2", "arch": "llama", "type": "Q4_1",
              "n_ctx": 8192, "n_vocab": 49152, "kernels": {"dot": "avx512", "pack": "amx"},
              "workers": [{"pid": 11, "cpu": 0, "state": "idle", "restarts": 0},
                          {"pid": 12, "cpu": 1, "state": "busy", "restarts": 2}],
              "slots": {"total": 8, "used": 3, "queued": 1}, "tokens_served": 12345,
              "sequences_per_step": {"mean": 2.5, "max": 4}, "tokens_per_s": 42.2,
              "uptime_s": 3725.0, "steps": 99, "steps_retried": 1,
              "speculate": {"default": "prompt", "k": 6, "drafted": 200, "accepted": 150, "acceptance": 0.75}}
    nxd.handlers["status"] = lambda req, send: send(dict(status, id=req["id"]))
    r = run(["status"], sock=nxd.path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    for want in ["SmolLM2", "llama", "Q4_1", "8192", "pid 12", "busy", "restarts 2",
                 "3 of 8 used", "1 queued", "12345 served", "42.2 tokens/s", "1h02m05s",
                 "prompt by default (k 6), 150 of 200 drafted tokens accepted (75.0%)",
                 "kernels:   dot avx512 pack amx"]:
        assert want in out, (want, out)
    r = run(["status", "--json"], sock=nxd.path)
    assert r.returncode == 0
    got = json.loads(r.stdout)
    assert got["workers"] == status["workers"] and got["slots"] == status["slots"]
    # numbers as nxd wrote them (9 digits), not the double's 17
    assert b'"tokens_per_s":%s,' % repr(status["tokens_per_s"]).encode() in r.stdout, r.stdout


def test_status_profile(nxd):
    """--profile prints only the per-phase split; without NXD_PROFILE=1 on the
    daemon's side it says how to turn it on and exits 1."""
    status = {"event": "status", "model": "m", "arch": "llama", "type": "Q4_1", "n_ctx": 64, "n_vocab": 10,
              "workers": [], "slots": {"total": 1, "used": 0, "queued": 0}, "tokens_served": 0,
              "sequences_per_step": {"mean": 0, "max": 0}, "tokens_per_s": 0, "uptime_s": 1.0, "steps": 0,
              "steps_retried": 0}
    nxd.handlers["status"] = lambda req, send: send(dict(status, id=req["id"]))
    r = run(["status", "--profile"], sock=nxd.path)
    assert r.returncode == 1 and r.stdout == b""
    assert "NXD_PROFILE=1" in r.stderr.decode()
    prof = {"steps": 40, "ms_per_step": {"matmul": 3.0, "logits": 1.0, "attention": 0.5, "norm+quant": 0.25,
                                         "rope+kv": 0.05, "barrier": 0.2}}
    status["profile"] = prof
    r = run(["status", "--profile"], sock=nxd.path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.splitlines()[0] == "profile:   5.000 ms per step over 40 steps (mean of the workers)"
    assert "  matmul         3.000 ms   60.0%" in out and "  barrier        0.200 ms    4.0%" in out
    assert "model:" not in out and "uptime" not in out
    r = run(["status", "--profile", "--json"], sock=nxd.path)
    assert r.returncode == 0 and json.loads(r.stdout) == prof
    r = run(["status"], sock=nxd.path)  # the full status shows the split too
    assert r.returncode == 0 and "model:" in r.stdout.decode() and "matmul" in r.stdout.decode()


def test_chat(nxd):
    answers = iter(["Hi there.", "Second.", "Fresh."])
    nxd.handlers["generate"] = lambda req, send: stream_pieces([next(answers)])(req, send)
    r = run(["chat", "--system", "S", "--temp", "0"], sock=nxd.path,
            stdin=b"hello\nand again\n\n/reset\nnew start")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "Hi there.\nSecond.\nFresh.\n"  # no "> " prompt: not a tty
    gens = [q for q in nxd.requests if q["op"] == "generate"]
    assert len(gens) == 3
    assert gens[0]["messages"] == [{"role": "system", "content": "S"},
                                   {"role": "user", "content": "hello"}]
    assert gens[1]["messages"] == [{"role": "system", "content": "S"},
                                   {"role": "user", "content": "hello"},
                                   {"role": "assistant", "content": "Hi there."},
                                   {"role": "user", "content": "and again"}]
    assert gens[2]["messages"] == [{"role": "system", "content": "S"},
                                   {"role": "user", "content": "new start"}]
    assert all(g["temperature"] == 0 for g in gens)
    assert len({g["id"] for g in gens}) == 3
    assert nxd.ops().count("hello") == 1  # one connection for the session


def test_chat_blocks(nxd):
    """A \"\"\" of its own opens a block whose message starts with the next line, not a newline."""
    nxd.handlers["generate"] = stream_pieces(["ok"])
    script = '"""\n/not a command\nline two\n"""\n"""inline\nnext"""\n'
    r = run(["chat"], sock=nxd.path, stdin=script.encode())
    assert r.returncode == 0, r.stderr
    sent = [q["messages"][-1]["content"] for q in nxd.requests if q["op"] == "generate"]
    assert sent == ["/not a command\nline two", "inline\nnext"], sent


def test_chat_error_keeps_going(nxd):
    calls = []

    def gen(req, send):
        calls.append(req)
        if len(calls) == 1:
            send({"id": req["id"], "event": "error", "code": "context_overflow",
                  "message": "prompt of 9000 tokens does not fit the context of 8192"})
        else:
            stream_pieces(["fine"])(req, send)
    nxd.handlers["generate"] = gen
    r = run(["chat"], sock=nxd.path, stdin=b"too long\nshort\n")
    assert r.returncode == 0
    assert "context_overflow" in r.stderr.decode()
    assert r.stdout.decode() == "fine\n"
    # the failed turn is not kept in the conversation
    assert calls[1]["messages"] == [{"role": "user", "content": "short"}]


@pytest.mark.parametrize("args,needle", [
    (["generate", "--max-tokens", "abc", "hi"], "--max-tokens wants an integer, got 'abc'"),
    (["generate", "--max-tokens", "0", "hi"], "--max-tokens must be at least 1, got 0"),
    (["generate", "--temp", "nan", "hi"], "--temp wants a finite number, got 'nan'"),
    (["generate", "--seed", "-1", "hi"], "--seed wants an integer"),
    (["generate", "--logprobs", "21", "hi"], "--logprobs must be in 0..20, got 21"),
    (["generate", "--stop", "", "hi"], "--stop wants a non-empty"),
    (["generate", "--bogus", "hi"], "unknown option '--bogus'"),
    (["generate", "--tokens", "1,x"], "--tokens id wants an integer, got 'x'"),
    (["generate", "--top-k"], "--top-k needs a value"),
    (["chat", "--raw"], "--raw is not a chat option"),
    (["chat", "words"], "unexpected argument 'words'"),
    (["tokenize"], "wants one TEXT"),
    (["detokenize"], "at least one token"),
    (["detokenize", "1", "x"], "token id wants an integer, got 'x'"),
    (["status", "--bogus"], "unexpected argument '--bogus'"),
    (["nope"], "unknown command 'nope'"),
    (["--socket"], "--socket needs a PATH"),
])
def test_usage_errors(nxd, args, needle):
    r = run(args, sock=None, env_extra={"NXD_SOCKET": nxd.path})
    assert r.returncode == 2, (args, r.stderr)
    assert needle in r.stderr.decode(), r.stderr
    assert nxd.requests == []  # nothing was sent


@pytest.mark.parametrize("cmd", ["generate", "chat", "tokenize", "detokenize", "status"])
def test_help(cmd):
    r = run([cmd, "--help"])
    assert r.returncode == 0
    assert r.stdout.decode().startswith(f"usage: nxctl {cmd}")
    r = run(["--help"])
    assert r.returncode == 0 and cmd in r.stdout.decode()


def read_until(fd, want, timeout=5):
    import select
    buf = b""
    end = time.time() + timeout
    while want not in buf and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                buf += os.read(fd, 4096)
            except OSError:
                break
    return buf


class PtyReader:
    """What a program wrote to a pseudo-terminal, read as it comes; expect() waits for a string after
    the last one it found, so a prompt seen once is not taken for the next."""

    def __init__(self, fd):
        self.fd, self.buf, self.pos = fd, b"", 0

    def expect(self, want, timeout=5):
        end = time.time() + timeout
        while self.buf.find(want, self.pos) < 0 and time.time() < end:
            more = read_until(self.fd, want, timeout=0.1)
            self.buf += more
        i = self.buf.find(want, self.pos)
        assert i >= 0, f"{want!r} not written after {self.buf[:self.pos]!r}; then came {self.buf[self.pos:]!r}"
        got, self.pos = self.buf[self.pos:i + len(want)], i + len(want)
        return got


def test_chat_tty_prompt_and_ctrl_c(nxd, procs):
    """On a terminal chat shows '> ' and streams the answer; Ctrl-C at the prompt drops the line and
    the chat goes on (as ollama's); Ctrl-D on an empty line leaves with status 0."""
    nxd.handlers["generate"] = stream_pieces(["Hey", "!"])
    master, slave = os.openpty()
    try:
        p = subprocess.Popen([NXCTL, "--socket", nxd.path, "chat"], stdin=slave, stdout=slave,
                             stderr=slave, env=dict(os.environ, XDG_STATE_HOME=str(nxd.path) + ".state"))
        procs.append(p)
        term = PtyReader(master)

        def prompt():
            # Keys go in once the prompt shows, as a person types them: the terminal must be raw by then
            # (typed while it is cooked, they are echoed twice and a Ctrl-D comes through as a NUL).
            term.expect(b"> ")
            assert not termios.tcgetattr(slave)[3] & termios.ICANON, "the prompt shows on a cooked terminal"
        prompt()
        os.write(master, b"hello\r")
        term.expect(b"Hey!")
        prompt()
        os.write(master, b"dropped")
        term.expect(b"dropped")
        p.send_signal(signal.SIGINT)
        term.expect(b"Ctrl-D or /bye leaves")
        prompt()
        assert p.poll() is None
        os.write(master, b"\x04")
        p.wait(5)
        assert p.returncode == 0
    finally:
        os.close(master)
        os.close(slave)
    gens = [q for q in nxd.requests if q["op"] == "generate"]
    assert [g["messages"] for g in gens] == [[{"role": "user", "content": "hello"}]]


def done_event(req, text, reason="eos", prompt_tokens=5, cached=2, completion=None, seed=77):
    return {"id": req["id"], "event": "done", "reason": reason, "seed": seed,
            "usage": {"prompt_tokens": prompt_tokens, "cached_tokens": cached,
                      "completion_tokens": len(text) if completion is None else completion},
            "timing": {"prefill_ms": 40.0, "decode_ms": 500.0, "tokens_per_s": 8.0}}


def answer(text, **kw):
    def gen(req, send):
        send({"id": req["id"], "event": "token", "token": 1, "text": text})
        send(done_event(req, text, **kw))
    return gen


def test_chat_commands(nxd):
    """Slash commands are nxctl's, never the model's: /help, /set, /system, /lora, /stats and /bye."""
    nxd.handlers["generate"] = answer("ok")
    script = ("/help\n/set temperature 0.25\n/set top-k 7\n/set seed 42\n/set max_tokens 9\n"
              "/system Be terse.\nhello\n/stats\n/set top_p 2\n/set bogus 1\n/lora style:0.5 other\nagain\n"
              "/lora off\n/set temperature default\n/nope\nthird\n/bye\nnever sent\n")
    r = run(["chat", "--system", "S"], sock=nxd.path, stdin=script.encode())
    assert r.returncode == 0, r.stderr
    gens = [q for q in nxd.requests if q["op"] == "generate"]
    assert [g["messages"][-1]["content"] for g in gens] == ["hello", "again", "third"]
    g0, g1, g2 = gens
    assert g0["messages"][0] == {"role": "system", "content": "Be terse."}  # /system replaced --system
    assert (g0["temperature"], g0["top_k"], g0["seed"], g0["max_tokens"]) == (0.25, 7, 42, 9)
    assert "lora" not in g0 and "top_p" not in g0  # the refused /set changed nothing
    assert g1["lora"] == [{"name": "style", "scale": 0.5}, {"name": "other"}]
    assert "lora" not in g2 and "temperature" not in g2 and g2["top_k"] == 7
    out, err = r.stdout.decode(), r.stderr.decode()
    assert "/bye" in out and "/set [NAME VALUE]" in out  # /help
    assert "answer:  2 tokens in 0.50 s, 8.0 tokens/s (eos)" in out
    assert "prompt:  5 tokens, 2 of them from the prompt cache, 0.04 s to the first token" in out
    assert "seed:    77 (/set seed 77 gives this answer again)" in out
    assert "nxctl: /set top_p wants a number in (0, 1], got '2'" in err
    assert "nxctl: /set: unknown option 'bogus'" in err
    assert "nxctl: unknown command '/nope'" in err


def test_chat_speculate(nxd):
    """/set speculate MODE[:K] reaches the next requests as --speculate would; /stats says what the drafts gave."""
    def gen(req, send):
        send({"id": req["id"], "event": "token", "token": 1, "text": "ok"})
        done = done_event(req, "ok", completion=9)
        if "speculate" in req:
            done["speculate"] = {"mode": req["speculate"]["mode"], "drafted": 6, "accepted": 4}
        send(done)
    nxd.handlers["generate"] = gen
    script = ("/set speculate prompt:4\n/set\nhello\n/stats\n/set speculate prompt:17\n/set speculate bogus\n"
              "/set speculate\n/set speculate off 2\nagain\n/set speculate default\nthird\n")
    r = run(["chat", "--speculate", "draft"], sock=nxd.path, stdin=script.encode())
    assert r.returncode == 0, r.stderr
    gens = [q for q in nxd.requests if q["op"] == "generate"]
    assert [g.get("speculate") for g in gens] == [{"mode": "prompt", "k": 4}] * 2 + [None]
    out, err = r.stdout.decode(), r.stderr.decode()
    assert "speculate       prompt:4" in out  # /set lists it
    assert "drafts:  4 of 6 accepted (prompt), 2.00 tokens a step" in out  # 8 decoded tokens in 4 steps
    assert "nxctl: /set speculate wants off, prompt or draft, or MODE:K with K in 1..16, got 'prompt:17'" in err
    assert "got 'bogus'" in err
    assert err.count("nxctl: /set speculate wants one VALUE") == 2 and "unknown option" not in err


def test_chat_multiline(nxd):
    """A \"\"\" block or trailing backslashes make one message of several lines."""
    nxd.handlers["generate"] = answer("ok")
    script = '"""first\n/not a command\n"""\nline one \\\nline two\n"""one line"""\n"""ends"""\n"""open at the end\nlast'
    r = run(["chat"], sock=nxd.path, stdin=script.encode())
    assert r.returncode == 0, r.stderr
    users = [g["messages"][-1]["content"] for g in nxd.requests if g["op"] == "generate"]
    assert users == ["first\n/not a command", "line one \nline two", "one line", "ends", "open at the end\nlast"]


def test_chat_drops_oldest_turns(nxd):
    """A conversation past the context drops its oldest turns, the system message kept, with a note:
    before sending when the done events say it would not leave room for an answer, and on
    context_overflow from nxd; a message too long alone leaves the conversation as it was."""
    def gen(req, send):
        users = [m for m in req["messages"] if m["role"] == "user"]
        if any(len(m["content"]) > 1000 for m in users) or len(users) > 3:
            send({"id": req["id"], "event": "error", "code": "context_overflow",
                  "message": "the prompt is 9000 tokens; the context holds 2048"})
            return
        n = len(users)
        answer(f"a{n}", prompt_tokens=300 * n, completion=20)(req, send)
    nxd.handlers["generate"] = gen
    script = "q1\nq2\nq3\nq4\n" + "x" * 1200 + "\nq5\n"
    r = run(["chat", "--system", "S"], sock=nxd.path, stdin=script.encode())
    assert r.returncode == 0, r.stderr
    gens = [[m["content"] for m in q["messages"]] for q in nxd.requests if q["op"] == "generate"]
    # q4: 3 x 320 used + room for 256 fits 2048, but nxd refuses 4 user messages: q1 goes
    assert gens[3] == ["S", "q1", "a1", "q2", "a2", "q3", "a3", "q4"]
    assert gens[4] == ["S", "q2", "a2", "q3", "a3", "q4"]
    # the long message fits not even alone: the conversation stays as it was for q5 (which, with 4
    # user messages, loses q2 in turn)
    assert gens[-1] == ["S", "q3", "a3", "q4", "a3", "q5"]
    err = r.stderr.decode()
    # q1 for q4, q2 for q5; none for the long message, whose conversation came back whole
    assert err.count("oldest turn") == 2 and "(1 oldest turn dropped to fit the context of 2048 tokens)" in err, err
    assert "context_overflow" in err  # the message too long alone


def test_chat_no_note_for_turns_given_back(nxd):
    """Turns dropped to make room for a message that then fits not even alone come back with the
    conversation: no note says they were dropped."""
    def gen(req, send):
        if len(req["messages"][-1]["content"]) > 1000:
            send({"id": req["id"], "event": "error", "code": "context_overflow",
                  "message": "the prompt is 3000 tokens; the context holds 2048"})
            return
        answer("a", prompt_tokens=1000, completion=20)(req, send)
    nxd.handlers["generate"] = gen
    r = run(["chat"], sock=nxd.path, stdin=("q1\n" + "z" * 3000 + "\nq2\n").encode())
    gens = [[m["content"] for m in q["messages"]] for q in nxd.requests if q["op"] == "generate"]
    assert gens[1] == ["z" * 3000] and gens[2] == ["q1", "a", "q2"], gens  # q1 dropped for it, then back
    err = r.stderr.decode()
    assert "context_overflow" in err and "oldest turn" not in err, err


def test_chat_makes_room_before_sending(nxd):
    """The done events' usage tells what the conversation takes: a message that would leave no
    room for an answer of max_tokens goes out without the oldest turns (no answer cut short)."""
    nxd.handlers["generate"] = lambda req, send: answer(
        "ans", prompt_tokens=sum(len(m["content"]) for m in req["messages"]), completion=150)(req, send)
    big = "y" * 700
    r = run(["chat", "--system", "S", "-n", "300"], sock=nxd.path, stdin=f"{big}1\n{big}2\n{big}3\n".encode())
    assert r.returncode == 0, r.stderr
    gens = [[m["content"] for m in q["messages"]] for q in nxd.requests if q["op"] == "generate"]
    assert gens[1] == ["S", big + "1", "ans", big + "2"]
    # 1556 used + ~240 for the message + 300 of answer > 2048: the first exchange goes first
    assert gens[2] == ["S", big + "2", "ans", big + "3"]
    assert r.stderr.decode().count("(1 oldest turn dropped to fit the context of 2048 tokens)") == 1


def test_cut_answers_say_so(nxd):
    """An answer cut by max_tokens or by a full context says which, in a dim line on a terminal
    (chat: always on stderr; generate: only when stderr is a terminal)."""
    nxd.handlers["generate"] = answer("abc", reason="length", prompt_tokens=5, completion=3)
    r = run(["chat"], sock=nxd.path, stdin=b"hi\n")
    assert r.returncode == 0 and r.stderr.decode() == "(the answer was cut at 3 tokens by max_tokens)\n"
    r = run(["generate", "hi"], sock=nxd.path)
    assert r.returncode == 0 and r.stderr == b"" and r.stdout == b"abc\n"
    rc, out, _ = run_tty(["generate", "hi"], nxd.path)
    assert rc == 0 and out == b"abc\n\x1b[2m(the answer was cut at 3 tokens by max_tokens)\x1b[0m\n", out
    nxd.handlers["generate"] = answer("abc", reason="length", prompt_tokens=2045, completion=3)
    rc, out, _ = run_tty(["generate", "hi"], nxd.path)
    assert rc == 0 and b"(the answer was cut: the context of 2048 tokens is full)" in out
    env = dict(os.environ, NO_COLOR="1")
    master, slave = os.openpty()
    tty.setraw(slave)
    p = subprocess.run([NXCTL, "--socket", nxd.path, "generate", "hi"], stdout=slave, stderr=slave, env=env,
                       timeout=10)
    os.close(slave)
    out = read_until(master, b"full)")
    os.close(master)
    assert p.returncode == 0 and b"\x1b" not in out and b"(the answer was cut" in out


def test_prompt_from_stdin_rules(nxd):
    """An empty prompt is refused before anything is sent; tokenize - drops one trailing newline,
    as generate - does."""
    nxd.handlers["tokenize"] = lambda req, send: send({"id": req["id"], "event": "tokens", "tokens": [1]})
    for stdin in (b"", b"\n"):
        r = run(["generate", "-"], sock=nxd.path, stdin=stdin)
        assert r.returncode == 2 and "the prompt is empty (nothing on stdin)" in r.stderr.decode(), r.stderr
    r = run(["generate", ""], sock=nxd.path)
    assert r.returncode == 2 and "the prompt is empty" in r.stderr.decode()
    assert nxd.requests == []
    r = run(["tokenize", "-"], sock=nxd.path, stdin=b"abc\n")
    assert r.returncode == 0 and nxd.requests[-1]["text"] == "abc"
    r = run(["tokenize", "-"], sock=nxd.path, stdin=b"two\n\n")
    assert r.returncode == 0 and nxd.requests[-1]["text"] == "two\n"


def test_version():
    for flag in ("--version", "-V"):
        r = run([flag])
        assert r.returncode == 0 and re.fullmatch(rb"nxctl \d+\.\d+\.\d+ \(protocol 1\)\n", r.stdout), r.stdout


# --- the terminal as an attack surface: model and server text is shown, not obeyed

# What a model (or a hostile server) may write: OSC title change, clear
# screen, an escape sequence cut across two events, BEL, DEL, backspace, C1
# controls (U+009B is CSI), a '\r' whose '\n' comes in the next event, a bare
# '\r' that would overwrite the line, and plain text that must pass.
HOSTILE = ["Hi \x1b]0;pwned\x07", "\x1b[2J\x1b[H", "split \x1b", "[31mred", " bell\x07 del\x7f bs\x08",
           " \x01\x1f c1:\u009b31m \u0085", " cr at end\r", "\nnext line", " bare\rover", " tab\tok",
           " caf\u00e9 \U0001F600 \u00a0", " \r\r\n"]
SHOWN = ("Hi ^[]0;pwned^G^[[2J^[[Hsplit ^[[31mred bell^G del^? bs^H ^A^_ c1:<U+009B>31m <U+0085> cr at end\r\n"
         "next line bare^Mover tab\tok caf\u00e9 \U0001F600 \u00a0 ^M\r\n")
RAW = "".join(HOSTILE)


def assert_inert(out):
    """No byte a terminal would act on: C0 but '\\t' '\\n', DEL, C1 in UTF-8, '\\r' but in "\\r\\n"."""
    assert not re.search(rb"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]|\r(?!\n)", out), out


def run_tty(args, sock, stdin=subprocess.DEVNULL, stderr_tty=True, timeout=10):
    """nxctl with stdout (and stderr) on a pseudo-terminal in raw mode, so the
    bytes read are the bytes nxctl wrote. Returns (exit code, terminal bytes, stderr bytes)."""
    master, slave = os.openpty()
    tty.setraw(slave)
    p = subprocess.Popen([NXCTL, "--socket", sock] + args, stdin=stdin, stdout=slave,
                         stderr=slave if stderr_tty else subprocess.PIPE)
    os.close(slave)
    out = b""
    try:
        while True:
            r, _, _ = select.select([master], [], [], timeout)
            if not r:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: nxctl has exited
                break
            if not chunk:
                break
            out += chunk
        p.wait(timeout)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    err = p.stderr.read() if p.stderr else b""
    return p.returncode, out, err


def test_terminal_shows_control_characters(nxd):
    nxd.handlers["generate"] = stream_pieces(HOSTILE)
    rc, out, err = run_tty(["generate", "hi"], nxd.path, stderr_tty=False)
    assert rc == 0, err
    assert out.decode() == SHOWN + "\n"
    assert_inert(out)
    # --raw-output: the bytes as the model wrote them
    rc, out, err = run_tty(["generate", "--raw-output", "hi"], nxd.path, stderr_tty=False)
    assert rc == 0, err
    assert out == (RAW + "\n").encode()
    # not a terminal: byte for byte, as before
    r = run(["generate", "hi"], sock=nxd.path)
    assert r.returncode == 0 and r.stdout == (RAW + "\n").encode()


def test_terminal_non_streamed_text_and_chat(nxd):
    def done_with_text(req, send):  # a server that sends the text in done anyway
        send({"id": req["id"], "event": "done", "reason": "eos", "text": RAW, "usage": {}, "timing": {}})
    nxd.handlers["generate"] = done_with_text
    rc, out, _ = run_tty(["generate", "hi"], nxd.path)
    assert rc == 0 and out.decode() == SHOWN + "\n"
    nxd.handlers["generate"] = stream_pieces(HOSTILE)
    r_in, w_in = os.pipe()
    os.write(w_in, b"hello\nagain\n")
    os.close(w_in)
    rc, out, _ = run_tty(["chat"], nxd.path, stdin=r_in)
    os.close(r_in)
    assert rc == 0 and out.decode() == (SHOWN + "\n") * 2
    assert_inert(out)
    # the conversation keeps the exact text, whatever the terminal showed
    gens = [q for q in nxd.requests if q["op"] == "generate"]
    assert gens[-1]["messages"][1] == {"role": "assistant", "content": RAW}
    r_in, w_in = os.pipe()
    os.write(w_in, b"hello\n")
    os.close(w_in)
    rc, out, _ = run_tty(["chat", "--raw-output"], nxd.path, stdin=r_in)
    os.close(r_in)
    assert rc == 0 and out == (RAW + "\n").encode()


def test_terminal_json_lines_stay_json(nxd):
    """--json on a terminal: DEL and C1, which JSON may carry raw, become \\u
    escapes, so every line still parses to the same event."""
    nxd.handlers["generate"] = stream_pieces(HOSTILE)
    rc, out, _ = run_tty(["generate", "--json", "hi"], nxd.path)
    assert rc == 0
    assert_inert(out)
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert "".join(e["text"] for e in events if e["event"] == "token") == RAW
    assert b"\\u009b" in out and b"\\u007f" in out
    rc, out, _ = run_tty(["generate", "--json", "--raw-output", "hi"], nxd.path)
    assert rc == 0 and "\u009b".encode() in out and b"\x7f" in out


def test_terminal_server_strings(nxd):
    """Error messages, codes, status fields and adapter listings come from the
    server too: on a terminal they are shown, not obeyed, on stdout and stderr."""
    def bad(req, send):
        send({"id": req["id"], "event": "error", "code": "x\x1b[5m", "message": "no \x1b]0;t\x07 way\u009b"})
    nxd.handlers["generate"] = bad
    rc, out, _ = run_tty(["generate", "hi"], nxd.path)
    assert rc == 1
    assert out.decode() == "nxctl: no ^[]0;t^G way<U+009B> (x^[[5m)\n"
    r = run(["generate", "hi"], sock=nxd.path)  # stderr not a terminal: as sent
    assert r.stderr.decode() == "nxctl: no \x1b]0;t\x07 way\u009b (x\x1b[5m)\n"

    nxd.handlers["generate"] = lambda req, send: send(None, raw=b"\x1b[2J\x1b]0;t\x07 not json\n")
    rc, out, _ = run_tty(["generate", "hi"], nxd.path)
    assert rc == 1 and b"^[[2J^[]0;t^G not json" in out
    assert_inert(out)

    status = {"event": "status", "model": "m\x1b]0;t\x07", "arch": "\u009b", "type": "Q\x7f", "n_ctx": 8,
              "n_vocab": 9, "activations": "pre\rcise",
              "workers": [{"pid": 1, "cpu": 0, "state": "\x1b[2J", "restarts": 0}],
              "slots": {"total": 1, "used": 0, "queued": 0}, "tokens_served": 0,
              "sequences_per_step": {"mean": 0, "max": 0}, "tokens_per_s": 0, "uptime_s": 1.0, "steps": 0,
              "steps_retried": 0, "profile": {"steps": 1, "ms_per_step": {"mat\x1bmul": 1.0}}}
    nxd.handlers["status"] = lambda req, send: send(dict(status, id=req["id"]))
    rc, out, _ = run_tty(["status"], nxd.path)
    assert rc == 0
    assert_inert(out)
    text = out.decode()
    for want in ["m^[]0;t^G (<U+009B>, Q^?)", "activations pre^Mcise", "^[[2J", "mat^[mul"]:
        assert want in text, (want, text)
    rc, out, _ = run_tty(["status", "--json"], nxd.path)
    assert rc == 0
    assert_inert(out)
    assert json.loads(out) == dict(status, id=1)

    adapters = {"event": "lora_list", "adapters": [
        {"name": "a\x1b]0;t\x07", "rank": 8, "alpha": 16, "tensors": 1, "bytes": 1024, "in_use": 0,
         "path": "/x/\x1b[2J\u009b.gguf", "folded": {"order": 1, "type": "\x07"}}],
        "job": {"kind": "\x1b[1m", "adapter": "b", "done": 1, "total": 2}, "checksum": "\x1b[8m"}
    nxd.handlers["lora_list"] = lambda req, send: send(dict(adapters, id=req["id"]))
    rc, out, _ = run_tty(["lora-list"], nxd.path)
    assert rc == 0
    assert_inert(out)
    for want in ["a^[]0;t^G", "/x/^[[2J<U+009B>.gguf", "#1 ^G", "^[[1m of b", "checksum: ^[[8m"]:
        assert want in out.decode(), (want, out)

    nxd.handlers["detokenize"] = lambda req, send: send({"id": req["id"], "event": "text", "text": RAW})
    rc, out, _ = run_tty(["detokenize", "1", "2"], nxd.path)
    assert rc == 0 and out.decode() == SHOWN + "\n"
    rc, out, _ = run_tty(["detokenize", "--raw-output", "1", "2"], nxd.path)
    assert rc == 0 and out == (RAW + "\n").encode()


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_terminal_under_tmux(nxd, tmp_path):
    """In a real terminal emulator the hostile answer neither retitles the
    pane nor clears it; with --raw-output it does both (the test can tell)."""
    nxd.handlers["generate"] = stream_pieces(["first line\n", "\x1b]2;pwned\x07\x1b[2J\x1b[Hafter"])
    def run_in_pane(extra):
        sock = str(tmp_path / f"tmux{extra}.sock")  # one tmux server per run, never a stopping one

        def tmux(*args):
            return subprocess.run(["tmux", "-S", sock, "-f", "/dev/null"] + list(args), capture_output=True,
                                  text=True, timeout=10)

        cmd = f"{NXCTL} --socket {nxd.path} generate {extra} hi; echo EXIT=$?; sleep 30"
        assert tmux("new-session", "-d", "-x", "100", "-y", "20", "-s", "t", cmd).returncode == 0
        try:
            end = time.time() + 10
            screen = ""
            while "EXIT=" not in screen and time.time() < end:
                time.sleep(0.1)
                screen = tmux("capture-pane", "-p", "-t", "t").stdout
            title = tmux("display-message", "-p", "-t", "t", "#{pane_title}").stdout.strip()
            return screen, title
        finally:
            tmux("kill-server")

    screen, title = run_in_pane("")
    assert "EXIT=0" in screen, screen
    assert "first line" in screen and "^[]2;pwned^G^[[2J^[[Hafter" in screen, screen
    assert title != "pwned"
    screen, title = run_in_pane("--raw-output")
    assert "EXIT=0" in screen, screen
    assert title == "pwned" and "first line" not in screen, (title, screen)
