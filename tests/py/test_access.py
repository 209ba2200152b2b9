"""test_access.py - who may connect and who may change the model (docs/reliability.md 17, 24, 25), and the request
limits (docs/reliability.md 4, 13-16) with their errors. Unprivileged clients are child processes that drop to
`nobody` with chosen groups; the daemon runs as root (the tests' user)."""
import grp
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import build_dir
from nxd_helpers import Client, Daemon, wait_until

SOCKET_GROUP = "users"
ADMIN_GROUP = "staff"

# Runs in the child as another user: sends each request, collects its final event.
CHILD = r'''
import json, socket, sys
path, reqs = sys.argv[1], json.loads(sys.argv[2])
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(path)
except OSError as e:
    print(json.dumps({"connect_errno": e.errno}))
    sys.exit(0)
f = s.makefile("rb")
out = []
for r in reqs:
    s.sendall((json.dumps(r) + "\n").encode())
    while True:
        line = f.readline()
        if not line:
            out.append({"event": "eof"})
            break
        ev = json.loads(line)
        if ev.get("id") == r.get("id") and ev.get("event") != "token":
            out.append(ev)
            break
print(json.dumps(out))
'''


def need_root_and_groups():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test drops to 'nobody' in child processes")
    try:
        return (pwd.getpwnam("nobody").pw_uid, grp.getgrnam(SOCKET_GROUP).gr_gid, grp.getgrnam(ADMIN_GROUP).gr_gid)
    except KeyError as e:
        pytest.skip(f"user 'nobody' or group {SOCKET_GROUP}/{ADMIN_GROUP} missing: {e}")


