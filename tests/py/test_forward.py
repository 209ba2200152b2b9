"""test_forward.py - the batched forward pass (through tools/nx-eval) against the float64 reference on tiny random models.

Every supported weight type, llama and qwen2, tied and untied output, GQA,
partial RoPE, RoPE scaling (llama3 frequency factors, linear, YaRN), heads of
another size than dim / n_head and files mixing types. Each model runs four batching plans (each
sequence alone; three sequences in one step; chunked prefill 5+3+1 interleaved
with other sequences; decode steps mixing sequences at different positions) on
1, 2 and 3 threads:

- all twelve runs must give bit-identical logits (a token's arithmetic does not
  depend on its batch nor on the band split - see model/forward.h);
- they must match the plain float64 reference within the activation-quantization
  error (bounds below, with their reasons);
- and the reference with the engine's rounding points emulated (two-part Q8_0 /
  Q8_K activations, f16 K/V) closer still (see EMULATED).

With --activations fast (one part) every quantized model is held to the
reference emulating one part instead (see EMULATED_ONE).
"""
import ctypes
import os
import subprocess
import zlib

import numpy as np
import pytest

import make_tiny
from conftest import build_dir, tool
from reference import Reference

VARIANTS = dict(make_tiny.VARIANTS)

# Bounds on |ours - reference| relative to std(reference logits) (~3 here), as
# (max over all logits, mean). Measured worst cases (25 models, 27 tokens each,
# scalar, AVX2 and AVX-512 kernels) are in the comments; the bounds leave 2x headroom.
# - float weights (F32/F16/BF16): activations stay f32, only K/V is stored as
#   f16 (rel. 2^-11 per element) and f32 arithmetic differs from float64.
# - quantized weights: each matmul input is quantized in two parts, hi = Q(x)
#   and lo = x - hi in finer levels, Q8_0 (blocks of 32; lo at hi's scale / 128)
#   or Q8_K (256) (kern/quant.h: quant2): ~14-15 bits per value, an error well
#   below the f16 K/V one, so the bounds are the float ones. (With one Q8
#   rounding they were 100x wider: max 0.11, mean 0.019 - see
#   tests/py/study_activation_error.py.)
TOL = {
    "float": (4e-3, 6e-4),  # measured max 1.8e-3, mean 3.0e-4
    "q8_0": (4e-3, 6e-4),   # measured max 2.0e-3, mean 2.9e-4
    "q8_k": (4e-3, 6e-4),   # measured max 2.1e-3, mean 3.0e-4
}
FAMILY = {"F32": "float", "F16": "float", "BF16": "float", "Q8_0": "q8_0", "Q4_0": "q8_0", "Q4_1": "q8_0",
          "Q5_0": "q8_0", "Q5_1": "q8_0", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k"}
ORDER = ["float", "q8_0", "q8_k"]

# Against the emulated reference the only differences left are float32 vs
# float64 rounding (~1e-7 relative) - except that a value landing within that
# distance of a rounding boundary (f16 K/V, a Q8 level) rounds the other way.
# - float weights: only f16 K/V rounds, rarely: such a flip at one position
#   reaches all later ones of its sequence through K/V, but many positions stay
#   exact. A systematic mistake (RoPE, a bias, the attention range, a KV slot, a
#   misplaced row) misses at nearly all of them.
# - quantized weights: the lo part's levels are ~1/16000 (Q8_0) or ~1/32000
#   (Q8_K) of a block's peak apart, so every matmul input has a few values that round the other way, and
#   no position stays exact; what is left is that small noise (median 1.3e-4 ..
#   4.3e-4 per position), a third of the distance to the exact reference.
# As (per-position max |diff| / std, fraction of positions that must be within it):
EMULATED = {
    "float": (1e-5, 0.4),  # typical 1e-7..1e-6; fraction measured 0.44..1.0
    "q8_0": (1.6e-3, 1.0),  # per-position max measured 8.9e-4
    "q8_k": (1.6e-3, 1.0),  # per-position max measured 7.2e-4
}

SEQ_LENS = {0: 9, 2: 6, 1: 12}  # slot -> tokens; slots out of order on purpose


def plans():
    """Batching plans over the sequences of SEQ_LENS, as nx-eval `step` lines."""
    alone = [f"step {s}:0:{n}" for s, n in SEQ_LENS.items()]
    batched = ["step " + " ".join(f"{s}:0:{n}" for s, n in SEQ_LENS.items())]
    chunked = ["step 0:0:5 2:0:2", "step 0:5:3 2:2:1 1:0:7", "step 0:8:1 2:3:1 1:7:1", "step 2:4:2 1:8:4"]
    decode, done = ["step 0:0:2 2:0:1 1:0:3"], {0: 2, 2: 1, 1: 3}
    while any(done[s] < n for s, n in SEQ_LENS.items()):
        chunks = [f"{s}:{done[s]}:1" for s, n in SEQ_LENS.items() if done[s] < n]
        for s in SEQ_LENS:
            done[s] = min(done[s] + 1, SEQ_LENS[s])
        decode.append("step " + " ".join(chunks))
    return {"alone": alone, "batched": batched, "chunked": chunked, "decode": decode}


def run_eval(model, seqs, steps, threads, args=()):
    """Logits (total tokens, n_vocab) float32, sequences in `seqs` order."""
    text = "".join(f"seq {s} {' '.join(map(str, t))}\n" for s, t in seqs.items()) + "\n".join(steps) + "\n"
    p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", str(threads), *args], input=text.encode(),
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    n = sum(len(t) for t in seqs.values())
    return np.frombuffer(p.stdout, np.float32).reshape(n, -1)


def eval_error(model, args=(), stdin=""):
    p = subprocess.run([str(tool("nx-eval")), str(model), *args], input=stdin.encode(), capture_output=True,
                       timeout=60)
    assert p.returncode != 0, "nx-eval accepted a bad input"
    return p.stderr.decode()


def reference(name, model, **kw):
    """The float64 reference of variant `name`, given the Hugging Face rope_scaling it was written from."""
    return Reference(model, rope_scaling=VARIANTS[name].get("rope_scaling"), **kw)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {name: make_tiny.build(d / f"{name}.gguf", **kw) for name, kw in VARIANTS.items()}


class _Wt(ctypes.Structure):  # struct nx_wt (model/model.h)
    _fields_ = [("type", ctypes.c_int), ("n_in", ctypes.c_int64), ("n_out", ctypes.c_int64),
                ("row_bytes", ctypes.c_size_t), ("data", ctypes.c_void_p), ("packed", ctypes.c_void_p)]


def packed_matrices(ref):
    """Names of the matrices nx-eval packs for the tile kernels (model/repack.c:
    nx_wt_packable on this CPU, asked through libnx.so; none with NX_PACK=0). A
    packed k-quant matrix takes Q8_0 activations (kern/pack.h), not Q8_K."""
    if os.environ.get("NX_PACK") == "0":
        return set()
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_row_size.restype = ctypes.c_int64
    so.nx_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    so.nx_wt_packable.restype = ctypes.c_bool
    so.nx_wt_packable.argtypes = [ctypes.POINTER(_Wt)]
    out = set()
    for name, w in ref.t.items():
        if w.ndim == 2:
            (n_out, n_in), ty = w.shape, int(ref.types[name])
            wt = _Wt(ty, n_in, n_out, so.nx_row_size(ty, n_in), 1, None)  # data: any non-NULL pointer
            if so.nx_wt_packable(ctypes.byref(wt)):
                out.add(name)
    return out


def family(kw):
    types = [kw.get("wtype", "Q8_0"), *kw.get("types", {}).values()]
    return max((FAMILY[t] for t in types), key=ORDER.index)


def split(logits, seqs):
    """nx-eval's logits of all sequences, one array per sequence."""
    return np.split(logits, np.cumsum([len(t) for t in seqs.values()])[:-1])


def logits_every_plan(model, seqs, args=(), plan_names=None, threads=(1, 2, 3)):
    """seqs under each batching plan and thread count: asserts they are bit-identical and finite, and
    returns their logits."""
    ps = plans()
    names = list(plan_names or ps)
    runs = {(plan, th): run_eval(model, seqs, ps[plan], th, args) for plan in names for th in threads}
    base = runs[(names[0], threads[0])]
    for key, logits in runs.items():
        assert np.array_equal(logits, base), f"{key} differs from {(names[0], threads[0])} by " \
                                            f"{np.abs(logits - base).max()}"
    assert np.isfinite(base).all()
    return base


def grade(label, fam, seqs, base, ref, emu, report, need_emulated=True):
    """nxd's logits (base) against the float64 reference with the family's bounds, and against the
    reference emulating nxd's rounding points (emu). Returns [(tokens, ours, reference)] per sequence."""
    errs, close, top1, n_pos, per_seq = [], [], 0, 0, []
    for toks, got in zip(seqs.values(), split(base, seqs)):
        want = ref.logits(toks)
        errs.append(np.abs(got - want) / want.std())
        e = emu.logits(toks)
        close.append(np.abs(got - e).max(axis=1) / e.std())
        top1 += (got.argmax(1) == want.argmax(1)).sum()
        n_pos += len(toks)
        per_seq.append((toks, got, want))
    err, close = np.concatenate(errs), np.concatenate(close)
    max_tol, mean_tol = TOL[fam]
    emu_close, emu_min_frac = EMULATED[fam]
    frac_close = np.mean(close <= emu_close)
    report(f"forward {label} [{fam:5s}] max|d|/std {err.max():.2e} mean {err.mean():.2e} "
           f"top1 {top1}/{n_pos} emulated: {frac_close:.2f} within {emu_close:.1e} (max {close.max():.1e})")
    assert err.max() <= max_tol, f"max |dlogit|/std {err.max():.3e} > {max_tol}"
    assert err.mean() <= mean_tol, f"mean |dlogit|/std {err.mean():.3e} > {mean_tol}"
    # (Within the max bound a top-1 can only flip at a near-tie; this asks that those stay rare.)
    assert top1 >= 0.9 * n_pos, f"top-1 agrees at {top1} of {n_pos} positions"
    assert not need_emulated or frac_close >= emu_min_frac, \
        f"only {frac_close:.2f} of positions match the emulated reference within {emu_close:.1e}"
    return per_seq


def grade_one_part(label, seqs, base, ref, emu, report):
    """--activations fast against the reference rounding each matmul input to one part (emu), and within
    TOL_ONE of the exact one."""
    close, errs = [], []
    for toks, got in zip(seqs.values(), split(base, seqs)):
        e = emu.logits(toks)
        close.append(np.abs(got - e).max(axis=1) / e.std())
        want = ref.logits(toks)
        errs.append(np.abs(got - want) / want.std())
    close, err = np.concatenate(close), np.concatenate(errs)
    emu_close, emu_min_frac = EMULATED_ONE
    frac_close = np.mean(close <= emu_close)
    report(f"fast activations {label} max|d|/std {err.max():.2e} mean {err.mean():.2e} "
           f"one-part emulated: {frac_close:.2f} within {emu_close:.1e} (median {np.median(close):.1e}, "
           f"max {close.max():.1e})")
    assert frac_close >= emu_min_frac, f"only {frac_close:.2f} of positions match the one-part reference " \
                                       f"within {emu_close:.1e}"
    assert err.max() <= TOL_ONE[0], f"max |dlogit|/std {err.max():.3e} > {TOL_ONE[0]}"
    assert err.mean() <= TOL_ONE[1], f"mean |dlogit|/std {err.mean():.3e} > {TOL_ONE[1]}"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_reference(tiny, name, report):
    model = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = reference(name, model)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}

    # Bit-identical under every batching plan and thread count.
    base = logits_every_plan(model, seqs)
    # Against the float64 reference, and the one emulating our rounding points.
    emu = reference(name, model, emulate=True, packed=packed_matrices(ref))
    grade(f"{name:22s}", family(VARIANTS[name]), seqs, base, ref, emu, report)


