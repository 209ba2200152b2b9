"""test_memory_limits.py - nxd under memory limits, and the ways out the daemon sees.

- RLIMIT_AS: the arena reserves what the configuration can use, not a fixed
  256 GiB, so the default configuration starts under 4 GiB of address
  space; under too little it refuses, naming the limit, the need and the
  options that lower it, and the need it names is enough to start.
- A memory cgroup too small: refused at start (before the model is read, or
  once its shapes are known), never OOM-killed halfway with the socket left.
- The OOM killer's order: workers at oom_score_adj 1000, the supervisor at
  the value it was started with.
- Every signal that ends the supervisor (but SIGKILL) removes its socket.
"""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

import make_lora
from nxd_helpers import Client, Daemon, pid_alive, wait_until

MIB = 1 << 20
SMALL = ["--ctx", "256"]


def prlimit(**limits):
    if not shutil.which("prlimit"):
        pytest.skip("prlimit (util-linux) is not installed")
    return ["prlimit"] + [f"--{k}={v}" for k, v in limits.items()]


def exit_code(d, timeout=60):
    """Runs d to its exit; one that does not exit in time is killed (and the test fails)."""
    d.spawn()
    try:
        return d.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"nxd did not exit within {timeout} s:\n{d.log()}")
    finally:
        d.kill()


def refused(d, timeout=60):
    """Runs d to its exit; returns the log after checking it exited 1 and left no socket."""
    rc = exit_code(d, timeout)
    log = d.log()
    assert rc == 1, (rc, log)
    assert not os.path.exists(d.sock), log
    return log


def arena_reserved(pid):
    """Length of the supervisor's mapping of the arena memfd."""
    for line in open(f"/proc/{pid}/maps"):
        if "/memfd:nxd-arena" in line:
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            return b - a
    raise AssertionError("no nxd-arena mapping")


def greet(sock):
    with Client(sock) as c:
        toks, text, done = c.generate(prompt="Hello", max_tokens=4, temperature=0)
    assert done["event"] == "done" and len(toks) == 4, done


# ---------------------------------------------------------------- RLIMIT_AS

AS_REFUSAL = r"RLIMIT_AS \(address space\) is ([\d.]+) MiB, and nxd needs ([\d.]+) MiB of it"


def test_default_configuration_starts_under_4_gib_of_address_space(model_path, tmp_path):
    """The issue's case: 4 slots x the model's 8192 positions under prlimit --as=4G."""
    with Daemon(model_path, tmp_path, wrapper=prlimit(**{"as": 4 << 30})) as d:
        greet(d.sock)
        assert arena_reserved(d.pid) < 4 << 30
        assert "RLIMIT_AS (4096.0 MiB) leaves" in d.log()  # adapters and folds get what is left, said so


def test_too_little_address_space_is_refused_and_the_need_named_is_enough(model_path, tmp_path):
    log = refused(Daemon(model_path, tmp_path, name="1g", wrapper=prlimit(**{"as": 1 << 30})))
    m = re.search(AS_REFUSAL, log)
    assert m and float(m[1]) == 1024.0, log
    for what in ("KV cache", "--ctx", "--slots", "prlimit --as"):
        assert what in log, (what, log)
    need = float(m[2])
    assert need > 1024
    # Just below the need it names: refused the same way; just above: serves.
    log = refused(Daemon(model_path, tmp_path, name="below", wrapper=prlimit(**{"as": int((need - 16) * MIB)})))
    assert re.search(AS_REFUSAL, log), log
    with Daemon(model_path, tmp_path, name="above", wrapper=prlimit(**{"as": int((need + 16) * MIB)})) as d:
        greet(d.sock)
        greet(d.sock)


def test_model_that_cannot_be_mapped_is_refused_before_it_is_read(model_path, tmp_path):
    log = refused(Daemon(model_path, tmp_path, args=SMALL, wrapper=prlimit(**{"as": 300 * MIB})))
    assert "RLIMIT_AS (address space) is 300.0 MiB, and loading the model needs" in log, log
    assert "--mmap" in log and "bytes read into" not in log, log


