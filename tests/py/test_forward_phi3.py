"""test_forward_phi3.py - phi3 and smollm3 (through tools/nx-eval) against the float64 reference on tiny random models.

The models (tests/fixtures/make_tiny_phi3.py) carry exactly the keys and tensor
names llama.cpp's converter writes: phi3's fused attn_qkv and gate/up ffn_up,
LongRoPE's rope_factors_long / _short with rope.scaling.attn_factor (or
without it: Hugging Face's default from the contexts), partial rotary, the
sliding window (attention.sliding_window), tied output; smollm3's layers
without RoPE (every 4th). As test_forward.py does for llama / qwen: every
batching plan on 1, 2 and 3 threads bit-identical, within the same bounds of
the reference written from modeling_phi3.py / modeling_smollm3.py, and closer
still to the reference that emulates nxd's rounding points.

LongRoPE is a choice per context (model/model.h: nx_model_rope_factors): the
short factors with --ctx at most the original context, the long ones past it.
Each LongRoPE model runs both ways, against Hugging Face's rotary embedding
seeing a sequence within the original context (short) or past it (long: the
logits of a sequence's first positions when the whole sequence is longer).

Each feature is shown to matter: against the reference without it (no
window, RoPE in every layer, the other factor set, no attention factor) the
logits are far outside the bounds.
"""
import subprocess
import zlib

import numpy as np
import pytest

import make_tiny_phi3
from conftest import tool
from reference import Reference
from test_forward import (FAMILY, ORDER, SEQ_LENS, TOL, grade, grade_one_part, logits_every_plan, packed_matrices,
                          plans, run_eval, split)

VARIANTS = {name: (builder, kw) for name, builder, kw in make_tiny_phi3.VARIANTS}
LONG_CTX = 256  # --ctx past the LongRoPE models' original context (64)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_phi3")
    return {name: make_tiny_phi3.build(d, name) for name in VARIANTS}


def family(name):
    kw = VARIANTS[name][1]
    types = [kw.get("wtype", "Q8_0"), *kw.get("types", {}).values()]
    return max((FAMILY[t] for t in types), key=ORDER.index)


def reference(tiny, name, ctx=None, **kw):
    """The reference of variant name as nx-eval runs it with --ctx ctx (None: the plan's longest sequence)."""
    path, hf = tiny[name]
    rs = hf.get("rope_scaling")
    args = dict(rope_scaling=rs, sliding_window=hf.get("sliding_window"))
    if rs and rs.get("rope_type") == "longrope":  # nxd's one choice for the context: HF's for ctx positions
        args["rope_seq_len"] = ctx or max(SEQ_LENS.values())
    args.update(kw)
    return Reference(path, **args)


def is_longrope(name):
    return bool(VARIANTS[name][1].get("long_rope"))


CASES = [(n, None) for n in VARIANTS] + [(n, LONG_CTX) for n in VARIANTS if is_longrope(n)]


def seqs_for(name, n_vocab):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return {s: rng.integers(0, n_vocab, n) for s, n in SEQ_LENS.items()}


def ctx_args(ctx):
    return ("--ctx", str(ctx)) if ctx else ()


def max_err(ours, seqs, ref):
    return max((np.abs(got - ref.logits(toks)) / ref.logits(toks).std()).max()
               for toks, got in zip(seqs.values(), split(ours, seqs)))


@pytest.mark.parametrize("name,ctx", CASES, ids=[f"{n}-ctx{c or 'seq'}" for n, c in CASES])
def test_logits_match_reference(tiny, name, ctx, report):
    path = tiny[name][0]
    ref = reference(tiny, name, ctx)
    seqs = seqs_for(name, ref.n_vocab)

    base = logits_every_plan(path, seqs, ctx_args(ctx))
    emu = reference(tiny, name, ctx, emulate=True, packed=packed_parts(ref))
    grade(f"{name:34s} ctx {ctx or 'seq':>4}", family(name), seqs, base, ref, emu, report)


