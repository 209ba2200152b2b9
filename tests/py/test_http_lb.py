"""test_http_lb.py - two nodes (nxd + nxd-http, each in its own network namespace) behind nginx with the
configuration docs/http.md shows: a mixed load spreads over both, one node's nxd is killed mid-load and
restarted, and only the streams it was sending fail, each with an error event; the other node serves on
and the restarted one rejoins.

Root only (network namespaces); skips without nginx, `ip netns` or openssl. scripts/deps unpacks Debian's
nginx into ~/.cache/nxd/nginx rather than installing it (the package starts a web server on port 80 when
installed); an nginx on PATH is used first.
Traffic stays on 127.0.0.1 (client to nginx) and on the veth pairs the test makes to its own namespaces
(10.231.K.0/29); the namespaces are deleted at the end, also on failure."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT
from http_helpers import Gateway, request
from nxd_helpers import Daemon, wait_until

N_MIXED = 4       # clients sending short mixed requests
N_STREAMERS = 2   # clients sending streams; the first two are long, one on each node
LONG = 400        # tokens of the first two streams: in flight when the node dies
SHORT = 16        # tokens of a non-streamed answer
STREAM = 24       # tokens of a short stream
LOAD_LIMIT_S = 90  # the whole load, whatever happens
CHAT_PROMPTS = ["Name three colors.", "Write a haiku about the sea.", "What is a hash table?",
                "List three uses of copper.", "Say hi.", "Why is the sky blue?"]


def run(*argv, check=True):
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


NGINX_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nxd" / "nginx"


def nginx_bin():
    cached = NGINX_CACHE / "usr" / "sbin" / "nginx"
    return shutil.which("nginx") or (str(cached) if os.access(cached, os.X_OK) else None)


def skip_unless_possible():
    if os.geteuid() != 0:
        pytest.skip("needs root: the nodes run in network namespaces of their own (ip netns)")
    if not nginx_bin():
        pytest.skip(f"nginx is neither on PATH nor in {NGINX_CACHE} (scripts/deps unpacks it there)")
    for prog, pkg in (("ip", "iproute2"), ("openssl", "openssl")):
        if not shutil.which(prog):
            pytest.skip(f"{prog} is not installed (apt-get install {pkg})")
    probe = f"nxdlbprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    if p.returncode:
        pytest.skip(f"ip netns add does not work here: {p.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)


def free_subnet():
    """A 10.231.K.0/24 no interface or route of this machine uses (K from the pid, then the next free)."""
    used = run("ip", "-4", "-o", "addr").stdout + run("ip", "-4", "route").stdout
    for i in range(250):
        k = (os.getpid() + i) % 250 + 1
        if f"10.231.{k}." not in used:
            return k
    pytest.skip("no free 10.231.K.0/24 subnet")


class Net:
    """Network namespaces, each with a veth pair to the root namespace: node i is 10.231.K.(4i+2)/30,
    the root side 10.231.K.(4i+1)."""

    def __init__(self, n):
        self.k = free_subnet()
        tag = os.getpid() % 100000
        self.nodes = [{"ns": f"nxdlb{tag}n{i}", "root_if": f"nxlb{tag}r{i}", "ns_if": f"nxlb{tag}n{i}",
                       "root_addr": f"10.231.{self.k}.{4 * i + 1}", "addr": f"10.231.{self.k}.{4 * i + 2}"}
                      for i in range(n)]

    def up(self):
        for n in self.nodes:
            run("ip", "netns", "add", n["ns"])
            n["made"] = True
            run("ip", "link", "add", n["root_if"], "type", "veth", "peer", "name", n["ns_if"], "netns", n["ns"])
            run("ip", "addr", "add", f"{n['root_addr']}/30", "dev", n["root_if"])
            run("ip", "link", "set", n["root_if"], "up")
            run("ip", "-n", n["ns"], "addr", "add", f"{n['addr']}/30", "dev", n["ns_if"])
            run("ip", "-n", n["ns"], "link", "set", n["ns_if"], "up")
            run("ip", "-n", n["ns"], "link", "set", "lo", "up")
        return self

    def down(self):
        for n in self.nodes:
            if n.get("made"):
                subprocess.run(["ip", "netns", "del", n["ns"]], capture_output=True, timeout=10)
            # deleting the namespace deletes its end of the pair and so both; this only cleans up a half-made one
            subprocess.run(["ip", "link", "del", n["root_if"]], capture_output=True, timeout=10)

    def exec_in(self, i):
        return ["ip", "netns", "exec", self.nodes[i]["ns"]]


def nginx_site(doc_path, repl):
    """The nginx block of docs/http.md's section on nginx, with each (old, new) replaced exactly once."""
    text = Path(doc_path).read_text()
    sec = text[text.index("## Deployment: nginx in front"):]
    m = re.search(r"```nginx\n(.*?)```", sec, re.S)
    assert m, "docs/http.md: no nginx block in the nginx section"
    conf = m.group(1)
    for old, new in repl:
        assert conf.count(old) == 1, f"docs/http.md's nginx block should hold {old!r} once"
        conf = conf.replace(old, new)
    return conf


