"""http_helpers.py - start nxd-http in front of a test nxd, and talk raw HTTP/1.1 to it."""
import contextlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import build_dir
from nxd_helpers import Daemon


class GatewayError(Exception):
    pass


class Gateway:
    """One nxd-http process on a port the kernel picks (--listen 127.0.0.1:0).

    Gateway(nxd_socket, tmp_path, args=[...]).start() waits for its
    "listening on ADDR:PORT" line; .url is then "http://127.0.0.1:PORT"."""

    def __init__(self, sock, tmp_path, args=(), name="nxd-http", listen="127.0.0.1:0", env=None, wrapper=()):
        self.sock = str(sock)
        self.dir = Path(tmp_path)
        self.log_path = self.dir / f"{name}.log"
        self.args = list(args)
        self.listen = listen
        self.wrapper = list(wrapper)
        self.env = dict(os.environ)
        for k in ("LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET"):
            self.env.pop(k, None)
        self.env.update(env or {})
        self.proc = None
        self.host = None
        self.port = None

    def argv(self):
        b = build_dir() / "nxd-http"
        if not b.is_file():
            pytest.fail(f"{b} is missing: build it with `make` (needs libmicrohttpd-dev, scripts/deps)")
        return self.wrapper + [str(b), "--socket", self.sock, "--listen", self.listen] + self.args

    def start(self, timeout=10):
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=self._log, env=self.env)
        t0 = time.time()
        while time.time() - t0 < timeout:
            m = re.search(r"listening on (\[[^\]]+\]|[0-9.]+):(\d+)", self.log())
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                return self
            if self.proc.poll() is not None:
                raise GatewayError(f"nxd-http exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        self.kill()
        raise GatewayError(f"nxd-http did not listen within {timeout} s:\n{self.log()}")

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=15):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"nxd-http did not stop within {timeout} s:\n{self.log()}")
        return self.proc.returncode if self.proc else None

    def kill(self):
        if self.alive():
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


@contextlib.contextmanager
def nxd_behind_gateway(model, tmp_path, ctx, gateway_args=()):
    """One nxd (2 workers, --ctx ctx) and one nxd-http in front of it: yields (daemon, gateway)."""
    with Daemon(model, tmp_path, workers=2, args=["--ctx", str(ctx)]) as d:
        with Gateway(d.sock, tmp_path, args=gateway_args) as g:
            yield d, g


class Conn:
    """A raw HTTP/1.1 connection with a read buffer, so pipelined responses can be read one by one."""

    def __init__(self, gw, timeout=30):
        self.s = socket.create_connection((gw.host.strip("[]"), gw.port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data if isinstance(data, bytes) else data.encode())

    def _more(self, what):
        chunk = self.s.recv(65536)
        if not chunk:
            raise EOFError(f"closed {what}: {self.buf[:200]!r}")
        self.buf += chunk

    def read_response(self, timeout=30):
        """(status, headers dict with lower-case names, body bytes); Content-Length,
        chunked and read-to-close bodies."""
        self.s.settimeout(timeout)
        while b"\r\n\r\n" not in self.buf:
            self._more("before the headers")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        body = b""
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                self._more("inside the body")
            body, self.buf = self.buf[:n], self.buf[n:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in self.buf:
                    self._more("inside a chunk size")
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    self._more("inside a chunk")
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    break
        else:
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    break
                self.buf += chunk
            body, self.buf = self.buf, b""
        return status, headers, body

    def closed_by_peer(self, timeout=5):
        """True when the server closes the connection within timeout (EOF or reset)."""
        self.s.settimeout(timeout)
        try:
            while True:
                chunk = self.s.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def raw_request(method, path, body=None, headers=None):
    """The bytes of one request (JSON body when body is not bytes)."""
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    h = {"Host": "localhost"}
    if body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(data))
    h.update(headers or {})
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode() + data


def request(gw, method, path, body=None, headers=None, timeout=60):
    """One request on a fresh connection: (status, headers, parsed JSON or the raw body)."""
    h = {"Connection": "close"}
    h.update(headers or {})
    with Conn(gw, timeout) as c:
        c.send(raw_request(method, path, body, h))
        st, hd, b = c.read_response(timeout)
    try:
        return st, hd, json.loads(b)
    except ValueError:
        return st, hd, b


def sse_events(body):
    """The data: payloads of an SSE body, '[DONE]' included as the string."""
    out = []
    for block in body.decode().split("\n\n"):
        for ln in block.split("\n"):
            if ln.startswith("data: "):
                d = ln[6:]
                out.append(d if d == "[DONE]" else json.loads(d))
    return out