# nxd --activations fast: each matmul input in one part (hi alone; the lo rows
# stay zeros and the packed kernels skip them). Against the reference that
# rounds each matmul input to hi alone, what is left is float32 arithmetic
# (median 2.4e-7..6.5e-7 per position), except after a value that lands within
# that noise of a Q8 level's rounding boundary and rounds the other way: a
# level is a whole 1/127 of the block's peak, so from there on the sequence is
# ~1e-2 off (through K/V and the residual). Measured: 0.63..1.00 of positions
# within 1e-5 (scalar, AVX2 and AVX-512 kernels). With the option ignored (two
# parts) or the lo part half skipped every position is ~1e-2 off. Against the exact reference, the one-part
# error (measured max 8.7e-2, mean 1.4e-2; 2x headroom), 20x the two-part one.
EMULATED_ONE = (1e-5, 0.4)
TOL_ONE = (0.2, 0.03)


@pytest.mark.parametrize("name", [n for n, kw in VARIANTS.items() if family(kw) != "float"])
def test_fast_activations_match_one_part_reference(tiny, name, report):
    model = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = reference(name, model)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = reference(name, model, emulate=True, packed=packed_matrices(ref), one_part=True)
    grade_one_part(f"{name:22s} [{family(VARIANTS[name]):5s}]", seqs, base, ref, emu, report)