class Nginx:
    def __init__(self, d, site):
        self.dir = Path(d)
        (self.dir / "tmp").mkdir(parents=True, exist_ok=True)
        (self.dir / "nxd.conf").write_text(site)
        tmp = self.dir / "tmp"
        (self.dir / "nginx.conf").write_text(f"""
user root;
worker_processes 2;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log info;
events {{ worker_connections 512; }}
http {{
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    access_log off;
    include {self.dir}/nxd.conf;
}}
""")
        self.argv = [nginx_bin(), "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c",
                     str(self.dir / "nginx.conf")]
        self.proc = None

    def start(self, port):
        t = subprocess.run(self.argv + ["-t"], capture_output=True, text=True, timeout=30)
        assert t.returncode == 0, f"nginx -t:\n{t.stderr}"
        self.log = open(self.dir / "nginx.out", "ab")
        self.proc = subprocess.Popen(self.argv + ["-g", "daemon off;"], stdout=self.log, stderr=self.log)

        def listening():
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited with {self.proc.returncode}:\n{self.error_log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_until(listening, timeout=10, what="nginx listening")
        return self

    def error_log(self):
        try:
            return (self.dir / "error.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc:
            self.log.close()


LOG_RE = re.compile(r'"(?P<req>[^"]*)" (?P<status>\d+) (?P<bytes>\d+) (?P<rt>[\d.]+) '
                    r'upstream=(?P<up>.*?) upstream_status=(?P<ups>.*?) id=(?P<id>\S+)$')


def access_log(path):
    """{request id: {"status", "upstreams": [addr...], "upstream_status": [...]}} of every line so far."""
    out = {}
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return out
    for ln in lines:
        m = LOG_RE.search(ln)
        if not m or m["id"] == "-":
            continue
        out[m["id"]] = {"status": int(m["status"]), "upstreams": [u.strip() for u in m["up"].split(",")],
                        "upstream_status": [s.strip() for s in m["ups"].split(",")], "line": ln}
    return out


class Front:
    """Keep-alive HTTPS connections to nginx, one per client thread, verified against the test's CA."""

    def __init__(self, port, cafile):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(cafile))

    def conn(self):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=60)