def test_file_size_limit_is_an_error_not_a_signal(model_path, tmp_path):
    """The arena is a memfd: RLIMIT_FSIZE limits its ftruncate. Past it, a clear error (not SIGXFSZ)."""
    log = refused(Daemon(model_path, tmp_path, args=SMALL, wrapper=prlimit(fsize=MIB)))
    assert "ftruncate" in log and "RLIMIT_FSIZE" in log, log


# ---------------------------------------------------------------- adapters and folds in the reservation

def adapter_for_every_matrix(model, path, rank=4):
    """A rank-`rank` adapter on every adaptable matrix of model (values small, shapes what counts here)."""
    r = gguf.GGUFReader(str(model))
    arch = r.fields["general.architecture"].contents()
    heads = (int(r.fields[f"{arch}.attention.head_count"].contents()),
             int(r.fields[f"{arch}.attention.head_count_kv"].contents()))
    rng = np.random.default_rng(5)
    ab = {}
    for t in r.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in make_lora.TARGETS:
            n_out, n_in = (int(n) for n in reversed(t.shape))
            ab[(int(parts[1]), parts[2])] = (make_lora.round_to(rng.uniform(-1, 1, (rank, n_in)) / n_in, "F16"),
                                             make_lora.round_to(rng.uniform(-1, 1, (n_out, rank)) / 64, "F16"))
    make_lora.write_gguf_lora(path, arch, ab, alpha=rank, dtype="F16", heads=heads)
    return path, len(ab)


def lora_call(c, obj):
    c.send(obj)
    while True:
        e = c.recv()
        assert e is not None, obj
        if e.get("id") == obj["id"] and e.get("event") != "progress":
            return e


def test_reservation_holds_the_widest_fold(model_path, tmp_path):
    """--max-adapters 1: the reservation has room for one fold of every matrix at the widest type (f32),
    and for the packed copies of a fold to the model's own type, one after the other."""
    path, n = adapter_for_every_matrix(model_path, tmp_path / "all.gguf")
    args = SMALL + ["--max-adapters", "1", "--max-adapter-mb", "16"]
    with Daemon(model_path, tmp_path, args=args) as d, Client(d.sock) as c:
        assert arena_reserved(d.pid) < 2 << 30
        assert lora_call(c, {"id": 1, "op": "lora_load", "name": "a", "path": str(path)})["event"] == "lora_loaded"
        for i, ty in enumerate(["f32", "keep", "f16"]):
            e = lora_call(c, {"id": 10 + i, "op": "lora_fold", "name": "a", "type": ty})
            assert e["event"] == "lora_folded" and e["tensors"] == n, e
            assert lora_call(c, {"id": 20 + i, "op": "lora_unfold", "name": "a"})["event"] == "lora_unfolded"
        greet(d.sock)


def need_of(model_path, tmp_path, args):
    """The address space nxd needs for args: what is mapped before the arena and the margin, as a
    refusal of a far bigger arena (--slots 256) names them, plus the arena of args as its log says."""
    log = refused(Daemon(model_path, tmp_path, name="need", args=args + ["--slots", "256", "--batch", "256"],
                         wrapper=prlimit(**{"as": 600 * MIB})))
    m = re.search(r"MiB of it: ([\d.]+) MiB mapped already .* and ([\d.]+) MiB for heap and threads", log)
    assert m, log
    with Daemon(model_path, tmp_path, name="size", args=args) as d:
        arena = float(re.search(r"arena: ([\d.]+) MiB \(KV cache", d.log())[1])
    return float(m[1]) + float(m[2]) + arena