def packed_parts(ref):
    """The matrices nx-eval packs (test_forward.packed_matrices), phi3's fused ones judged by their parts, as
    model/model.c binds them (wt_rows): Q, K, V of attn_qkv, gate and up of ffn_up. The emulation takes a
    tensor's activation type from the whole tensor, so its parts must be packed alike (they are in these
    shapes: each a multiple of 16 rows)."""
    packed = packed_matrices(ref)
    q, kv, ff = ref.n_head * ref.head_dim, ref.n_head_kv * ref.head_dim, None
    for name, w in ref.t.items():
        if name.endswith("attn_qkv.weight"):
            parts = (q, kv, kv)
        elif ref.arch == "phi3" and name.endswith("ffn_up.weight"):
            ff = w.shape[0] // 2
            parts = (ff, ff)
        else:
            continue
        alike = {name in packed_matrices(_Rows(ref, name, n)) for n in parts}
        assert len(alike) == 1, f"{name}: its parts {parts} are not all packed alike"
        if alike.pop():
            packed.add(name)
        else:
            packed.discard(name)
    return packed


class _Rows:
    """A reference-like view holding tensor name cut to its first n rows (for packed_matrices)."""
    def __init__(self, ref, name, n):
        self.t, self.types = {name: ref.t[name][:n]}, {name: ref.types[name]}