# Attention cuts a token's positions into spans of 256 and merges the spans'
# outputs (model/forward.c: NX_ATTN_SPAN): contexts past 512 positions, with
# steps that start and end on and off the span boundaries.
LONG_LENS = {0: 700, 1: 300}


def long_plans():
    whole = [f"step {s}:{i}:{min(128, n - i)}" for s, n in LONG_LENS.items() for i in range(0, n, 128)]
    mixed, done = [], {0: 0, 1: 0}
    for chunk0, chunk1 in [(255, 40), (2, 216), (300, 1), (100, 40)]:  # then both decode one token a step
        mixed.append(f"step 0:{done[0]}:{chunk0} 1:{done[1]}:{chunk1}")
        done[0] += chunk0
        done[1] += chunk1
    while any(done[s] < n for s, n in LONG_LENS.items()):
        mixed.append("step " + " ".join(f"{s}:{done[s]}:1" for s, n in LONG_LENS.items() if done[s] < n))
        for s, n in LONG_LENS.items():
            done[s] = min(done[s] + 1, n)
    return {"whole": whole, "mixed": mixed}


@pytest.mark.parametrize("name", ["llama-f32-rope32", "llama-mixed", "llama-f16-yarn"])
def test_long_context_spans(tiny, name, report):
    """Past one span of positions: the same logits under every plan and thread
    count, bit for bit, and the float64 reference's within the usual bounds."""
    model = tiny[name]
    rng = np.random.default_rng(7)
    ref = reference(name, model)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in LONG_LENS.items()}
    runs = {(plan, th): run_eval(model, seqs, steps, th) for plan, steps in long_plans().items() for th in (1, 2)}
    base = runs[("whole", 1)]
    for key, logits in runs.items():
        assert np.array_equal(logits, base), f"{key} differs from (whole, 1 thread) by {np.abs(logits - base).max()}"
    ours = np.split(base, [LONG_LENS[0]])
    err = np.concatenate([np.abs(got - ref.logits(toks)) / ref.logits(toks).std()
                          for toks, got in zip(seqs.values(), ours)])
    max_tol, mean_tol = TOL[family(VARIANTS[name])]
    report(f"forward {name:22s} {LONG_LENS[0]} positions: max|d|/std {err.max():.2e} mean {err.mean():.2e}")
    assert err.max() <= max_tol and err.mean() <= mean_tol, (err.max(), err.mean())