def test_fold_past_the_reservation_is_busy(model_path, tmp_path):
    """Under an address-space limit that leaves little room for folds, a fold that does not fit is
    refused as busy, naming the arena; the daemon serves on."""
    path, _ = adapter_for_every_matrix(model_path, tmp_path / "all.gguf")
    need = need_of(model_path, tmp_path, SMALL)
    with Daemon(model_path, tmp_path, name="tight", args=SMALL,
                wrapper=prlimit(**{"as": int((need + 48) * MIB)})) as d, Client(d.sock) as c:
        assert "for adapters and folded tensors" in d.log(), d.log()
        assert lora_call(c, {"id": 1, "op": "lora_load", "name": "a", "path": str(path)})["event"] == "lora_loaded"
        e = lora_call(c, {"id": 2, "op": "lora_fold", "name": "a", "type": "f32"})
        assert e["event"] == "error" and e["code"] == "busy", e
        assert "no room in the arena" in e["message"] and "reservation" in e["message"], e
        greet(d.sock)
        assert d.proc.poll() is None


# ---------------------------------------------------------------- memory cgroup

def _mounts():
    out = []
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        sep = f.index("-")
        dec = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), s)  # noqa: E731
        out.append((dec(f[3]), dec(f[4]), f[sep + 1], f[sep + 3].split(",") if len(f) > sep + 3 else []))
    return out


def own_memory_cgroup():
    """(directory, v2) of this process's memory cgroup, where a child with a memory limit can be made."""
    why = "no memory controller in /proc/self/cgroup"
    for line in open("/proc/self/cgroup"):
        hid, ctrls, path = line.rstrip("\n").split(":", 2)
        v2 = hid == "0" and ctrls == ""
        if not v2 and "memory" not in ctrls.split(","):
            continue
        for root, point, fstype, sopts in _mounts():
            if not (fstype == "cgroup2" if v2 else fstype == "cgroup" and "memory" in sopts):
                continue
            if root != "/" and not (path + "/").startswith(root + "/"):
                continue
            d = Path(point + (path[len(root):] if root != "/" else path))
            if v2:
                sub = (d / "cgroup.subtree_control").read_text().split() if (d / "cgroup.subtree_control").exists() else []
                if "memory" not in sub:
                    why = f"the memory controller is not enabled for children of {d} (cgroup.subtree_control)"
                    continue
            if os.access(d, os.W_OK):
                return d, v2
            why = f"{d} is not writable"
    pytest.skip(f"cannot make a memory cgroup here: {why}")


@pytest.fixture
def memcg():
    """make(limit_bytes) -> (wrapper argv that starts a command in a new child cgroup, limit file name)."""
    base, v2 = own_memory_cgroup()
    made = []

    def make(limit):
        d = base / f"nxd-test-{os.getpid()}-{len(made)}"
        d.mkdir()
        made.append(d)
        name = "memory.max" if v2 else "memory.limit_in_bytes"
        (d / name).write_text(str(limit))
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(d)], name

    yield make
    for d in made:
        for _ in range(100):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_cgroup_too_small_for_the_model_is_refused_before_reading_it(model_path, tmp_path, memcg):
    """The issue's case: the kernel used to OOM-kill nxd halfway through the read, leaving its socket."""
    wrap, name = memcg(64 * MIB)
    log = refused(Daemon(model_path, tmp_path, wrapper=wrap))
    assert f"{name} is 64.0 MiB, and the model alone needs" in log, log
    assert "--mmap" in log and "bytes read into" not in log, log


def test_cgroup_too_small_for_the_kv_cache_names_the_options(model_path, tmp_path, memcg):
    wrap, name = memcg(400 * MIB)
    log = refused(Daemon(model_path, tmp_path, name="explicit", args=["--ctx", "8192"], wrapper=wrap))
    m = re.search(rf"{re.escape(name)} is 400.0 MiB, and this configuration needs ([\d.]+) MiB", log)
    assert m and float(m[1]) > 400, log
    for what in ("the KV cache", "--slots 4 x --ctx 8192", "lower --ctx or --slots"):
        assert what in log, (what, log)
    # By default the context is cut to what fits instead, and the ready line says so.
    with Daemon(model_path, tmp_path, name="default", wrapper=wrap) as d:
        greet(d.sock)
        assert re.search(rf"4 slots x \d+ positions \(the model's context 8192 capped: .*{re.escape(name)}", d.log())
    # What the message says lowers it does: the same cgroup serves a smaller context.
    with Daemon(model_path, tmp_path, name="small", args=["--ctx", "512", "--slots", "1"], wrapper=wrap) as d:
        greet(d.sock)
        assert re.search(rf"MiB touched .* within \S+{re.escape(name)} \(400.0 MiB\)", d.log()), d.log()