@pytest.mark.parametrize("name", [n for n in VARIANTS if family(n) != "float"])
def test_fast_activations_match_one_part_reference(tiny, name, report):
    """--activations fast (one-part activations): as test_forward.py holds llama / qwen to it."""
    path = tiny[name][0]
    ref = reference(tiny, name)
    seqs = seqs_for(name, ref.n_vocab)
    base = logits_every_plan(path, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = reference(tiny, name, emulate=True, packed=packed_parts(ref), one_part=True)
    grade_one_part(f"{name:34s}", seqs, base, ref, emu, report)


def _without(tiny, name, ctx, what):
    """The reference of name, ctx with one feature taken away."""
    path, hf = tiny[name]
    rs = hf.get("rope_scaling")
    if what == "window":
        return reference(tiny, name, ctx, sliding_window=None)
    if what == "nope":
        return reference(tiny, name, ctx, no_rope_layers=[1] * VARIANTS[name][1].get("n_layer", 4))
    if what == "other factors":  # the set nxd does not choose for this context
        return reference(tiny, name, ctx, rope_seq_len=1 if ctx else LONG_CTX)
    if what == "attention factor":
        return reference(tiny, name, ctx, rope_scaling={**rs, "attention_factor": 1.0})
    raise ValueError(what)


WITHOUT = {"window": "no window", "nope": "RoPE in every layer", "other factors": "the other LongRoPE factors",
           "attention factor": "attention factor 1"}
FEATURES = [("phi3-f32-window", None, "window"), ("phi3-q4_k-longrope-nokey", None, "window"),
            ("smollm3-f32", None, "nope"), ("smollm3-q4_k", None, "nope"), ("smollm3-q8_0-yarn", None, "nope"),
            ("phi3-f16-longrope", None, "other factors"), ("phi3-f16-longrope", LONG_CTX, "other factors"),
            ("phi3-f16-longrope", None, "attention factor"), ("phi3-q4_k-longrope-nokey", LONG_CTX, "attention factor"),
            ("phi3-q6_k-longrope-factor", LONG_CTX, "attention factor")]


@pytest.mark.parametrize("name,ctx,what", FEATURES, ids=[f"{n}-{w.replace(' ', '_')}-ctx{c or 'seq'}"
                                                         for n, c, w in FEATURES])
def test_feature_is_not_ignored(tiny, name, ctx, what, report):
    """Against the reference without the feature (what nxd would compute if it ignored it), the model is far
    outside the bounds it meets with it: the test above has the power to tell."""
    path = tiny[name][0]
    ref = _without(tiny, name, ctx, what)
    seqs = seqs_for(name, ref.n_vocab)
    err = max_err(run_eval(path, seqs, plans()["batched"], 1, ctx_args(ctx)), seqs, ref)
    report(f"forward {name:34s} ctx {ctx or 'seq':>4} against the reference with {WITHOUT[what]}: max|d|/std {err:.2e}")
    assert err > 10 * TOL[family(name)][0]


# A window across the spans attention cuts positions into (model/forward.c: NX_ATTN_SPAN, 256): its
# first position moves through span boundaries while the token's own crosses them too.
LONG_LENS = {0: 700, 1: 300}


def long_plans():
    whole = [f"step {s}:{i}:{min(128, n - i)}" for s, n in LONG_LENS.items() for i in range(0, n, 128)]
    mixed, done = [], {0: 0, 1: 0}
    for chunk0, chunk1 in [(255, 40), (2, 216), (300, 1), (100, 40)]:
        mixed.append(f"step 0:{done[0]}:{chunk0} 1:{done[1]}:{chunk1}")
        done[0] += chunk0
        done[1] += chunk1
    while any(done[s] < n for s, n in LONG_LENS.items()):
        mixed.append("step " + " ".join(f"{s}:{done[s]}:1" for s, n in LONG_LENS.items() if done[s] < n))
        for s, n in LONG_LENS.items():
            done[s] = min(done[s] + 1, n)
    return {"whole": whole, "mixed": mixed}


@pytest.mark.parametrize("window", [300, 256, 100])
def test_sliding_window_across_spans(tmp_path, window, report):
    path, hf = make_tiny_phi3.build_phi3(tmp_path / f"w{window}.gguf", wtype="F16", seed=320, window=window,
                                         n_head_kv=1, n_ctx=1024)
    ref = Reference(path, sliding_window=window)
    rng = np.random.default_rng(8)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in LONG_LENS.items()}
    runs = {(plan, th): run_eval(path, seqs, steps, th) for plan, steps in long_plans().items() for th in (1, 2)}
    base = runs[("whole", 1)]
    for key, logits in runs.items():
        assert np.array_equal(logits, base), f"{key} differs from (whole, 1 thread) by {np.abs(logits - base).max()}"
    errs = [np.abs(got - ref.logits(toks)) / ref.logits(toks).std() for toks, got in zip(seqs.values(),
                                                                                        split(base, seqs))]
    err = np.concatenate(errs)
    full = max_err(base, seqs, Reference(path))
    report(f"forward phi3 window {window} {LONG_LENS[0]} positions: max|d|/std {err.max():.2e} mean {err.mean():.2e}; "
           f"against no window {full:.2e}")
    assert err.max() <= TOL["float"][0] and err.mean() <= TOL["float"][1], (err.max(), err.mean())
    assert full > 10 * TOL["float"][0]


@pytest.mark.parametrize("name", ["phi3-q8_0-longrope-window-rope48", "smollm3-q4_0-tied"])
def test_generate_matches_teacher_forcing(tiny, name):
    """--generate (prefill, then one-token decode steps) continues as the argmax of teacher-forced logits."""
    path, prompt, n = tiny[name][0], [5, 17, 250, 3, 99], 10
    p = subprocess.run([str(tool("nx-eval")), str(path), "--threads", "2", "--ctx", "64", "--generate", str(n),
                        "--prompt-ids", ",".join(map(str, prompt))], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    gen = [int(x) for x in p.stdout.split()]
    assert len(gen) == n
    full = prompt + gen
    logits = run_eval(path, {0: full}, [f"step 0:0:{len(full)}"], 1, ("--ctx", "64"))
    assert list(logits[len(prompt) - 1:-1].argmax(1)) == gen
    ref = reference(tiny, name, 64).logits(full)[len(prompt) - 1:-1]
    slack = TOL[family(name)][0] * ref.std()
    assert np.all(ref[np.arange(n), gen] >= ref.max(axis=1) - slack)
