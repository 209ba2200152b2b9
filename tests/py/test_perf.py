"""test_perf.py - the daemon's fast paths: weights packed in place for the tile kernels
(kern/pack.h, model/repack.h) compute what nx-eval's packed copy computes, the AVX2 kernels
(NX_KERN=avx2) and the plain layout (NX_PACK=0) still serve, --activations fast serves
nx-eval's one-part tokens, and NXD_PROFILE=1 puts the per-phase split in status."""
import os
import subprocess

from conftest import build_dir
from nxd_helpers import Client, Daemon

PROMPT = "The capital of France is"
GREEDY = dict(raw=True, temperature=0, max_tokens=10, ignore_eos=True)
# the workers' phases, then their wait for the next step while the supervisor takes its turn
PHASES = ["matmul", "logits", "attention", "norm+quant", "rope+kv", "barrier", "supervisor"]


def generate(daemon):
    with Client(daemon.sock) as c:
        ids = c.request({"op": "tokenize", "id": "t", "text": PROMPT})["tokens"]
        toks, _, done = c.generate(rid=1, prompt=PROMPT, **GREEDY)
        assert done["event"] == "done", done
        return ids, toks


def nx_eval_generate(model, ids, n, cpus=None, env=None, args=()):
    """nx-eval's greedy tokens; cpus: the CPUs it may use (its packing runs one thread per CPU);
    env: variables added to its environment; args: more options."""
    out = subprocess.run([str(build_dir() / "nx-eval"), str(model), "--threads", "2", "--generate", str(n),
                          "--prompt-ids", ",".join(map(str, ids)), *args], capture_output=True, check=True,
                         timeout=120,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
                         env={**os.environ, **(env or {})})
    return [int(t) for t in out.stdout.split()]


def test_packed_daemon_matches_nx_eval(model_path, tmp_path):
    """In-place packing in the arena gives the same logits as nx-eval's packed copy:
    the same greedy tokens (bit-identity across batching makes them equal, not close)."""
    with Daemon(model_path, tmp_path, name="nxd-a", workers=2) as d:
        ids, toks = generate(d)
        assert "matrices packed for the tile kernels" in d.log()
    assert toks == nx_eval_generate(model_path, ids, GREEDY["max_tokens"])
    # Packed by one thread instead of one per CPU (model/repack.c): the same bytes, the same tokens.
    assert toks == nx_eval_generate(model_path, ids, GREEDY["max_tokens"], cpus={min(os.sched_getaffinity(0))})


def test_avx2_daemon_matches_nx_eval(model_path, tmp_path):
    """What a CPU without AVX-512 runs (NX_KERN=avx2 makes this one do it: the AVX2 dot
    products, plain layouts, scalar attention) serves from the same binary, the sandboxed
    workers included, and gives nx-eval's greedy tokens under the same kernels."""
    env = {"NX_KERN": "avx2"}
    with Daemon(model_path, tmp_path, name="nxd-k", workers=2, env=env) as d:
        ids, toks = generate(d)
        assert "model: 0 matrices packed" in d.log()
        k = d.status()["kernels"]
        assert k["pack"] == "ref" and k["attn"] == "ref" and k["dot"] in ("avx2", "ref"), k
    assert len(toks) == GREEDY["max_tokens"]
    assert toks == nx_eval_generate(model_path, ids, GREEDY["max_tokens"], env=env)


def logprobs(daemon):
    """The greedy tokens' log-probabilities."""
    with Client(daemon.sock) as c:
        c.send({"op": "generate", "id": 1, "prompt": PROMPT, "logprobs": 1, **GREEDY})
        out = []
        while (ev := c.recv())["event"] != "done":
            out += [t["logprob"] for t in ev.get("logprobs", [])]
        return out


def test_fast_activations_daemon_matches_nx_eval(model_path, tmp_path):
    """nxd --activations fast: status, nxctl status and the ready line say so, the greedy
    tokens are nx-eval's under the same option (tests/py/test_forward.py holds that mode to
    the one-part reference), and the logits are not the default (precise) daemon's."""
    with Daemon(model_path, tmp_path, name="nxd-f", workers=2, args=("--activations", "fast")) as d:
        ids, toks = generate(d)
        fast = logprobs(d)
        assert d.status()["activations"] == "fast"
        assert "fast activations" in d.log()
        r = subprocess.run([str(build_dir() / "nxctl"), "--socket", str(d.sock), "status"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0 and "activations fast" in r.stdout, r.stdout
    assert toks == nx_eval_generate(model_path, ids, GREEDY["max_tokens"], args=("--activations", "fast"))
    with Daemon(model_path, tmp_path, name="nxd-p", workers=2) as d:
        precise = logprobs(d)
    assert len(fast) == len(precise) == GREEDY["max_tokens"]
    assert max(abs(a - b) for a, b in zip(fast, precise)) > 1e-4, (fast, precise)


def test_plain_layout_still_serves(model_path, tmp_path):
    with Daemon(model_path, tmp_path, name="nxd-b", workers=2, env={"NX_PACK": "0"}) as d:
        _, toks = generate(d)
        assert "packed for the tile kernels" not in d.log()
    assert len(toks) == GREEDY["max_tokens"]


def test_profile_in_status(model_path, tmp_path):
    with Daemon(model_path, tmp_path, name="nxd-c", workers=2) as d:
        generate(d)
        assert "profile" not in d.status()
    with Daemon(model_path, tmp_path, name="nxd-d", workers=2, env={"NXD_PROFILE": "1"}) as d:
        generate(d)
        st = d.status()
        r = subprocess.run([str(build_dir() / "nxctl"), "--socket", str(d.sock), "status", "--profile"],
                           capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.decode().splitlines()[1:]] == PHASES
    prof = st["profile"]
    assert prof["steps"] >= GREEDY["max_tokens"]
    ms = prof["ms_per_step"]
    assert list(ms) == PHASES
    assert all(v >= 0 for v in ms.values())
    assert ms["matmul"] > 0 and ms["logits"] > 0 and ms["attention"] > 0
    # 10 tokens, each step launched as the one before ended: a turn of a few to a few hundred us
    assert 0 < ms["supervisor"] < 50
    # a step of this model takes well under a second even on a busy machine
    assert 0 < sum(ms.values()) < 1000