def as_user(sock, reqs, uid, gid, groups):
    """Runs the requests from a process with exactly these credentials; returns its final events
    (or {"connect_errno": n} when it could not connect)."""
    r = subprocess.run(["/usr/bin/python3", "-c", CHILD, str(sock), json.dumps(reqs)], user=uid, group=gid,
                       extra_groups=groups, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def public_dir():
    """A directory 'nobody' can reach (pytest's tmp_path is under a 0700 directory)."""
    d = tempfile.mkdtemp(prefix="nxd-access-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def nxd_bin():
    p = build_dir() / "nxd"
    if not p.is_file():
        pytest.fail(f"{p} is missing: build it with `make B={build_dir().name}`")
    return p


GEN = {"op": "generate", "id": "g", "prompt": "Hi", "raw": True, "max_tokens": 3, "temperature": 0}
ADMIN_OPS = [
    {"op": "shutdown", "id": "sd"},
    {"op": "lora_load", "id": "ll", "name": "x", "path": "/nonexistent/x.gguf"},
    {"op": "lora_unload", "id": "lu", "name": "x"},
    {"op": "lora_fold", "id": "lf", "name": "x"},
    {"op": "lora_unfold", "id": "lx", "name": "x"},
    {"op": "lora_report", "id": "lr", "name": "x"},
]


def test_socket_group_admin_group_and_forbidden_ops(model_path, nxd_bin, tmp_path, public_dir):
    nobody, users, staff = need_root_and_groups()
    sock = os.path.join(public_dir, "nxd.sock")
    args = ["--ctx", "256", "--socket-group", SOCKET_GROUP, "--admin-group", ADMIN_GROUP]
    d = Daemon(model_path, tmp_path, workers=2, args=args, socket_path=sock).start()
    try:
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert (st.st_uid, st.st_gid) == (0, users)
        assert f"group '{SOCKET_GROUP}' (gid {users}) may connect" in d.log()

        # Not in the socket's group: the kernel refuses the connection.
        assert as_user(sock, [GEN], nobody, nobody_gid(), []) == {"connect_errno": 13}

        # In the socket's group, not an admin: generates, but every model-changing op is forbidden.
        evs = as_user(sock, [GEN, {"op": "status", "id": "st"}, {"op": "lora_list", "id": "ls"}] + ADMIN_OPS,
                      nobody, nobody_gid(), [users])
        gen, status, lora_list, *admin = evs
        assert gen["event"] == "done" and gen["usage"]["completion_tokens"] == 3, gen
        assert status["event"] == "status"
        assert lora_list.get("code") != "forbidden", lora_list
        for req, ev in zip(ADMIN_OPS, admin):
            assert ev["event"] == "error" and ev["code"] == "forbidden", (req, ev)
            assert f"'{req['op']}' is for admins" in ev["message"] and f"group '{ADMIN_GROUP}'" in ev["message"]
            assert f"uid {nobody}" in ev["message"], ev
        assert d.log().count("refused: not an admin") == len(ADMIN_OPS)
        assert d.proc.poll() is None

        # Admin by its gid at connect (SO_PEERCRED), or by a supplementary group (SO_PEERGROUPS):
        # the op is let through (and fails on its own merits: no such adapter).
        unload = {"op": "lora_unload", "id": "lu", "name": "x"}
        for gid, groups in [(staff, [users]), (nobody_gid(), [users, staff])]:
            (ev,) = as_user(sock, [unload], nobody, gid, groups)
            assert ev["event"] == "error" and ev["code"] == "not_found", (gid, groups, ev)
        # Root (this process) is an admin whatever the groups.
        with Client(sock) as c:
            assert c.request(unload)["code"] == "not_found"

        # An admin may shut it down: ok, every stream ends, the daemon exits 0, socket gone.
        (ev,) = as_user(sock, [{"op": "shutdown", "id": 1}], nobody, staff, [users])
        assert ev["event"] == "ok", ev
        assert d.proc.wait(15) == 0
        assert f"shutdown requested by uid {nobody}" in d.log()
        assert not os.path.exists(sock)
    finally:
        d.kill()


def nobody_gid():
    return pwd.getpwnam("nobody").pw_gid


def test_admin_by_group_database(model_path, nxd_bin, tmp_path, public_dir):
    """A user listed as a member in the group database counts as an admin even when its process
    does not carry the group (getgrouplist of the peer's uid)."""
    need_root_and_groups()
    member = None
    for g in grp.getgrall():
        for name in g.gr_mem:
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            if pw.pw_uid != 0 and pw.pw_gid != g.gr_gid:
                member = (pw, g)
                break
        if member:
            break
    if not member:
        pytest.skip("no group in the group database lists a non-root member to test with")
    pw, g = member
    sock = os.path.join(public_dir, "nxd.sock")
    d = Daemon(model_path, tmp_path, workers=1,
               args=["--ctx", "128", "--socket-group", str(pw.pw_gid), "--admin-group", g.gr_name],
               socket_path=sock).start()
    try:
        unload = {"op": "lora_unload", "id": "lu", "name": "x"}
        (ev,) = as_user(sock, [unload], pw.pw_uid, pw.pw_gid, [])
        assert ev["code"] == "not_found", ev  # let through: an admin
        (ev,) = as_user(sock, [unload], pwd.getpwnam("nobody").pw_uid, pw.pw_gid, [])
        assert ev["code"] == "forbidden", ev
    finally:
        d.stop()
        d.kill()


def test_nxctl_shutdown(model_path, nxd_bin, tmp_path, public_dir):
    nobody, users, staff = need_root_and_groups()
    # A copy nobody can run wherever the tree is (a clone under /root is 0700).
    nxctl = os.path.join(public_dir, "nxctl")
    shutil.copy2(build_dir() / "nxctl", nxctl)
    os.chmod(nxctl, 0o755)
    sock = os.path.join(public_dir, "nxd.sock")
    d = Daemon(model_path, tmp_path, workers=1, args=["--ctx", "256", "--socket-group", SOCKET_GROUP],
               socket_path=sock).start()
    try:
        # nobody (no --admin-group given): refused with the reason, exit 1, the daemon lives on.
        try:
            r = subprocess.run([nxctl, "--socket", sock, "shutdown"], capture_output=True, text=True, timeout=20,
                               user=nobody, group=nobody_gid(), extra_groups=[users])
        except PermissionError as e:
            pytest.skip(f"nobody cannot run {nxctl} ({e}): /tmp mounted noexec?")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "forbidden" in r.stderr and "no --admin-group is set" in r.stderr, r.stderr
        assert d.proc.poll() is None
        # A stream running when root shuts it down ends with reason shutdown.
        c = Client(sock)
        c.send({"op": "generate", "id": 1, "prompt": "Go", "max_tokens": 200, "ignore_eos": True})
        assert c.recv()["event"] == "token"
        r = subprocess.run([nxctl, "--socket", sock, "shutdown"], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0 and "shutting down" in r.stdout, (r.stdout, r.stderr)
        evs = list(c.events(1))
        assert evs[-1]["event"] == "done" and evs[-1]["reason"] == "shutdown", evs[-1]
        c.close()
        assert d.proc.wait(15) == 0
    finally:
        d.kill()


def test_socket_group_must_exist(model_path, nxd_bin, tmp_path):
    for opt in ("--socket-group", "--admin-group"):
        r = subprocess.run([str(nxd_bin), "--model", str(model_path), "--socket", str(tmp_path / "x.sock"), opt,
                            "no-such-group-nxd"], capture_output=True, text=True, timeout=20)
        assert r.returncode == 1 and f"{opt}: group 'no-such-group-nxd' does not exist" in r.stderr, r.stderr
        assert not (tmp_path / "x.sock").exists()


def test_adapter_paths_reveal_nothing(model_path, nxd_bin, tmp_path, public_dir):
    """lora_load from a non-root admin: a missing file, one it may not read, a FIFO, a device, /proc,
    a directory that is no adapter, a file behind a directory it cannot enter and a relative path
    all get the one same answer, so it cannot probe which files exist."""
    nobody, users, staff = need_root_and_groups()
    secret = os.path.join(public_dir, "secret.gguf")
    with open(secret, "wb") as f:
        f.write(b"GGUF" + b"\0" * 60)
    os.chmod(secret, 0o600)
    fifo = os.path.join(public_dir, "fifo")
    os.mkfifo(fifo, 0o666)
    os.chmod(fifo, 0o666)
    empty = os.path.join(public_dir, "emptydir")
    os.mkdir(empty, 0o755)
    private = os.path.join(public_dir, "private")
    os.mkdir(private, 0o700)
    hidden = os.path.join(private, "a.gguf")
    with open(hidden, "wb") as f:
        f.write(b"GGUF" + b"\0" * 60)
    os.chmod(hidden, 0o644)
    paths = [os.path.join(public_dir, "missing.gguf"), secret, fifo, "/dev/null", "/proc/self/environ", empty,
             hidden, "relative.gguf", "/etc/shadow"]
    sock = os.path.join(public_dir, "nxd.sock")
    d = Daemon(model_path, tmp_path, workers=1,
               args=["--ctx", "128", "--socket-group", SOCKET_GROUP, "--admin-group", ADMIN_GROUP],
               socket_path=sock).start()
    try:
        reqs = [{"op": "lora_load", "id": i, "name": f"a{i}", "path": p} for i, p in enumerate(paths)]
        t0 = time.time()
        evs = as_user(sock, reqs, nobody, staff, [users])
        assert time.time() - t0 < 30  # the FIFO was not opened for reading (that would block)
        for p, ev in zip(paths, evs):
            assert ev["event"] == "error" and ev["code"] == "bad_request", (p, ev)
            assert ev["message"] == f"cannot use '{p}': not a readable regular file", (p, ev)
        assert d.proc.poll() is None
    finally:
        d.stop()
        d.kill()


# ---------------------------------------------------------------- limits

def test_limits_have_clear_errors(model_path, nxd_bin, tmp_path):
    """Each limit, just past it: a stable code and a message that names the limit; the daemon and
    the connection live on."""
    args = ["--ctx", "128", "--slots", "1", "--batch", "32", "--max-queue", "1", "--max-clients", "3",
            "--max-line", "1024", "--max-tokens", "50"]
    with Daemon(model_path, tmp_path, workers=1, args=args) as d:
        with Client(d.sock) as c:
            # max_tokens past --max-tokens is capped at it, not refused (docs/protocol.md)
            ev = c.request({"op": "generate", "id": 1, "prompt": "x", "max_tokens": 51, "ignore_eos": True,
                            "stream": False})
            assert (ev["event"], ev["reason"], ev["usage"]["completion_tokens"]) == ("done", "length", 50), ev
            ev = c.request({"op": "generate", "id": 1, "prompt": "x", "max_tokens": 0})
            assert (ev["code"], ev["message"]) == (
                "out_of_range", "field 'max_tokens' must be at least 1 (more than 50 is taken as 50), got 0"), ev
            ev = c.request({"op": "generate", "id": 2, "tokens": [5] * 128})
            assert ev["code"] == "context_overflow" and "128" in ev["message"], ev
            ev = c.request({"op": "generate", "id": 3, "prompt": "word " * 150, "raw": True})
            assert ev["code"] == "context_overflow" and "context holds 128" in ev["message"], ev
            c.send(b'{"op":"tokenize","id":4,"text":"' + b"a" * 2000 + b'"}\n')
            ev = c.recv()
            assert ev["code"] == "too_large" and "1024 bytes" in ev["message"], ev
            # One slot, one queue place: the third waiting generate is refused.
            for i in (5, 6, 7):
                c.send({"op": "generate", "id": i, "prompt": "Go", "max_tokens": 50, "ignore_eos": True,
                        "stream": False})
            ev = c.recv()
            assert ev["id"] == 7 and ev["code"] == "busy" and "1 slots are busy and 1 requests are queued" in \
                ev["message"], ev
            c.send({"op": "cancel", "id": "c5", "target": 5})
            c.send({"op": "cancel", "id": "c6", "target": 6})
            ends = {}
            while len(ends) < 2:
                ev = c.recv()
                if ev["event"] == "done":
                    ends[ev["id"]] = ev["reason"]
            assert ends == {5: "cancelled", 6: "cancelled"}
            # Three connections are the limit: this one and two more; the fourth is refused.
            held = []
            for _ in range(2):
                h = Client(d.sock)
                assert h.request({"op": "status", "id": 1})["event"] == "status"
                held.append(h)
            extra = Client(d.sock)
            ev = extra.recv()
            assert ev["code"] == "busy" and "too many connections (limit 3)" in ev["message"], ev
            assert extra.recv() is None
            extra.close()
            for h in held:
                h.close()
            assert c.request({"op": "status", "id": 9})["event"] == "status"
    for bad in (["--max-adapters", "-1"], ["--max-adapter-mb", "x"], ["--max-tokens", "0"]):
        r = subprocess.run([str(nxd_bin), "--model", str(model_path)] + bad, capture_output=True, text=True,
                           timeout=10)
        assert r.returncode == 2 and bad[0] in r.stderr, (bad, r.stderr)


def test_adapter_limits(model_path, nxd_bin, tmp_path):
    """--max-adapters and --max-adapter-mb (checked by lora_load through nxd_limits_check_adapter):
    one past either gets `busy` naming the limit; unloading makes room; serving goes on."""
    import make_lora
    weights, arch, heads = make_lora.model_weights(model_path, targets=("ffn_down",))
    small = {k: v for k, v in weights.items() if k[0] == 0}
    for name, seed in (("s1", 1), ("s2", 2), ("s3", 3)):  # rank 4, one matrix: ~33 KiB as f32
        make_lora.write_gguf_lora(tmp_path / f"{name}.gguf", arch, make_lora.random_adapter(small, 4, 4, seed),
                                  alpha=4, dtype="F32", heads=heads)
    # rank 32 on all 30 layers: 32 * (1536 + 576) * 4 B * 30 = 7.7 MiB as f32; the same in f16 is held as
    # f16 where the delta converts in registers (AVX-512): 3.9 MiB
    big = make_lora.random_adapter(weights, 32, 32, 4)
    make_lora.write_gguf_lora(tmp_path / "big.gguf", arch, big, alpha=32, dtype="F32", heads=heads)
    make_lora.write_gguf_lora(tmp_path / "big16.gguf", arch, big, alpha=32, dtype="F16", heads=heads)
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    holds16 = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "f16c"))
    args = ["--ctx", "128", "--max-adapters", "2", "--max-adapter-mb", "5"]
    with Daemon(model_path, tmp_path, workers=1, args=args) as d:
        with Client(d.sock) as c:
            def load(name, path):
                return c.request({"op": "lora_load", "id": name, "name": name, "path": str(path)})
            assert load("s1", tmp_path / "s1.gguf")["event"] == "lora_loaded"
            assert load("s2", tmp_path / "s2.gguf")["event"] == "lora_loaded"
            ev = load("s3", tmp_path / "s3.gguf")
            assert ev["code"] == "busy" and "2 adapters are loaded, the limit (--max-adapters 2)" in ev["message"], ev
            assert c.request({"op": "lora_unload", "id": "u", "name": "s2"})["event"] == "ok"
            ev = load("big", tmp_path / "big.gguf")
            assert ev["code"] == "busy" and "the limit is --max-adapter-mb 5" in ev["message"], ev
            assert "the adapter needs 7." in ev["message"], ev
            assert load("s3", tmp_path / "s3.gguf")["event"] == "lora_loaded"
            names = [a["name"] for a in c.request({"op": "lora_list", "id": "l"})["adapters"]]
            assert sorted(names) == ["s1", "s3"]
            c.send({"op": "generate", "id": "g", "prompt": "Hi", "max_tokens": 3, "lora": [{"name": "s1"}]})
            for ev in c.events("g"):
                pass
            assert ev["event"] == "done", ev
            if holds16:
                assert c.request({"op": "lora_unload", "id": "u2", "name": "s3"})["event"] == "ok"
                ev = load("big16", tmp_path / "big16.gguf")  # 3.9 MiB beside s1: fits
                assert ev["event"] == "lora_loaded", ev


def test_abstract_socket_from_systemd_is_refused(model_path, nxd_bin, tmp_path):
    """An abstract socket has no file mode, so anyone could connect: nxd refuses one passed by socket
    activation, naming why, and exits non-zero."""
    if not shutil.which("systemd-socket-activate"):
        pytest.skip("systemd-socket-activate is not installed")
    name = f"@nxd-test-{os.getpid()}"
    p = subprocess.Popen(["systemd-socket-activate", "-l", name, str(nxd_bin), "--model", str(model_path),
                          "--workers", "1", "--ctx", "128"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 10
        while True:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect("\0" + name[1:])
                break
            except OSError:
                assert time.time() < deadline, "systemd-socket-activate did not listen"
                time.sleep(0.05)
        out, _ = p.communicate(timeout=30)
        s.close()
        assert p.returncode != 0
        assert b"is an abstract or unnamed socket, which no file mode protects" in out, out
    finally:
        p.kill()