def gen_body(kind, model, rid, n, long=False):
    prompt = CHAT_PROMPTS[rid % len(CHAT_PROMPTS)]
    common = {"model": model, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    if kind.startswith("chat"):
        body = dict(common, messages=[{"role": "user", "content": prompt}])
    else:
        body = dict(common, prompt=f"Question: {prompt}\nAnswer:")
    if kind.endswith("stream"):
        body.update(stream=True, stream_options={"include_usage": True})
    return body


KINDS = ["chat", "completion_stream", "tokenize", "completion", "ollama", "chat_stream", "models"]


def one_request(front, holder, kind, rid, model, n_stream=STREAM, on_first=None, live=None):
    """Sends one request on the thread's connection; returns its record. A failed connection is
    dropped and the next request opens a new one. on_first: called at a stream's first event; live: a
    dict that gets the record at once (its events grow as they come)."""
    path, method, body, stream, want = {
        "chat": ("/v1/chat/completions", "POST", lambda: gen_body("chat", model, rid, SHORT), False, SHORT),
        "completion": ("/v1/completions", "POST", lambda: gen_body("completion", model, rid, SHORT), False, SHORT),
        "chat_stream": ("/v1/chat/completions", "POST", lambda: gen_body("chat_stream", model, rid, n_stream),
                        True, n_stream),
        "completion_stream": ("/v1/completions", "POST",
                              lambda: gen_body("completion_stream", model, rid, n_stream), True, n_stream),
        "ollama": ("/api/chat", "POST", lambda: {"model": model, "stream": False, "options": {
            "num_predict": SHORT, "temperature": 0}, "messages": [{"role": "user", "content": "Say hi."}]},
                   False, None),
        "tokenize": ("/tokenize", "POST", lambda: {"prompt": CHAT_PROMPTS[rid % len(CHAT_PROMPTS)]}, False, None),
        "models": ("/v1/models", "GET", lambda: None, False, None),
    }[kind]
    rec = {"id": f"lb-{rid}", "kind": kind, "stream": stream, "want": want, "t0": time.time(), "t_first": None,
           "events": [], "status": None, "exc": None}
    if live is not None:
        live["rec"] = rec
    b = body()
    try:
        if holder[0] is None:
            holder[0] = front.conn()
        c = holder[0]
        c.request(method, path, body=None if b is None else json.dumps(b),
                  headers={"Content-Type": "application/json", "X-Request-Id": rec["id"]})
        r = c.getresponse()
        rec["status"] = r.status
        if stream and r.status == 200:
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    if rec["t_first"] is None:
                        rec["t_first"] = time.time()
                        if on_first:
                            on_first()
                    d = line[6:].strip()
                    rec["events"].append(d.decode() if d == b"[DONE]" else json.loads(d))
                    if d == b"[DONE]":
                        break
            rest = r.read()  # the last chunk of the chunked encoding
            assert not rest.strip(), rest
            if "[DONE]" not in rec["events"]:  # cut: the connection is gone with the stream
                rec["exc"] = "the stream ended early"
                c.close()
                holder[0] = None
        else:
            raw = r.read()
            rec["body"] = json.loads(raw) if raw else None
        if r.will_close:
            c.close()
            holder[0] = None
    except (http.client.HTTPException, OSError, ValueError) as e:
        rec["exc"] = f"{type(e).__name__}: {e}"
        if holder[0] is not None:
            holder[0].close()
        holder[0] = None
    rec["t1"] = time.time()
    return rec


def outcome(rec):
    """'ok' (a whole answer), 'cut' (a stream that began and ended with an error event, no [DONE]) or
    'failed: why'."""
    if rec["stream"] and rec["status"] == 200 and rec["events"]:
        ev = rec["events"]
        if ev[-1] == "[DONE]":
            usage = ev[-2].get("usage") if len(ev) >= 2 and isinstance(ev[-2], dict) else None
            if not usage or usage["completion_tokens"] != rec["want"]:
                return f"failed: stream usage {usage}, want {rec['want']} tokens"
            fin = [c.get("finish_reason") for e in ev if isinstance(e, dict) for c in e.get("choices", [])]
            return "ok" if "length" in fin else f"failed: finish reasons {fin}"
        if any(isinstance(e, dict) and "error" in e for e in ev) and "[DONE]" not in ev:
            return "cut"
        return f"failed: stream ended without [DONE] or an error event ({rec['exc']})"
    if rec["exc"]:
        return f"failed: {rec['exc']}"
    if rec["status"] != 200:
        return f"failed: HTTP {rec['status']}: {str(rec.get('body'))[:200]}"
    b = rec.get("body") or {}
    k = rec["kind"]
    if k in ("chat", "completion"):
        ch = b["choices"][0]
        text = ch["message"]["content"] if k == "chat" else ch["text"]
        if b["usage"]["completion_tokens"] != rec["want"] or ch["finish_reason"] != "length" or not text:
            return f"failed: {b}"
    elif k == "ollama" and not (b.get("done") and b["message"]["content"]):
        return f"failed: {b}"
    elif k == "tokenize" and not b.get("tokens"):
        return f"failed: {b}"
    elif k == "models" and not b.get("data"):
        return f"failed: {b}"
    return "ok"


def metric_200(gw, endpoints):
    st, _, body = request(gw, "GET", "/metrics", timeout=10)
    assert st == 200
    n = 0
    for ep in endpoints:
        for m in re.finditer(rf'nxd_http_requests_total{{endpoint="{ep}",status="200"}} (\d+)', body.decode()):
            n += int(m.group(1))
    return n


def test_two_nodes_behind_nginx(model_path, tmp_path):
    skip_unless_possible()
    net = Net(2)
    procs = []  # what to stop at the end, newest first
    try:
        net.up()
        cpus = sorted(os.sched_getaffinity(0))
        nodes = []
        for i, n in enumerate(net.nodes):
            d_dir = tmp_path / f"node{i}"
            d_dir.mkdir()
            # One CPU per node where there are two, as on two machines.
            pin = ["taskset", "-c", str(cpus[i % len(cpus)])] if len(cpus) >= 2 and shutil.which("taskset") else []
            wrap = net.exec_in(i) + pin
            d = Daemon(model_path, d_dir, workers=1, args=["--ctx", "1024", "--slots", "6"], wrapper=wrap)
            procs.append(d)
            d.start()
            g = Gateway(d.sock, d_dir, listen=f"{n['addr']}:8080", wrapper=net.exec_in(i))
            procs.append(g)
            g.start()
            assert (g.host, g.port) == (n["addr"], 8080), g.log()
            wait_until(lambda: request(g, "GET", "/health", timeout=5)[0] == 200, timeout=10, what="node healthy")
            nodes.append({"d": d, "g": g, "up": f"{n['addr']}:8080", "wrap": wrap, "dir": d_dir})
        A, B = nodes

        # The certificate nginx serves, and the client's trust in it.
        ngx_dir = tmp_path / "nginx"
        ngx_dir.mkdir()
        cert, key = ngx_dir / "llm.pem", ngx_dir / "llm.key"
        run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "1", "-subj", "/CN=llm.example.com", "-addext",
            "subjectAltName=DNS:llm.example.com,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        alog = ngx_dir / "nxd-access.log"
        site = nginx_site(ROOT / "docs" / "http.md", [
            ("listen 443 ssl http2;", f"listen 127.0.0.1:{port} ssl http2;"),
            ("server 10.0.0.11:8080", f"server {A['up']}"),
            ("server 10.0.0.12:8080", f"server {B['up']}"),
            ("/etc/ssl/llm.example.com.pem", str(cert)),
            ("/etc/ssl/private/llm.example.com.key", str(key)),
            ("/var/log/nginx/nxd.log", str(alog)),
        ])
        ngx = Nginx(ngx_dir, site)
        procs.append(ngx)
        ngx.start(port)
        front = Front(port, cert)
        counter = iter(range(1, 1 << 30))

        def front_get(path):
            c = front.conn()
            try:
                c.request("GET", path, headers={"X-Request-Id": f"front-{next(counter)}"})
                r = c.getresponse()
                return r.status, json.loads(r.read())
            finally:
                c.close()

        st, models = front_get("/v1/models")
        assert st == 200
        model = models["data"][0]["id"]
        st, h = front_get("/health")
        assert st == 200 and h["status"] == "ok", h

        # ---- the load
        records, lock, stop = [], threading.Lock(), threading.Event()
        t_load_end = time.time() + LOAD_LIMIT_S
        longs = {}

        def add(rec):
            with lock:
                records.append(rec)

        def mixed(k):
            holder = [None]
            j = k
            while not stop.is_set() and time.time() < t_load_end:
                with lock:
                    rid = next(counter)
                add(one_request(front, holder, KINDS[j % len(KINDS)], rid, model))
                j += 1
            if holder[0]:
                holder[0].close()

        def streamer(k, first_started):
            holder = [None]
            # The first stream of each is long, sent once the previous one has its first token, so that
            # least_conn puts one on each node.
            if k > 0 and not first_started[k - 1].wait(60):
                return
            with lock:
                rid = next(counter)
            longs[k] = {}
            r = one_request(front, holder, "chat_stream", rid, model, n_stream=LONG, on_first=first_started[k].set,
                            live=longs[k])
            longs[k]["r"] = r
            add(r)
            while not stop.is_set() and time.time() < t_load_end:
                with lock:
                    rid = next(counter)
                add(one_request(front, holder, "chat_stream" if rid % 2 else "completion_stream", rid, model))
            if holder[0]:
                holder[0].close()

        first_started = [threading.Event() for _ in range(N_STREAMERS)]
        threads = [threading.Thread(target=streamer, args=(k, first_started), daemon=True)
                   for k in range(N_STREAMERS)]
        for t in threads:
            t.start()
        for e in first_started:
            assert e.wait(30), "a long stream got no first token within 30 s"
        # One long stream on each node: each nxd has exactly one sequence.
        assert [nd["d"].status()["slots"]["used"] for nd in nodes] == [1, 1], "the long streams are not split"
        t_load = time.time()
        mt = [threading.Thread(target=mixed, args=(k,), daemon=True) for k in range(N_MIXED)]
        for t in mt:
            t.start()
        threads += mt

        def served_ok(up, after=0.0):
            """Requests sent after `after` whose answer came from node `up` (per nginx's log) and were whole."""
            log = access_log(alog)
            with lock:
                recs = list(records)
            return [r for r in recs if r["t0"] >= after and r["id"] in log and log[r["id"]]["upstreams"][-1] == up
                    and outcome(r) == "ok"]

        # ---- phase 1: both nodes serve, until they have served 5 each for 3 s or a long stream is 40%
        # through (a fast machine), whichever comes first
        def long_progress():
            return min(len(longs[k]["rec"]["events"]) for k in longs) / LONG

        wait_until(lambda: (time.time() - t_load > 3 and all(len(served_ok(nd["up"])) >= 5 for nd in nodes))
                   or long_progress() >= 0.4, timeout=40, step=0.1, what="both nodes serving")
        assert all(longs[k].get("r") is None for k in longs), "a long stream ended before the kill"

        # ---- kill node A's nxd in the middle of its long stream
        with open(f"/proc/{A['d'].pid}/comm") as f:  # ip netns exec and taskset exec: the pid is nxd's
            assert f.read().strip() == "nxd"
        # t_kill .. t_dead: the kill on its way; a request sent in between may still be answered by A
        t_kill = time.time()
        A["d"].proc.kill()
        A["d"].proc.wait(10)
        t_dead = time.time()
        wait_until(lambda: request(A["g"], "GET", "/health", timeout=5)[0] == 503, timeout=5,
                   what="node A's /health 503")
        st, body = request(A["g"], "GET", "/health", timeout=5)[::2]
        assert st == 503 and "unreachable" in body["reason"], body
        st, h = front_get("/health")
        assert st == 200 and h["status"] == "ok", f"the front's /health while a node is down: {st} {h}"
        time.sleep(2.0)  # the survivor carries the load alone

        # ---- restart it
        d2 = Daemon(model_path, A["dir"], workers=1, args=["--ctx", "1024", "--slots", "6"], wrapper=A["wrap"],
                    socket_path=A["d"].sock, name="nxd-restarted")
        procs.append(d2)
        d2.start()
        t_ready = time.time()
        wait_until(lambda: request(A["g"], "GET", "/health", timeout=5)[0] == 200, timeout=10,
                   what="node A's /health 200 again")
        wait_until(lambda: len(served_ok(A["up"], after=t_ready)) >= 3, timeout=20, step=0.2,
                   what="the restarted node serving 3 requests through nginx")
        t_rejoined = min(r["t0"] for r in served_ok(A["up"], after=t_ready))
        time.sleep(2.0)  # both again
        stop.set()
        for t in threads:
            t.join(timeout=max(1.0, t_load_end + 30 - time.time()))
        assert not any(t.is_alive() for t in threads), "a client thread did not finish"
        t_end = time.time()

        # ---- what happened to every request
        # nginx writes a request's line once it is done with it, which may be just after the client is.
        for _ in range(50):
            log = access_log(alog)
            missing = [r for r in records if r["id"] not in log]
            if not missing:
                break
            time.sleep(0.1)
        assert not missing, [(r["id"], r["kind"], r["status"], r["exc"], r["t0"] - t_kill, r["t1"] - t_kill)
                             for r in missing[:5]]
        by = {"ok": [], "cut": [], "failed": []}
        for r in records:
            o = outcome(r)
            by["failed" if o.startswith("failed") else o].append((r, o))
        fails = [(r["id"], r["kind"], o, log[r["id"]]["line"]) for r, o in by["failed"]]
        assert not fails, f"requests lost: {fails[:10]}"

        # Only streams that had begun on A when its nxd died were cut, each with an error event.
        for r, _ in by["cut"]:
            lg = log[r["id"]]
            assert r["stream"] and lg["upstreams"] == [A["up"]], (r["id"], lg["line"])
            # Sent before A's nxd was gone and begun (its first token may reach the client after the kill: it
            # was on its way), ended by the kill.
            assert r["t0"] < t_dead and r["t_first"] is not None and t_kill < r["t1"] < t_kill + 10, \
                (r["id"], r["t0"], r["t_first"], r["t1"], t_kill, t_dead)
            err = [e for e in r["events"] if isinstance(e, dict) and "error" in e]
            assert len(err) == 1 and r["events"][-1] is err[0], r["events"][-3:]
        cut_ids = {r["id"] for r, _ in by["cut"]}
        long_recs = [longs[k]["r"] for k in sorted(longs)]
        on_a = [r for r in long_recs if log[r["id"]]["upstreams"][-1] == A["up"]]
        on_b = [r for r in long_recs if log[r["id"]]["upstreams"][-1] == B["up"]]
        assert len(on_a) == 1 and len(on_b) == 1, [log[r["id"]]["line"] for r in long_recs]
        assert on_a[0]["id"] in cut_ids, "the long stream on the killed node was not cut"
        assert outcome(on_b[0]) == "ok" and on_b[0]["t1"] > t_kill, "the survivor's long stream did not finish"

        # Spread: before the kill both nodes served a fair share.
        pre = [r for r in records if r["t1"] < t_kill and outcome(r) == "ok"]
        pre_a = sum(log[r["id"]]["upstreams"][-1] == A["up"] for r in pre)
        pre_b = sum(log[r["id"]]["upstreams"][-1] == B["up"] for r in pre)
        assert min(pre_a, pre_b) >= 0.25 * len(pre), (pre_a, pre_b)

        # While A's nxd was down every request went to B; those nginx tried on A first were resent.
        down = [r for r in records if t_dead < r["t0"] and r["t1"] < t_ready]
        assert len(down) >= 5, "the survivor served too few requests while the other node was down"
        assert all(log[r["id"]]["upstreams"][-1] == B["up"] for r in down), \
            [log[r["id"]]["line"] for r in down if log[r["id"]]["upstreams"][-1] != B["up"]]
        retried = [r for r in records if len(log[r["id"]]["upstreams"]) > 1]
        for r in retried:
            lg = log[r["id"]]
            assert lg["upstreams"] == [A["up"], B["up"]] and lg["upstream_status"][0] in ("503", "502"), lg["line"]
        in_flight_resent = [r for r in retried if r["t0"] < t_kill]

        # nginx's log and each node's own count agree on who answered what (every 200 an upstream sent,
        # cut streams included: their status went out before the token that never came).
        for nd in nodes:
            sent = sum(1 for lg in log.values() for u, s in zip(lg["upstreams"], lg["upstream_status"])
                       if u == nd["up"] and s == "200" and not lg["line"].split('"')[1].startswith("GET /health"))
            got = metric_200(nd["g"], ["chat_completions", "completions", "ollama_chat", "tokenize", "models"])
            assert got == sent, (nd["up"], got, sent)

        # Once back, the restarted node takes its share again.
        back = [r for r in records if r["t0"] > t_rejoined and outcome(r) == "ok"]
        back_a = sum(log[r["id"]]["upstreams"][-1] == A["up"] for r in back)
        assert back_a >= 0.25 * len(back), (back_a, len(back))

        per = {nd["up"]: sum(log[r["id"]]["upstreams"][-1] == nd["up"] for r, _ in by["ok"]) for nd in nodes}
        print(f"\nlb: {len(records)} requests in {t_end - t_load:.1f} s: {len(by['ok'])} whole, "
              f"{len(by['cut'])} streams cut on the killed node, 0 lost; served by A {per[A['up']]}, "
              f"B {per[B['up']]} (before the kill A {pre_a}, B {pre_b}); {len(down)} while A was down, all on B; "
              f"{len(retried)} resent from A to B by nginx ({len(in_flight_resent)} of them in flight at the kill); "
              f"A rejoined {t_rejoined - t_ready:.1f} s after its nxd was ready "
              f"({t_ready - t_kill:.1f} s after the kill), then served {back_a} of {len(back)}")
        assert t_rejoined - t_ready < 5 + 2, "the restarted node took longer than fail_timeout to rejoin"
        assert "upstream prematurely closed" in ngx.error_log() or by["cut"]
    finally:
        for p in reversed(procs):
            try:
                p.stop()
            except Exception:
                pass
            try:
                p.kill()
            except Exception:
                pass
        net.down()

