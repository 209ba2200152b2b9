"""The AMX route through the forward pass (kern/pack_amx.c, model/forward.c: matmul_packed): steps of
many tokens take the AMX kernels, in calls of up to 16 tokens, and every logit stays bit-identical to
the AVX-512 kernels' under every batching plan and thread count, with two-part and one-part activations.

On a CPU without AMX the kernels run with each tile instruction emulated (NXD_TEST_AMX_EMULATE), which
tests the route and the data flow; where the CPU has AMX-INT8 the engine takes the tiles by itself,
and the comparison is with NX_KERN=avx512 (AMX off). tests/c/test_pack_amx.c holds the kernels to the
scalar reference bit for bit."""
import ctypes
import os
import subprocess
import zlib

import numpy as np
import pytest

import make_tiny
from conftest import build_dir, tool
from test_forward import SEQ_LENS, logits_every_plan

# The types the AMX kernels cover, each in a model of its own, and the mixes (qwen2-mixed, llama-mixed:
# their Q6_K / F16 / BF16 / F32 matrices stay on their own kernels beside them).
NAMES = [n for n, kw in make_tiny.VARIANTS
         if kw["wtype"] in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K") and "rope" not in n
         and "yarn" not in n and "hd" not in n]
KW = dict(make_tiny.VARIANTS)


def cpu_flags():
    return set(open("/proc/cpuinfo").read().split())


def amx_on_cpu():
    """Whether this CPU's engine picks amx for the pack family by itself (asked through libnx.so)."""
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_cpu_amx_request.restype = ctypes.c_bool
    so.nx_kern_set.restype = ctypes.c_int
    so.nx_kern_set.argtypes = [ctypes.c_int]
    so.nx_cpu_amx_request()
    return so.nx_kern_set(2) == 3  # NX_KFAM_PACK, NX_KSET_AMX (kern/cpu.h)


def test_tiles_are_taken_where_the_cpu_has_them():
    """Where the CPU has AMX-INT8 the engine runs the tiles themselves (so the tests below compare them,
    not the emulation, with the AVX-512 kernels); elsewhere this says so and skips."""
    if not {"amx_tile", "amx_int8"} <= cpu_flags():
        pytest.skip("AMX: not available on this CPU: the tests below run the emulated tile instructions")
    if os.environ.get("NX_KERN") not in (None, "", "amx"):
        pytest.skip(f"NX_KERN={os.environ['NX_KERN']} caps the kernels below amx")
    assert amx_on_cpu(), "the CPU has AMX-INT8 but the pack family does not run amx (tile state refused?)"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("amx")
    return {name: make_tiny.build(d / f"{name}.gguf", **KW[name]) for name in NAMES}


def seqs_for(name):
    n_vocab = KW[name].get("n_vocab", 300)  # make_tiny.build's default
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return {s: rng.integers(0, n_vocab, n) for s, n in SEQ_LENS.items()}


def with_amx(monkeypatch, on):
    """AMX on: the tiles where the CPU has them, else the emulated ones; off: the AVX-512 kernels alone."""
    monkeypatch.delenv("NXD_TEST_AMX_EMULATE", raising=False)
    monkeypatch.delenv("NX_KERN", raising=False)
    if amx_on_cpu():
        if not on:
            monkeypatch.setenv("NX_KERN", "avx512")
    elif on:
        monkeypatch.setenv("NXD_TEST_AMX_EMULATE", "1")


@pytest.fixture(scope="module", autouse=True)
def needs_avx512_tiles():
    if os.environ.get("NX_PACK") == "0" or os.environ.get("NX_KERN") in ("ref", "avx2"):
        pytest.skip("no packed AVX-512 tile kernels in this run (NX_PACK / NX_KERN): the AMX route is theirs")
    if "avx512_vnni" not in cpu_flags():
        pytest.skip("no AVX-512 VNNI on this CPU: no tile kernels, so no AMX route")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("acts", ["two-part", "one-part"])