@pytest.mark.parametrize("name", ["llama-f32-tied", "llama-q4_k-tied", "qwen2-q5_1-tied", "qwen3-q4_k-tied"])
def test_generate_matches_teacher_forcing(tiny, name):
    """--generate (prefill, then one-token decode steps) continues exactly as the
    argmax of teacher-forced logits over its own output, and each token is the
    reference's argmax or within our error bound of it (a near-tie)."""
    model, prompt, n = tiny[name], [5, 17, 250, 3, 99], 10
    p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--generate", str(n), "--prompt-ids",
                        ",".join(map(str, prompt))], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    gen = [int(x) for x in p.stdout.split()]
    assert len(gen) == n
    full = prompt + gen
    logits = run_eval(model, {0: full}, [f"step 0:0:{len(full)}"], 1)
    assert list(logits[len(prompt) - 1:-1].argmax(1)) == gen
    ref = reference(name, model).logits(full)[len(prompt) - 1:-1]
    slack = TOL[family(VARIANTS[name])][0] * ref.std()
    assert np.all(ref[np.arange(n), gen] >= ref.max(axis=1) - slack)


@pytest.mark.parametrize("name", [n for n, kw in VARIANTS.items() if kw.get("rope_scaling")])
def test_rope_scaling_is_not_ignored(tiny, name, report):
    """Against the reference without the scaling (what a file's rope scaling read as nothing would
    give), every scaled model is far outside the bounds it meets with it: the test above has the power
    to tell RoPE scaling from none."""
    model = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    plain = Reference(model, rope_scaling={"rope_type": "default"})
    seqs = {s: rng.integers(0, plain.n_vocab, n) for s, n in SEQ_LENS.items()}
    ours = split(run_eval(model, seqs, plans()["batched"], 1), seqs)
    err = max((np.abs(got - plain.logits(toks)) / plain.logits(toks).std()).max()
              for toks, got in zip(seqs.values(), ours))
    report(f"forward {name:22s} against unscaled RoPE: max|d|/std {err:.2e}")
    assert err > 10 * TOL[family(VARIANTS[name])][0]


