"""test_forward_moe.py - mixture-of-experts models (qwen3moe, Mixtral-style llama) against the float64 reference.

Tiny random models (tests/fixtures/make_tiny_moe.py, the converter's key and
tensor names) in several weight types, run through nx-eval under every batching
plan of test_forward.py on 1, 2 and 3 threads: the logits must be
bit-identical across all twelve runs (routing is computed alike in every band,
and a token's experts and sums do not depend on its batch), and match the
float64 reference (reference.py: Hugging Face's sparse MoE blocks) within
test_forward's bounds, and the reference emulating the engine's rounding points
closer still. The routing normalisation (norm_topk_prob / expert_weights_norm)
is checked to matter: the other normalisation's reference is far outside the
bounds. Refusals of the MoE features nxd does not implement are at the end.
"""
import ctypes
import os
import subprocess
import zlib

import numpy as np
import pytest

import make_tiny
import make_tiny_moe
from conftest import build_dir, tool
from reference import Reference
from test_forward import (FAMILY, ORDER, SEQ_LENS, TOL, _Wt, grade, grade_one_part, logits_every_plan,
                          packed_matrices, run_eval)

VARIANTS = {name: (kw, norm) for name, kw, norm in make_tiny_moe.VARIANTS}


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_moe")
    return {name: make_tiny_moe.build(d / f"{name}.gguf", **kw) for name, (kw, _) in VARIANTS.items()}


def packed_experts(ref):
    """packed_matrices, plus the stacked expert matrices nx-eval packs (model/repack.c: each expert's
    rows whole groups of the tile kernels, and nx_wt_packable of one expert's matrix on this CPU)."""
    out = packed_matrices(ref)
    if os.environ.get("NX_PACK") == "0":
        return out
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_row_size.restype = ctypes.c_int64
    so.nx_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    so.nx_wt_packable.restype = ctypes.c_bool
    so.nx_wt_packable.argtypes = [ctypes.POINTER(_Wt)]
    for name, w in ref.t.items():
        if w.ndim == 3:
            (_, n_out, n_in), ty = w.shape, int(ref.types[name])
            wt = _Wt(ty, n_in, n_out, so.nx_row_size(ty, n_in), 1, None)
            if n_out % 16 == 0 and so.nx_wt_packable(ctypes.byref(wt)):
                out.add(name)
    return out


def family(kw):
    return max((FAMILY[kw["wtype"]], FAMILY[kw.get("router", "F32")]), key=ORDER.index)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_moe_logits_match_reference(tiny_moe, name, report):
    model = tiny_moe[name]
    kw, norm = VARIANTS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = Reference(model, norm_topk_prob=norm)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}

    base = logits_every_plan(model, seqs)
    emu = Reference(model, emulate=True, packed=packed_experts(ref), norm_topk_prob=norm)
    fam = family(kw)
    per_seq = grade(f"{name:22s}", fam, seqs, base, ref, emu, report)
    # the normalisation is visible: computing the other one would fail the bound many times over
    if kw["arch"] == "qwen3moe":
        other = Reference(model, norm_topk_prob=not norm)
        wrong = max(np.abs(got - other.logits(toks)).max() / want.std() for toks, got, want in per_seq)
        report(f"forward {name:22s} the other routing normalisation: max|d|/std {wrong:.2e}")
        assert wrong > 20 * TOL[fam][0], f"the other routing normalisation is only {wrong:.2e} away"


@pytest.mark.parametrize("name", ["qwen3moe-q8_0", "qwen3moe-q4_k", "mixtral-q4_0"])
def test_moe_fast_activations_match_one_part_reference(tiny_moe, name, report):
    """nxd --activations fast (one 8-bit part per matmul input): test_forward's bounds against the
    reference rounding each input to that one part, the experts' inputs too."""
    model = tiny_moe[name]
    _, norm = VARIANTS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = Reference(model, norm_topk_prob=norm)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = Reference(model, emulate=True, packed=packed_experts(ref), one_part=True, norm_topk_prob=norm)
    grade_one_part(f"{name:22s}", seqs, base, ref, emu, report)


def test_moe_generate_matches_teacher_forcing(tiny_moe):
    """A prompt then decode steps one token at a time give the logits of the whole sequence at once."""
    model = tiny_moe["qwen3moe-q4_k"]
    rng = np.random.default_rng(5)
    toks = rng.integers(0, 300, 14)
    whole = run_eval(model, {0: toks}, [f"step 0:0:{len(toks)}"], 2)
    steps = ["step 0:0:4"] + [f"step 0:{i}:1" for i in range(4, len(toks))]
    assert np.array_equal(run_eval(model, {0: toks}, steps, 3), whole)


# ---------------------------------------------------------------- refusals

def load(tmp_path, mutate=None, name="m", **kw):
    kw.setdefault("arch", "qwen3moe")
    path = make_tiny_moe.build(tmp_path / f"{name}.gguf", wtype="Q8_0", mutate_after=mutate, **kw)
    p = subprocess.run([str(tool("nx-eval")), str(path)], input=b"seq 0 1\nstep 0:0:1\n", capture_output=True,
                       timeout=60)
    return p.returncode, p.stderr.decode()


def refused(tmp_path, mutate, *fragments, **kw):
    rc, err = load(tmp_path, mutate, **kw)
    assert rc != 0, "the model was accepted"
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"


def key(k, kind, v, arch="qwen3moe"):
    def m(meta, t):
        meta[f"{arch}.{k}"] = (kind, v)
    return m