# ---------------------------------------------------------------- OOM scores

def oom_adj(pid):
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def test_oom_killer_takes_a_worker_before_the_supervisor(model_path, tmp_path):
    own = oom_adj(os.getpid())
    if own >= 1000:
        pytest.skip("this test runs at oom_score_adj 1000: nothing can be below the workers")
    with Daemon(model_path, tmp_path, args=SMALL) as d:
        workers = d.worker_pids()
        assert [oom_adj(p) for p in workers] == [1000, 1000]
        assert oom_adj(d.pid) == own  # kept as started (systemd: OOMScoreAdjust=)
        # A worker the OOM killer takes is forked anew, first in line again.
        os.kill(workers[0], signal.SIGKILL)
        def ready():
            ws = d.status()["workers"]
            return all(w["state"] in ("idle", "busy") for w in ws) and [w["pid"] for w in ws if w["pid"] not in workers]
        new = wait_until(ready, what="a new worker, ready")
        assert oom_adj(new[0]) == 1000
        greet(d.sock)


def test_supervisor_as_high_as_the_workers_is_warned_about(model_path, tmp_path):
    if not shutil.which("choom"):
        pytest.skip("choom (util-linux) is not installed")
    with Daemon(model_path, tmp_path, args=SMALL, wrapper=["choom", "-n", "1000", "--"]) as d:
        assert oom_adj(d.pid) == 1000
        assert "oom_score_adj is 1000, as high as the workers'" in d.log(), d.log()


# ---------------------------------------------------------------- the socket on the way out

@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGSEGV, signal.SIGABRT])
def test_a_signal_that_ends_the_supervisor_removes_its_socket(model_path, tmp_path, sig):
    d = Daemon(model_path, tmp_path, args=SMALL, wrapper=prlimit(core=0)).start()
    try:
        workers = d.worker_pids()
        os.kill(d.pid, sig)
        assert d.proc.wait(15) == -sig  # it still dies of that signal
        assert not os.path.exists(d.sock)
        for p in workers:
            wait_until(lambda: not pid_alive(p), timeout=5, what=f"worker {p} gone")
    finally:
        d.kill()


def test_a_worker_dies_of_its_own_signals(model_path, tmp_path):
    """The supervisor's handler is not the workers': a worker sent SIGUSR1 dies of it (not of the
    sandbox, as it would calling the handler's syscalls), is forked anew, and the socket stays."""
    with Daemon(model_path, tmp_path, args=SMALL) as d:
        w = d.worker_pids()[0]
        os.kill(w, signal.SIGUSR1)
        d.wait_log(f"killed by signal {int(signal.SIGUSR1)}")
        assert "SIGSYS" not in d.log()
        wait_until(lambda: w not in d.worker_pids() and all(d.worker_pids()), what="worker respawned")
        assert os.path.exists(d.sock)
        greet(d.sock)


def test_stale_socket_behind_a_symlink_is_not_removed(model_path, tmp_path):
    import socket as so
    stale = tmp_path / "stale.sock"
    s = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    link = tmp_path / "link.sock"
    link.symlink_to(stale)
    log = refused_keep(Daemon(model_path, tmp_path, args=SMALL, socket_path=link))
    assert "not a socket" in log and link.is_symlink() and stale.exists(), log


def refused_keep(d):
    assert exit_code(d, 30) == 1, d.log()
    return d.log()
