"""test_daemon_memory.py - N workers must not mean N copies: the summed PSS of the supervisor and its workers stays near one model + arena.

PSS (proportional set size) splits every shared page between the processes
that map it, so the sum over all nxd processes counts each page once. One
copy of everything is the arena + the model file, which is
    copy mode (default): read into the supervisor's private memory before the
                         workers are forked, shared with them copy-on-write and
                         never written (on 2 MiB pages where the kernel allows)
    --mmap:              the page cache, mapped shared
The bound: sum(PSS) <= 1.15 x one copy + 48 MiB (code, libc, the
tokenizer's tables and the sampler's per-slot buffers in the supervisor). A
design that copied the weights per worker would be over it by a whole model
per worker (~94 MiB each here). Each worker's own dirty anonymous memory
(what fork's copy-on-write gave it) must also stay small: < 16 MiB."""
import os
import re
import signal

import pytest

from nxd_helpers import Client, Daemon, pid_alive, wait_until

MIB = 1 << 20


def rollup(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m:
                out[m.group(1)] = int(m.group(2)) * 1024
    return out


def anon_dirty(pid):
    """Private dirty bytes outside shared mappings (heap, stack, COW'd data)."""
    total = 0
    shared = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                shared = line.split()[1].endswith("s")  # perms like rw-s
            elif line.startswith("Private_Dirty:") and not shared:
                total += int(line.split()[1]) * 1024
    return total


def arena_size(pid):
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:nxd-arena"):
            return os.stat(f"/proc/{pid}/fd/{fd}").st_size
    raise AssertionError("the supervisor holds no nxd-arena memfd")


@pytest.mark.parametrize("mode", ["copy", "mmap"])
def test_pss_is_one_copy(model_path, tmp_path, mode, report):
    args = ["--ctx", "512", "--slots", "4"] + (["--mmap"] if mode == "mmap" else [])
    with Daemon(model_path, tmp_path, workers=2, args=args) as d:
        # Touch everything a step touches: weights, KV, activations, logits.
        with Client(d.sock) as c:
            toks, text, done = c.generate(prompt="The capital of France is", raw=True, temperature=0,
                                          max_tokens=8)
            assert done["event"] == "done" and "Paris" in text
        pids = [d.pid] + d.worker_pids()
        pss = {p: rollup(p)["Pss"] for p in pids}
        arena = arena_size(d.pid)
        fsize = os.path.getsize(model_path)
        one_copy = arena + fsize
        bound = 1.15 * one_copy + 48 * MIB
        total = sum(pss.values())
        dirty = {p: anon_dirty(p) for p in pids[1:]}
        report(f"memory ({mode}): PSS supervisor {pss[d.pid] / MIB:.1f} MiB, workers "
               + ", ".join(f"{pss[p] / MIB:.1f}" for p in pids[1:])
               + f" MiB; sum {total / MIB:.1f} MiB <= bound {bound / MIB:.1f} MiB "
               f"(arena {arena / MIB:.1f} MiB, file {fsize / MIB:.1f} MiB); worker private dirty "
               + ", ".join(f"{v / MIB:.1f}" for v in dirty.values()) + " MiB")
        assert total <= bound, (pss, arena, fsize)
        for p, v in dirty.items():
            assert v < 16 * MIB, (p, v)
        # The model is not in the workers' private memory: their PSS is at most about half of it.
        for p in pids[1:]:
            assert pss[p] < 0.75 * one_copy, (p, pss[p], one_copy)


def test_weights_on_huge_pages(model_path, tmp_path, report):
    """Copy mode: the weights are on 2 MiB pages (shm/hugemem.h) in every worker, one respawned after a kill
    too, and the answer is the one NX_HUGE=0 (4 KiB pages) gives. Where the kernel gives no huge pages the
    daemon says so in its log and runs on 4 KiB ones: skipped then."""
    args = ["--ctx", "512", "--slots", "2"]
    ask = dict(prompt="The capital of France is", raw=True, temperature=0, max_tokens=8)
    with Daemon(model_path, tmp_path, workers=2, args=args, env={"NX_HUGE": "0"}, name="small") as d:
        assert "the weights are on 4 KiB pages (NX_HUGE=0)" in d.log()
        with Client(d.sock) as c:
            want = c.generate(**ask)
        assert want[2]["event"] == "done" and "Paris" in want[1]

    with Daemon(model_path, tmp_path, workers=2, args=args) as d:
        m = re.search(r"model: ([0-9.]+) of ([0-9.]+) MiB of weights on 2 MiB pages", d.log())
        if not m:
            line = [l for l in d.log().splitlines() if "4 KiB pages" in l]
            assert line, d.log()  # the fallback is logged
            pytest.skip(line[0])
        huge = float(m.group(1)) * MIB
        assert huge > 0
        with Client(d.sock) as c:
            assert c.generate(**ask)[:2] == want[:2]
        old = d.worker_pids()
        os.kill(old[1], signal.SIGKILL)
        d.wait_log("killed by signal 9")
        pids = wait_until(lambda: (p := d.worker_pids())[1] != old[1] and pid_alive(p[1]) and p, what="respawn")
        with Client(d.sock) as c:
            assert c.generate(**ask)[:2] == want[:2]
        got = {p: rollup(p) for p in pids}
        report("huge pages: supervisor %.1f MiB of weights on 2 MiB pages; workers (one respawned) map "
               % (huge / MIB) + ", ".join(f"{r['AnonHugePages'] / MIB:.1f}" for r in got.values()) + " MiB")
        for p, r in got.items():
            # The supervisor's huge pages, not copies: shared, so nothing private to this worker.
            assert r["AnonHugePages"] >= huge, (p, r, huge)
            assert anon_dirty(p) < 16 * MIB, (p, anon_dirty(p))