def _bad(tmp_path, name="bad", **kw):
    return make_tiny.build(tmp_path / f"{name}.gguf", **{"wtype": "Q8_0", **kw})


def test_rejects_unknown_architecture(tmp_path):
    def gpt2(meta, t):
        for k in list(meta):
            meta[k.replace("llama.", "gpt2.")] = meta.pop(k)
        meta["general.architecture"] = ("str", "gpt2")
    err = eval_error(_bad(tmp_path, mutate=gpt2), stdin="seq 0 1\nstep 0:0:1\n")
    assert "architecture 'gpt2' is not supported" in err


def test_rejects_wrong_shape(tmp_path):
    def short_k(meta, t):
        t["blk.1.attn_k.weight"] = make_tiny.weight(np.random.default_rng(0), 120, 256, "Q8_0", 0.06)
    err = eval_error(_bad(tmp_path, mutate=short_k), stdin="seq 0 1\nstep 0:0:1\n")
    assert "tensor 'blk.1.attn_k.weight' has shape [256, 120], expected [256, 128]" in err


def test_rejects_block_count_past_tensors(tmp_path):
    def more_layers(meta, t):
        meta["llama.block_count"] = ("u32", 3)
    err = eval_error(_bad(tmp_path, mutate=more_layers), stdin="seq 0 1\nstep 0:0:1\n")
    assert "tensor 'blk.2.attn_norm.weight' is missing" in err


def test_rejects_non_f32_norm_and_missing_bias(tmp_path):
    def f16_norm(meta, t):
        t["blk.0.ffn_norm.weight"] = (np.ones(256, np.float16), None)
    err = eval_error(_bad(tmp_path, "norm", mutate=f16_norm), stdin="seq 0 1\nstep 0:0:1\n")
    assert "tensor 'blk.0.ffn_norm.weight' has type f16, expected f32" in err

    def no_bias(meta, t):
        del t["blk.1.attn_v.bias"]
    err = eval_error(_bad(tmp_path, "bias", arch="qwen2", mutate=no_bias), stdin="seq 0 1\nstep 0:0:1\n")
    assert "tensor 'blk.1.attn_v.bias' is missing" in err


def test_rejects_bad_plans(tiny):
    model = tiny["llama-q8_0-untied"]
    assert "token 300 >= n_vocab 300" in eval_error(model, stdin="seq 0 1 300\nstep 0:0:2\n")
    assert "is at 0 of 2" in eval_error(model, stdin="seq 0 1 2\nstep 0:1:1\n")  # skips position 0
    assert "steps cover 1" in eval_error(model, stdin="seq 0 1 2\nstep 0:0:1\n")
