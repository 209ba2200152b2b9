"""nxd_helpers.py - start/stop a real nxd on a temporary socket and talk to it like a client (raw AF_UNIX, NDJSON)."""
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from conftest import build_dir


class DaemonError(Exception):
    pass


class Daemon:
    """One nxd process with its own socket and log file.

    Daemon(model, tmp_path, workers=2, args=[...], env={...}).start() waits until
    the socket accepts (or the process exits, which raises with its log)."""

    def __init__(self, model, tmp_path, workers=2, args=(), env=None, socket_path=None, name="nxd", wrapper=()):
        self.model = str(model)
        self.dir = Path(tmp_path)
        self.sock = str(socket_path or self.dir / f"{name}.sock")
        self.log_path = self.dir / f"{name}.log"
        self.workers = workers
        self.args = list(args)
        self.wrapper = list(wrapper)  # e.g. ["strace", "-f", ...]: then proc is the wrapper
        self.env = dict(os.environ)
        self.env.pop("NOTIFY_SOCKET", None)
        self.env.pop("LISTEN_FDS", None)
        self.env.pop("LISTEN_PID", None)
        self.env.update(env or {})
        self.proc = None

    def argv(self):
        return self.wrapper + [str(build_dir() / "nxd"), "--model", self.model, "--socket", self.sock,
                "--workers", str(self.workers)] + self.args

    def spawn(self):
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=self._log, env=self.env)
        return self

    def start(self, timeout=30):
        self.spawn()
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise DaemonError(f"nxd exited with {self.proc.returncode} at start:\n{self.log()}")
            if "ready:" in self.log():
                try:
                    c = Client(self.sock)
                    c.close()
                    return self
                except OSError:
                    pass
            time.sleep(0.02)
        self.kill()
        raise DaemonError(f"nxd did not become ready in {timeout} s:\n{self.log()}")

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, text, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if text in self.log():
                return True
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the log after {timeout} s:\n{self.log()}")

    @property
    def pid(self):
        return self.proc.pid

    def status(self):
        with Client(self.sock) as c:
            return c.request({"op": "status", "id": "st"})

    def worker_pids(self):
        return [w["pid"] for w in self.status()["workers"]]

    def stop(self, sig=signal.SIGTERM, timeout=15):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"nxd did not stop within {timeout} s after signal {sig}:\n{self.log()}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        try:
            self.stop()
        finally:
            self.kill()
            self._log.close()


class Client:
    """A raw client: send JSON objects or bytes, read event lines."""

    def __init__(self, path, timeout=60, rcvbuf=None):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.buf = b""

    def send(self, obj):
        data = obj if isinstance(obj, bytes) else (json.dumps(obj) + "\n").encode()
        self.s.sendall(data)

    def recv_line(self):
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                if self.buf:
                    raise EOFError(f"connection closed mid-line: {self.buf[:200]!r}")
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def recv(self):
        """Next event as a dict, or None at EOF."""
        line = self.recv_line()
        return None if line is None else json.loads(line)

    def request(self, obj):
        """Sends one request and returns its single answer (hello, status, tokens, text, ok, error)."""
        self.send(obj)
        return self.recv()

    def events(self, rid):
        """Yields the events of request rid until its done or error event (inclusive)."""
        while True:
            ev = self.recv()
            if ev is None:
                raise EOFError(f"connection closed before request {rid} ended")
            if ev.get("id") != rid:
                continue
            yield ev
            if ev.get("event") in ("done", "error"):
                return

    def generate(self, rid=1, **kw):
        """Runs a generate to its end; returns (tokens, text, done_or_error_event)."""
        req = {"op": "generate", "id": rid}
        req.update(kw)
        self.send(req)
        toks, text = [], []
        for ev in self.events(rid):
            if ev["event"] == "token":
                toks.append(ev["token"])
                text.append(ev["text"])
            elif ev["event"] == "done" and "tokens" in ev:
                return ev["tokens"], ev.get("text", ""), ev
            else:
                return toks, "".join(text), ev

    def generate_logprobs(self, rid, req):
        """Runs a streamed generate that asks for logprobs to its end; returns (tokens, [(logprob,
        [(token, logprob) of the top ones])] per token, done event)."""
        self.send(dict(req, id=rid))
        toks, lps, done = [], [], None
        for ev in self.events(rid):
            if ev["event"] == "token":
                toks.append(ev["token"])
                lps.append((ev["logprob"], [(a["token"], a["logprob"]) for a in ev["logprobs"]]))
            else:
                done = ev
        assert done["event"] == "done", done
        return toks, lps, done

    def close(self):
        self.s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_until(pred, timeout=10, step=0.05, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"{what} not reached within {timeout} s")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
