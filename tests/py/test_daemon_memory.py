"""test_daemon_memory.py - N workers must not mean N copies: the summed PSS of the supervisor and its workers stays near one model + arena.

PSS (proportional set size) splits every shared page between the processes
that map it, so the sum over all nxd processes counts each page once. One
copy of everything is:
    copy mode (default): the arena (its memfd holds the weights too)
    --mmap:              the model file (page cache, mapped shared) + the arena
The bound: sum(PSS) <= 1.15 x one copy + 48 MiB (code, libc, the
tokenizer's tables and the sampler's per-slot buffers in the supervisor). A
design that copied the weights per worker would be over it by a whole model
per worker (~94 MiB each here). Each worker's own dirty anonymous memory
(what fork's copy-on-write gave it) must also stay small: < 16 MiB."""
import os
import re

import pytest

from nxd_helpers import Client, Daemon

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
        one_copy = arena + (fsize if mode == "mmap" else 0)
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