def test_moe_loads(tmp_path):
    assert load(tmp_path)[0] == 0
    assert load(tmp_path, arch="llama", name="mixtral")[0] == 0


@pytest.mark.parametrize("k,kind,v,why", [
    ("expert_gating_func", "u32", 2, "softmax"),
    ("expert_weights_scale", "f32", 2.5, "scale"),
    ("expert_shared_count", "u32", 1, "shared experts"),
    ("expert_shared_feed_forward_length", "u32", 64, "shared experts"),
    ("leading_dense_block_count", "u32", 1, "dense layers"),
    ("expert_group_count", "u32", 2, "grouped"),
])
def test_moe_keys_refused(tmp_path, k, kind, v, why):
    refused(tmp_path, key(k, kind, v), f"key 'qwen3moe.{k}' = ", why)


def test_moe_neutral_keys_accepted(tmp_path):
    def neutral(meta, t):
        meta["qwen3moe.expert_gating_func"] = ("u32", 1)
        meta["qwen3moe.expert_weights_scale"] = ("f32", 1.0)
        meta["qwen3moe.expert_shared_count"] = ("u32", 0)
    assert load(tmp_path, neutral)[0] == 0


def test_moe_counts_checked(tmp_path):
    refused(tmp_path, key("expert_used_count", "u32", 9), "expert_used_count = 9")
    refused(tmp_path, key("expert_count", "u32", 0), "expert_count = 0")


def test_moe_tensors_refused_by_name(tmp_path):
    def dense_too(meta, t):  # a dense FFN beside the experts: no qwen3moe layer has both
        t["blk.1.ffn_up.weight"] = make_tiny.weight(np.random.default_rng(1), 64, 256, "F32", 0.1)
    refused(tmp_path, dense_too, "tensor 'blk.1.ffn_up.weight'", "refused")

    def shexp(meta, t):  # qwen2moe's shared expert
        t["blk.0.ffn_up_shexp.weight"] = make_tiny.weight(np.random.default_rng(1), 64, 256, "F32", 0.1)
    refused(tmp_path, shexp, "tensor 'blk.0.ffn_up_shexp.weight'")

    def per_expert(meta, t):  # old Mixtral files: one tensor per expert
        t["blk.0.ffn_gate.0.weight"] = make_tiny.weight(np.random.default_rng(1), 128, 256, "F32", 0.1)
    refused(tmp_path, per_expert, "tensor 'blk.0.ffn_gate.0.weight'", arch="llama", name="old")

    def short(meta, t):
        a, raw = t["blk.0.ffn_down_exps.weight"]
        t["blk.0.ffn_down_exps.weight"] = (a[:-1], raw)
    refused(tmp_path, short, "tensor 'blk.0.ffn_down_exps.weight' has shape", "expected [128, 256, 8]")

    def no_router(meta, t):
        del t["blk.1.ffn_gate_inp.weight"]
    refused(tmp_path, no_router, "tensor 'blk.1.ffn_gate_inp.weight' is missing")


def test_experts_refused_in_dense_families(tmp_path):
    def qwen3_experts(meta, t):
        meta["qwen3.expert_count"] = ("u32", 8)
    path = make_tiny.build(tmp_path / "q3.gguf", arch="qwen3", mutate=qwen3_experts)
    p = subprocess.run([str(tool("nx-eval")), str(path)], input=b"seq 0 1\nstep 0:0:1\n", capture_output=True)
    assert p.returncode != 0 and "key 'qwen3.expert_count' = 8" in p.stderr.decode()


# ---------------------------------------------------------------- through the daemon

@pytest.mark.parametrize("workers", [1, 2])
def test_moe_daemon_greedy_matches_nx_eval(tmp_path, workers):
    """nxd (forked workers sharing the experts' rows, futex barriers, batched slots) generates what
    nx-eval's greedy decoding does, for two requests at once."""
    from nxd_helpers import Client, Daemon
    kw, _ = VARIANTS["qwen3moe-q4_k"]
    model = make_tiny_moe.build(tmp_path / "m.gguf", vocab=True, **kw)
    prompts = [[5, 17, 250, 3, 99], [7, 8, 9]]
    want = []
    for pr in prompts:
        p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--generate", "12", "--prompt-ids",
                            ",".join(map(str, pr))], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode()
        want.append([int(x) for x in p.stdout.split()])
    with Daemon(model, tmp_path, workers=workers) as d, Client(d.sock) as c:
        for i, pr in enumerate(prompts):
            c.send({"op": "generate", "id": i + 1, "tokens": pr, "temperature": 0, "max_tokens": 12,
                    "ignore_eos": True, "stream": False})
        got = {}
        while len(got) < len(prompts):
            ev = c.recv()
            assert ev.get("event") == "done", ev
            got[ev["id"]] = ev["tokens"]
    assert [got[i + 1] for i in range(len(prompts))] == want


def test_lora_of_experts_refused(tmp_path):
    """An adapter of ffn_gate / ffn_up / ffn_down has no matrix to adapt in a MoE layer: refused, naming it."""
    import make_lora
    make_lora.build_tiny(tmp_path)
    model = make_tiny_moe.build(tmp_path / "mixtral.gguf", arch="llama", wtype="Q8_0", n_expert=4, n_used=2)
    p = subprocess.run([str(tool("nx-lora")), "info", str(model), str(tmp_path / "tiny-r4.gguf")],
                       capture_output=True, timeout=60)
    err = p.stderr.decode()
    assert p.returncode != 0 and "of a mixture-of-experts layer" in err and "ffn_" in err, err
