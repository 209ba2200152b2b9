"""test_forward_qwen2moe.py - qwen2moe (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) against the float64 reference.

Tiny random models (tests/fixtures/make_tiny_moe.py, arch qwen2moe: the converter's keys and tensor
names, the shared expert's ffn_*_shexp and its gate ffn_gate_inp_shexp) in several weight types, through
nx-eval under every batching plan of test_forward.py on 1, 2 and 3 threads: bit-identical logits across
the runs (the shared expert's rows are shared out between the workers as a dense FFN's, each token's
routed sum then its gated shared expert added in a fixed order), within test_forward's bounds of the
float64 reference (reference.py: Hugging Face's Qwen2MoeSparseMoeBlock, norm_topk_prob false as
Qwen2MoeConfig's default and the releases), and closer still to the one emulating nxd's rounding points.
Without the shared expert's sigmoid gate, without the shared expert, or with the other routing
normalisation the reference is far outside those bounds. Refusals and the daemon at the end.
"""
import subprocess
import zlib

import numpy as np
import pytest

import make_tiny
import make_tiny_moe
from conftest import tool
from reference import Reference
from test_forward import (SEQ_LENS, TOL, grade, grade_one_part, logits_every_plan, plans, run_eval, split)
from test_forward_moe import family, packed_experts

# (name, build kwargs, the Hugging Face config's norm_topk_prob the file stands for). The float models have
# one kv head (test_forward's f16 K/V rounding flips stay rare).
VARIANTS = {
    "qwen2moe-f32": (dict(wtype="F32", seed=500, n_head_kv=1), False),
    "qwen2moe-f16": (dict(wtype="F16", seed=501, n_head_kv=1, tied=True), False),
    "qwen2moe-q8_0": (dict(wtype="Q8_0", seed=502), False),
    "qwen2moe-q4_0": (dict(wtype="Q4_0", seed=503, tied=True), False),
    "qwen2moe-q4_k": (dict(wtype="Q4_K", seed=504, n_ff_exp=256, n_ff_shexp=512), False),
    "qwen2moe-q6_k": (dict(wtype="Q6_K", seed=505, n_ff_exp=256, n_ff_shexp=256), False),
    # Qwen1.5-MoE's shape scaled down: many experts, four per token, a shared expert 4x an expert's length
    "qwen2moe-q8_0-e16k4": (dict(wtype="Q8_0", seed=506, n_expert=16, n_used=4, n_ff_exp=64, n_ff_shexp=256),
                            False),
    # a file that says expert_weights_norm = true: Hugging Face's norm_topk_prob = true
    "qwen2moe-q8_0-norm": (dict(wtype="Q8_0", seed=507, norm_w=True), True),
    # the shared expert's rows not a whole number of the bands' 16-row units; its length from
    # feed_forward_length (no expert_shared_feed_forward_length key, as llama.cpp's loader falls back)
    "qwen2moe-f32-sh72": (dict(wtype="F32", seed=508, n_head_kv=1, n_ff_shexp=72, shexp_key=False), False),
    # the shared gate stored F16 (the converter's f16 output: a 2-D tensor of one row)
    "qwen2moe-q8_0-f16gate": (dict(wtype="Q8_0", seed=509, shexp_gate="F16"), False),
}


def build(path, name, **extra):
    kw, _ = VARIANTS[name]
    return make_tiny_moe.build(path, arch="qwen2moe", **{**kw, **extra})


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen2moe")
    return {name: build(d / f"{name}.gguf", name) for name in VARIANTS}


def fam(name):
    return family({"arch": "qwen2moe", **VARIANTS[name][0]})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_reference(tiny, name, report):
    model = tiny[name]
    _, norm = VARIANTS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = Reference(model, norm_topk_prob=norm)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs)
    emu = Reference(model, emulate=True, packed=packed_experts(ref), norm_topk_prob=norm)
    grade(f"{name:22s}", fam(name), seqs, base, ref, emu, report)


@pytest.mark.parametrize("name", ["qwen2moe-q8_0", "qwen2moe-q4_k"])
def test_fast_activations_match_one_part_reference(tiny, name, report):
    model = tiny[name]
    _, norm = VARIANTS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = Reference(model, norm_topk_prob=norm)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = Reference(model, emulate=True, packed=packed_experts(ref), one_part=True, norm_topk_prob=norm)
    grade_one_part(f"{name:22s}", seqs, base, ref, emu, report)


def _ungated(model, norm):
    r = Reference(model, norm_topk_prob=norm)
    r.shared_gate = False
    return r


def _unshared(model, norm):
    r = Reference(model, norm_topk_prob=norm)
    r.shared_expert = False
    return r


# What nxd computing without each feature would be graded against: far outside the bounds.
ABLATIONS = [
    ("qwen2moe-q8_0", "the shared expert without its sigmoid gate", _ungated),
    ("qwen2moe-q8_0", "no shared expert", _unshared),
    ("qwen2moe-q8_0", "norm_topk_prob true", lambda m, norm: Reference(m, norm_topk_prob=not norm)),
    ("qwen2moe-q8_0-norm", "norm_topk_prob false", lambda m, norm: Reference(m, norm_topk_prob=not norm)),
    ("qwen2moe-q8_0-e16k4", "the shared expert without its sigmoid gate", _ungated),
]