def test_amx_route_is_bit_identical(models, name, acts, monkeypatch):
    model = models[name]
    args = ("--activations", "fast") if acts == "one-part" else ()
    seqs = seqs_for(name)
    with_amx(monkeypatch, False)
    off = logits_every_plan(model, seqs, args, ("batched", "decode"), (1, 2))
    # "batched" puts 27 tokens in one step (AMX calls of 16 and 11), "alone" 12, 9 and 6 (the last on
    # the AVX-512 kernels), "chunked" mixes both; all must equal the decode plan's one-token steps.
    with_amx(monkeypatch, True)
    on = logits_every_plan(model, seqs, args, ("batched", "alone", "chunked", "decode"), (1, 2, 3))
    assert np.array_equal(on, off), f"AMX route differs from the AVX-512 kernels by {np.abs(on - off).max()}"


def test_default_model_prefill(model_path, monkeypatch):
    """The default model's prefill of two sequences in one step (Q4_1 matrices: AMX calls of 16 tokens)."""
    rng = np.random.default_rng(7)
    seqs = {0: rng.integers(0, 49152, 21), 1: rng.integers(0, 49152, 12)}
    steps = ["step " + " ".join(f"{s}:0:{len(t)}" for s, t in seqs.items())]
    text = "".join(f"seq {s} {' '.join(map(str, t))}\n" for s, t in seqs.items()) + "\n".join(steps) + "\n"

    def run():
        p = subprocess.run([str(tool("nx-eval")), str(model_path), "--threads", "2"], input=text.encode(),
                           capture_output=True, timeout=300)
        assert p.returncode == 0, p.stderr.decode()
        return np.frombuffer(p.stdout, np.float32)

    with_amx(monkeypatch, False)
    off = run()
    with_amx(monkeypatch, True)
    on = run()
    assert np.isfinite(off).all() and np.array_equal(on, off)


def test_daemon_serves_the_same_answers(model_path, tmp_path, monkeypatch):
    """nxd itself, AMX on and off: the workers (forked after the tile state was asked for, in their
    sandbox) give every greedy token and logprob of answers to prompts of 9 to 40 tokens, 3 clients
    batched, as the AVX-512 kernels do; the start-up check of the AMX kernels passes. (The emulated
    tile instructions are scalar code, slow on a whole model: the prompts are short.)"""
    from nxd_helpers import Client, Daemon
    rng = np.random.default_rng(11)
    prompts = [list(map(int, rng.integers(300, 20000, n))) for n in (9, 17, 40)]

    def answers(tag, on):
        with_amx(monkeypatch, on)
        with Daemon(model_path, tmp_path / tag, workers=2, args=["--slots", "4"], name=tag) as d:
            with Client(d.sock) as c:
                for j, p in enumerate(prompts):
                    c.send(dict(op="generate", id=f"{tag}{j}", tokens=p, temperature=0, logprobs=2, max_tokens=16,
                                ignore_eos=True))
                got, left = {f"{tag}{j}": ([], []) for j in range(len(prompts))}, len(prompts)
                while left:  # the four answers' events interleave
                    ev = c.recv()
                    toks, lps = got[ev["id"]]
                    if ev["event"] == "token":
                        toks.append(ev["token"])
                        lps.append((ev["logprob"], [(a["token"], a["logprob"]) for a in ev["logprobs"]]))
                    else:
                        assert ev["event"] == "done" and len(toks) == 16, ev
                        left -= 1
            log = d.log()
            pack = d.status()["kernels"]["pack"]
        assert "disagrees" not in log, log
        assert pack == (("amx" if amx_on_cpu() else "amx-emulated") if on else "avx512"), pack
        return [got[f"{tag}{j}"] for j in range(len(prompts))]

    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    off = answers("off", False)
    on = answers("on", True)
    assert on == off