@pytest.mark.parametrize("name,what,wrong", ABLATIONS, ids=[f"{n}:{w}" for n, w, _ in ABLATIONS])
def test_each_feature_is_not_ignored(tiny, name, what, wrong, report):
    model = tiny[name]
    ref = wrong(model, VARIANTS[name][1])
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    ours = split(run_eval(model, seqs, plans()["batched"], 1), seqs)
    err = max((np.abs(got - ref.logits(toks)) / ref.logits(toks).std()).max()
              for toks, got in zip(seqs.values(), ours))
    report(f"forward {name:22s} against a reference with {what}: max|d|/std {err:.2e}")
    assert err > 10 * TOL[fam(name)][0]


def test_generate_matches_teacher_forcing(tiny):
    """A prompt then decode steps one token at a time give the logits of the whole sequence at once."""
    model = tiny["qwen2moe-q4_k"]
    toks = np.random.default_rng(6).integers(0, 300, 14)
    whole = run_eval(model, {0: toks}, [f"step 0:0:{len(toks)}"], 2)
    steps = ["step 0:0:4"] + [f"step 0:{i}:1" for i in range(4, len(toks))]
    assert np.array_equal(run_eval(model, {0: toks}, steps, 3), whole)


# ---------------------------------------------------------------- refusals

def _load(tmp_path, mutate):
    path = make_tiny_moe.build(tmp_path / "bad.gguf", arch="qwen2moe", wtype="Q8_0", mutate_after=mutate)
    p = subprocess.run([str(tool("nx-eval")), str(path)], input=b"seq 0 1\nstep 0:0:1\n", capture_output=True,
                       timeout=60)
    return p.returncode, p.stderr.decode()


def test_loads(tmp_path):
    rc, err = _load(tmp_path, None)
    assert rc == 0, err


@pytest.mark.parametrize("tensor", ["ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                                    "attn_k.bias"])
def test_missing_shared_expert_or_bias_refused(tmp_path, tensor):
    def drop(meta, t):
        del t[f"blk.1.{tensor}.weight" if "bias" not in tensor else f"blk.1.{tensor}"]
    rc, err = _load(tmp_path, drop)
    assert rc != 0 and f"tensor 'blk.1.{tensor}" in err and "is missing" in err, err


def test_dense_ffn_beside_the_experts_refused(tmp_path):
    """A layer of HF's mlp_only_layers (a dense MLP, no experts): llama.cpp's graph has none; refused by name."""
    def dense(meta, t):
        t["blk.0.ffn_gate.weight"] = make_tiny.weight(np.random.default_rng(1), 256, 256, "F32", 0.1)
    rc, err = _load(tmp_path, dense)
    assert rc != 0 and "tensor 'blk.0.ffn_gate.weight' is not one nxd's qwen2moe reads" in err, err


def test_shared_gate_of_wrong_shape_refused(tmp_path):
    def wide(meta, t):
        t["blk.0.ffn_gate_inp_shexp.weight"] = make_tiny.weight(np.random.default_rng(1), 2, 256, "F32", 0.1)
    rc, err = _load(tmp_path, wide)
    assert rc != 0 and "tensor 'blk.0.ffn_gate_inp_shexp.weight' has shape [256, 2], expected [256, 1]" in err, err


@pytest.mark.parametrize("k,kind,v,why", [
    ("expert_shared_count", "u32", 2, "shared experts are not implemented"),
    ("expert_gating_func", "u32", 2, "softmax"),
    ("expert_shared_feed_forward_length", "u32", 0, "out of range"),
])
def test_keys_refused(tmp_path, k, kind, v, why):
    def add(meta, t):
        meta[f"qwen2moe.{k}"] = (kind, v)
    rc, err = _load(tmp_path, add)
    assert rc != 0 and f"qwen2moe.{k}" in err and why in err, err


def test_lora_of_experts_refused(tmp_path):
    """An adapter of ffn_up on qwen2moe has no dense matrix to adapt (the routed and shared experts are not
    adaptable): refused, naming it."""
    import make_lora
    model = make_tiny_moe.build(tmp_path / "m.gguf", arch="qwen2moe", wtype="Q8_0")
    rng = np.random.default_rng(3)
    ab = {(0, "ffn_up"): (rng.standard_normal((4, 256)).astype(np.float32),
                          rng.standard_normal((256, 4)).astype(np.float32))}
    adapter = make_lora.write_gguf_lora(tmp_path / "a.gguf", "qwen2moe", ab, alpha=8, dtype="F32")
    p = subprocess.run([str(tool("nx-lora")), "info", str(model), str(adapter)], capture_output=True, timeout=60)
    err = p.stderr.decode()
    assert p.returncode != 0 and "of a mixture-of-experts layer" in err and "ffn_up" in err, err


# ---------------------------------------------------------------- through the daemon

def test_daemon_greedy_matches_nx_eval(tmp_path):
    """nxd with two forked workers sharing the routed and shared experts' rows generates what nx-eval's
    greedy decoding does."""
    from nxd_helpers import Client, Daemon
    model = build(tmp_path / "m.gguf", "qwen2moe-q4_k", vocab=True)
    prompt = [5, 17, 250, 3, 99]
    p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--generate", "12", "--prompt-ids",
                        ",".join(map(str, prompt))], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    want = [int(x) for x in p.stdout.split()]
    with Daemon(model, tmp_path, workers=2) as d, Client(d.sock) as c:
        toks, _, ev = c.generate(rid="g", tokens=prompt, max_tokens=12, temperature=0, ignore_eos=True)
        assert ev["event"] == "done", ev
        assert toks == want
