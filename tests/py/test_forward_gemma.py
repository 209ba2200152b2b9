"""test_forward_gemma.py - gemma2 and gemma3 (through tools/nx-eval) against the float64 reference on tiny random models.

Each model is written as llama.cpp's converter writes a Hugging Face Gemma2 / Gemma3 checkpoint
(convert_hf_to_gguf.py: Gemma2Model, Gemma3Model): the same keys, the tensor names of gguf-py's
constants, norm weights stored as 1 + w, no output.weight (tied), and graded against
reference.GemmaReference, written from modeling_gemma2.py / modeling_gemma3.py and given the Hugging
Face config the file stands for - never the GGUF keys nxd reads.

The configs are chosen so that every Gemma feature is visible in a dozen positions: sliding windows
shorter than the sequences, soft-caps small enough to bend the scores and logits, gemma3's local RoPE
base far from its global one. test_forward.py's batching plans, thread counts and bounds apply as they
are; and for each feature a reference without it is far outside those bounds (the tests can tell).
"""
import zlib
from pathlib import Path

import numpy as np
import pytest
import gguf

import make_tiny
from reference import GemmaReference, hf_rope
from test_forward import (family, LONG_LENS, SEQ_LENS, TOL, eval_error, grade, grade_one_part, logits_every_plan,
                          long_plans, packed_matrices, plans, run_eval, split)


def gemma2_config(**kw):
    """A Hugging Face Gemma2Config's keys the model depends on (its defaults but for the caps and window)."""
    return {"arch": "gemma2", "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "sliding_window": 5,
            "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0, **kw}


def gemma3_config(**kw):
    """A Gemma3TextConfig's: global layers at rope_theta 1e6, local ones at rope_local_base_freq 10000."""
    return {"arch": "gemma3", "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6,
            "sliding_window": 5, "sliding_window_pattern": 6, "attn_logit_softcapping": None,
            "final_logit_softcapping": None, **kw}


def build_gemma(path, hf, wtype="Q8_0", seed=0, dim=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                n_vocab=300, n_ctx=4096, types=None, mutate=None, vocab=False, chat_template=None):
    """Writes the GGUF llama.cpp's converter makes of a checkpoint with config hf; hf gets
    query_pre_attn_scalar (head_dim, as in every Gemma but the 27B ones) unless it has one."""
    rng = np.random.default_rng(seed)
    arch = hf["arch"]
    hf.setdefault("query_pre_attn_scalar", head_dim)
    types = dict(types or {})
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def ty(role):
        return types.get(role, wtype)

    meta = {  # Gemma2Model.set_gguf_parameters / TextModel's + Gemma3Model's
        f"{arch}.context_length": ("u32", n_ctx),
        f"{arch}.embedding_length": ("u32", dim),
        f"{arch}.block_count": ("u32", n_layer),
        f"{arch}.feed_forward_length": ("u32", n_ff),
        f"{arch}.attention.head_count": ("u32", n_head),
        f"{arch}.attention.head_count_kv": ("u32", n_head_kv),
        f"{arch}.attention.layer_norm_rms_epsilon": ("f32", hf["rms_norm_eps"]),
        f"{arch}.attention.key_length": ("u32", head_dim),
        f"{arch}.attention.value_length": ("u32", head_dim),
    }
    if arch == "gemma2":
        meta[f"{arch}.attn_logit_softcapping"] = ("f32", hf["attn_logit_softcapping"])
        meta[f"{arch}.final_logit_softcapping"] = ("f32", hf["final_logit_softcapping"])
        meta[f"{arch}.attention.sliding_window"] = ("u32", hf["sliding_window"])
    else:
        meta[f"{arch}.rope.freq_base"] = ("f32", hf["rope_theta"])
        if hf["final_logit_softcapping"]:
            meta[f"{arch}.final_logit_softcapping"] = ("f32", hf["final_logit_softcapping"])
        if hf["sliding_window_pattern"] != 1:
            meta[f"{arch}.attention.sliding_window"] = ("u32", hf["sliding_window"])
        rs = hf.get("rope_scaling")
        if rs:  # TextModel: linear as rope.scaling.type / factor
            meta[f"{arch}.rope.scaling.type"] = ("str", rs["rope_type"])
            meta[f"{arch}.rope.scaling.factor"] = ("f32", rs["factor"])

    def norm(n, spread=0.1):  # HF's weight w is stored as 1 + w
        return ((1.0 + spread * rng.standard_normal(n)).astype(np.float32), None)

    t = {"token_embd.weight": make_tiny.weight(rng, n_vocab, dim, ty("embd"), 3.0 / np.sqrt(dim)),
         "output_norm.weight": norm(dim)}
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(dim)
        t[p + "attn_q.weight"] = make_tiny.weight(rng, q_dim, dim, ty("q"), 1 / np.sqrt(dim))
        t[p + "attn_k.weight"] = make_tiny.weight(rng, kv_dim, dim, ty("k"), 1 / np.sqrt(dim))
        t[p + "attn_v.weight"] = make_tiny.weight(rng, kv_dim, dim, ty("v"), 1 / np.sqrt(dim))
        if arch == "gemma3":
            t[p + "attn_q_norm.weight"] = norm(head_dim, 0.3)
            t[p + "attn_k_norm.weight"] = norm(head_dim, 0.3)
        t[p + "attn_output.weight"] = make_tiny.weight(rng, dim, q_dim, ty("o"), 1 / np.sqrt(q_dim))
        t[p + "post_attention_norm.weight"] = norm(dim)
        t[p + "ffn_norm.weight"] = norm(dim)
        t[p + "ffn_gate.weight"] = make_tiny.weight(rng, n_ff, dim, ty("gate"), 1 / np.sqrt(dim))
        t[p + "ffn_up.weight"] = make_tiny.weight(rng, n_ff, dim, ty("up"), 1 / np.sqrt(dim))
        t[p + "ffn_down.weight"] = make_tiny.weight(rng, dim, n_ff, ty("down"), 1 / np.sqrt(n_ff))
        t[p + "post_ffw_norm.weight"] = norm(dim)
    if mutate:
        mutate(meta, t)
    w = gguf.GGUFWriter(str(path), arch)
    for k, (kind, v) in meta.items():
        {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string, "bool": w.add_bool}[kind](k, v)
    if vocab:
        make_tiny.add_vocab(w, n_vocab)
        w.add_add_space_prefix(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for name, (arr, raw) in t.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# (name, hf config, build kwargs). The float models keep few K/V values per position (gemma2's two layers
# as test_forward's llama ones, one kv head; gemma3's of 16 dims, over its 7 layers): test_forward's float check counts the positions that no f16 K/V rounding
# flip has reached yet, and the odds of a flip grow with the K/V values a position stores (gemma3's Q/K
# norms add a rounding before K is stored, too). The quantized ones have two kv heads of 64.
VARIANTS = {}
for _i, _ty in enumerate(["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K"]):
    _float = _ty in ("F32", "F16", "BF16")
    VARIANTS[f"gemma2-{_ty.lower()}"] = (gemma2_config(), dict(wtype=_ty, seed=300 + _i,
                                                                **(dict(n_layer=2, n_head_kv=1) if _float else {})))
    VARIANTS[f"gemma3-{_ty.lower()}"] = (gemma3_config(), dict(wtype=_ty, seed=320 + _i, n_layer=7,
                                                                **(dict(head_dim=16, n_head=8, n_head_kv=1)
                                                                   if _float else {})))
VARIANTS["gemma2-hd256"] = (gemma2_config(), dict(wtype="Q8_0", seed=340, head_dim=256, n_head=2, n_head_kv=1))
VARIANTS["gemma3-hd256"] = (gemma3_config(), dict(wtype="Q4_K", seed=341, n_layer=7, head_dim=256, n_head=2,
                                                  n_head_kv=1))
VARIANTS["gemma3-mixed"] = (gemma3_config(), dict(wtype="Q4_K", seed=342, n_layer=7, n_head=8, n_head_kv=2,
                                                  types=dict(embd="Q8_0", v="Q6_K", k="Q5_0", o="Q4_1",
                                                             down="Q6_K", up="Q5_K", gate="F16")))
# Global layers' RoPE scaled linearly (Gemma3 4B and up: factor 8), the local ones not.
VARIANTS["gemma3-q8_0-linear"] = (gemma3_config(rope_scaling={"rope_type": "linear", "factor": 8.0}),
                                  dict(wtype="Q8_0", seed=343, n_layer=7))
VARIANTS["gemma3-q8_0-finalcap"] = (gemma3_config(final_logit_softcapping=4.0), dict(wtype="Q8_0", seed=344,
                                                                                      n_layer=7))
# Without sliding_window (sliding_window_pattern 1: the converter writes none) every layer is global.
VARIANTS["gemma3-q8_0-nowindow"] = (gemma3_config(sliding_window=None, sliding_window_pattern=1),
                                    dict(wtype="Q8_0", seed=347, n_layer=7))
# The 27B models' query_pre_attn_scalar is dim / n_head, not head_dim: llama.cpp (and nxd) tell them by
# their layer count, 46 (gemma2) and 62 (gemma3).
VARIANTS["gemma2-27b-scalar"] = (gemma2_config(query_pre_attn_scalar=128 // 4),
                                 dict(wtype="F32", seed=345, dim=128, n_layer=46, n_head=4, n_head_kv=2, head_dim=64,
                                      n_ff=256))
VARIANTS["gemma3-27b-scalar"] = (gemma3_config(query_pre_attn_scalar=128 // 4),
                                 dict(wtype="F32", seed=346, dim=128, n_layer=62, n_head=4, n_head_kv=1, head_dim=64,
                                      n_ff=256))
# Past a few layers every position has met an f16 K/V rounding flip (see above): these are held to the
# bounds against the exact reference, not to the count of positions the emulated one matches.
MANY_LAYERS = {"gemma2-27b-scalar", "gemma3-27b-scalar"}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """name -> (path, the Hugging Face config it stands for)."""
    d = tmp_path_factory.mktemp("tiny_gemma")
    out = {}
    for name, (hf, kw) in VARIANTS.items():
        hf = dict(hf)
        out[name] = (build_gemma(d / f"{name}.gguf", hf, **kw), hf)
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_reference(tiny, name, report):
    model, hf = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = GemmaReference(model, hf)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}

    base = logits_every_plan(model, seqs)
    emu = GemmaReference(model, hf, emulate=True, packed=packed_matrices(ref))
    grade(f"{name:22s}", family(VARIANTS[name][1]), seqs, base, ref, emu, report,
          need_emulated=name not in MANY_LAYERS)


@pytest.mark.parametrize("name", ["gemma2-q8_0", "gemma3-q4_k", "gemma3-mixed"])
def test_fast_activations_match_one_part_reference(tiny, name, report):
    """--activations fast, held as test_forward holds the other families: to the reference rounding each
    matmul input to one part."""
    model, hf = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = GemmaReference(model, hf)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = GemmaReference(model, hf, emulate=True, packed=packed_matrices(ref), one_part=True)
    grade_one_part(f"{name:22s}", seqs, base, ref, emu, report)


# Each Gemma feature, taken out of the reference (what nxd computing without it would be graded
# against): nxd's logits must be far outside the bounds they meet with it.
ABLATIONS = [
    ("gemma2-q8_0", "no sliding window", dict(sliding_window=None)),
    ("gemma2-q8_0", "no attention soft-cap", dict(attn_logit_softcapping=None)),
    ("gemma2-q8_0", "no final soft-cap", dict(final_logit_softcapping=None)),
    ("gemma3-q8_0", "no sliding window", dict(sliding_window=None)),
    ("gemma3-q8_0", "local RoPE base = global", dict(rope_local_base_freq=1_000_000.0)),
    ("gemma3-q8_0-linear", "linear scaling on every layer", dict(scale_local=True)),
    ("gemma3-q8_0-finalcap", "no final soft-cap", dict(final_logit_softcapping=None)),
    ("gemma2-27b-scalar", "query_pre_attn_scalar = head_dim", dict(query_pre_attn_scalar=64)),
    ("gemma3-27b-scalar", "query_pre_attn_scalar = head_dim", dict(query_pre_attn_scalar=64)),
]


class _ScaledLocal(GemmaReference):
    """The local layers' RoPE scaled like the global ones': what applying rope.scaling to every layer gives."""

    def __init__(self, path, hf):
        super().__init__(path, hf)
        self.local_rope = hf_rope(hf["rope_local_base_freq"], self.rope_dim, hf["rope_scaling"])


@pytest.mark.parametrize("name,what,change", ABLATIONS, ids=[f"{n}:{w}" for n, w, _ in ABLATIONS])
def test_each_feature_is_not_ignored(tiny, name, what, change, report):
    model, hf = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if change.get("scale_local"):
        wrong = _ScaledLocal(model, hf)
    else:
        wrong = GemmaReference(model, {**hf, **change})
    seqs = {s: rng.integers(0, wrong.n_vocab, n) for s, n in SEQ_LENS.items()}
    ours = split(run_eval(model, seqs, plans()["batched"], 1), seqs)
    err = max((np.abs(got - wrong.logits(toks)) / wrong.logits(toks).std()).max()
              for toks, got in zip(seqs.values(), ours))
    report(f"forward {name:22s} against a reference with {what}: max|d|/std {err:.2e}")
    assert err > 10 * TOL[family(VARIANTS[name][1])][0]


# Windows across span boundaries (NX_ATTN_SPAN = 256): a window of 300 over 700 positions starts its
# spans off the boundaries, and steps start and end on and off them.
LONG = {"gemma3-long": (gemma3_config(sliding_window=300), dict(wtype="Q8_0", seed=350, n_layer=7)),
        "gemma2-long": (gemma2_config(sliding_window=300), dict(wtype="F16", seed=351, n_layer=2))}


@pytest.mark.parametrize("name", list(LONG))
def test_long_context_windows(tmp_path, name, report):
    hf, kw = LONG[name]
    hf = dict(hf)
    model = build_gemma(tmp_path / f"{name}.gguf", hf, **kw)
    rng = np.random.default_rng(8)
    ref = GemmaReference(model, hf)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in LONG_LENS.items()}
    runs = {(plan, th): run_eval(model, seqs, steps, th) for plan, steps in long_plans().items() for th in (1, 2)}
    base = runs[("whole", 1)]
    for key, logits in runs.items():
        assert np.array_equal(logits, base), f"{key} differs from (whole, 1 thread) by {np.abs(logits - base).max()}"
    errs, wide = [], []
    unwindowed = GemmaReference(model, {**hf, "sliding_window": None})
    for toks, got in zip(seqs.values(), split(base, seqs)):
        want = ref.logits(toks)
        errs.append(np.abs(got - want) / want.std())
        if len(toks) > hf["sliding_window"]:  # the positions whose window cuts
            far = unwindowed.logits(toks)
            wide.append((np.abs(got - far) / far.std())[hf["sliding_window"]:].max())
    err = np.concatenate(errs)
    max_tol, mean_tol = TOL[family(kw)]
    report(f"forward {name:22s} {LONG_LENS[0]} positions, window {hf['sliding_window']}: max|d|/std "
           f"{err.max():.2e} mean {err.mean():.2e}; without the window {max(wide):.2e}")
    assert err.max() <= max_tol and err.mean() <= mean_tol, (err.max(), err.mean())
    assert max(wide) > 10 * max_tol


def test_generate_matches_teacher_forcing(tiny):
    """--generate on gemma2 (soft-capped logits, windows) continues as the argmax of teacher-forced logits."""
    model, hf = tiny["gemma2-q4_k"]
    from conftest import tool
    import subprocess
    prompt, n = [5, 17, 250, 3, 99], 10
    p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--generate", str(n), "--prompt-ids",
                        ",".join(map(str, prompt))], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    gen = [int(x) for x in p.stdout.split()]
    full = prompt + gen
    logits = run_eval(model, {0: full}, [f"step 0:0:{len(full)}"], 1)
    assert list(logits[len(prompt) - 1:-1].argmax(1)) == gen


# ---------------------------------------------------------------- refusals


def _refused(tmp_path, hf, mutate, **kw):
    model = build_gemma(tmp_path / "bad.gguf", hf, mutate=mutate, **kw)
    return eval_error(model, stdin="seq 0 1\nstep 0:0:1\n")


def test_refuses_gemma3_attention_softcap(tmp_path):
    def add(meta, t):
        meta["gemma3.attn_logit_softcapping"] = ("f32", 50.0)
    assert "key 'gemma3.attn_logit_softcapping' = 50" in _refused(tmp_path, gemma3_config(), add)


def test_refuses_yarn_on_gemma(tmp_path):
    def add(meta, t):
        meta["gemma3.rope.scaling.type"] = ("str", "yarn")
        meta["gemma3.rope.scaling.factor"] = ("f32", 4.0)
    assert "YaRN on gemma3 is not implemented" in _refused(tmp_path, gemma3_config(), add)


def test_refuses_bad_caps_and_window(tmp_path):
    def zero_cap(meta, t):
        meta["gemma2.final_logit_softcapping"] = ("f32", 0.0)
    assert "key 'gemma2.final_logit_softcapping' = 0: expected a positive cap" in \
        _refused(tmp_path, gemma2_config(), zero_cap)

    def zero_window(meta, t):
        meta["gemma2.attention.sliding_window"] = ("u32", 0)
    assert "key 'gemma2.attention.sliding_window' = 0" in _refused(tmp_path, gemma2_config(), zero_window)


def test_refuses_missing_post_norm(tmp_path):
    def drop(meta, t):
        del t["blk.1.post_ffw_norm.weight"]
    assert "tensor 'blk.1.post_ffw_norm.weight' is missing" in _refused(tmp_path, gemma2_config(), drop)


def test_refuses_unknown_gemma_key(tmp_path):
    def add(meta, t):
        meta["gemma2.attention.sliding_window_pattern"] = ("u32", 3)
    assert "key 'gemma2.attention.sliding_window_pattern' = 3" in _refused(tmp_path, gemma2_config(), add)


def test_refuses_gemma_tensors_on_llama(tmp_path):
    def post(meta, t):
        t["blk.0.post_attention_norm.weight"] = (np.ones(256, np.float32), None)
    model = make_tiny.build(tmp_path / "llama.gguf", wtype="Q8_0", mutate=post)
    err = eval_error(model, stdin="seq 0 1\nstep 0:0:1\n")
    assert "tensor 'blk.0.post_attention_norm.weight' is not one nxd's llama reads" in err


# ---------------------------------------------------------------- served by the daemon


def test_daemon_serves_gemma3(tmp_path):
    """nxd with two workers: greedy decoding of a gemma3 model (sliding windows cut within the answer) is
    nx-eval's, token for token; a chat request with a system message goes through Gemma 3's template."""
    from nxd_helpers import Client, Daemon
    from conftest import tool
    import subprocess
    template = (Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates" / "gemma3.jinja").read_text()
    model = build_gemma(tmp_path / "served.gguf", gemma3_config(), wtype="Q4_K", seed=360, n_layer=7, vocab=True,
                        chat_template=template.removesuffix("\n"))
    prompt, n = [1, 17, 250, 3, 99, 42], 12
    p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--generate", str(n), "--prompt-ids",
                        ",".join(map(str, prompt))], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    want = [int(x) for x in p.stdout.split()]
    with Daemon(model, tmp_path, workers=2, args=["--slots", "2", "--ctx", "256"]) as d:
        assert "chat template gemma" in d.log()
        with Client(d.sock) as c:
            toks, _, ev = c.generate(rid="t", tokens=prompt, max_tokens=n, temperature=0, ignore_eos=True)
            assert ev["event"] == "done", ev
            assert toks == want
            msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
            toks, _, ev = c.generate(rid="m", messages=msgs, max_tokens=4, temperature=0)
            assert ev["event"] == "done", ev
            # <bos> + "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n", by bytes
            assert ev["usage"]["prompt_tokens"] >= len("<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n"
                                                       "<start_of_turn>model\n") // 2


# ---------------------------------------------------------------- runtime LoRA


class _LoraGemma(GemmaReference):
    """GemmaReference with LoRA deltas on the matmuls (W + s B A, exact), as make_lora.LoraReference adds
    them to the llama reference."""

    def __init__(self, path, hf, ab=None, scale=1.0):
        super().__init__(path, hf)
        self.ab = {f"blk.{il}.{w}.weight": (a.astype(np.float64), b.astype(np.float64))
                   for (il, w), (a, b) in (ab or {}).items()}
        self.scale = scale

    def _mm(self, x, name):
        y = super()._mm(x, name)
        if name in self.ab:
            a, b = self.ab[name]
            y = y + self.scale * (x @ a.T) @ b.T
        return y


@pytest.mark.parametrize("name", ["gemma2-q4_k", "gemma3-q8_0"])
def test_runtime_lora_matches_float64(tiny, tmp_path, name, report):
    """A runtime LoRA adapter on every matrix (up's delta lands before GeGLU's product: forward.c
    lora_swiglu) adds no error of its own, in one step or in steps of a few tokens."""
    import make_lora
    from conftest import tool
    import subprocess
    model, hf = tiny[name]
    weights, arch, heads = make_lora.model_weights(model)
    ab = make_lora.random_adapter(weights, rank=4, alpha=8, seed=5, storage="F16")
    adapter = make_lora.write_gguf_lora(tmp_path / "a.gguf", arch, ab, alpha=8, dtype="F16", heads=heads)
    user = 1.5
    toks = [5, 17, 42, 99, 7, 123, 64, 3, 200, 11]
    base_ref, lora_ref = _LoraGemma(model, hf).logits(toks), _LoraGemma(model, hf, ab, user * 8 / 4).logits(toks)
    outs = {}
    for plan in ([(0, 10)], [(0, 4), (4, 3), (7, 3)]):
        text = f"seq 0 {' '.join(map(str, toks))}\n" + "".join(f"step 0:{a}:{n}\n" for a, n in plan)
        p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--lora", f"{adapter}:{user}"],
                           input=text.encode(), capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        outs[len(plan)] = p.stdout
    assert outs[1] == outs[3]
    got = np.frombuffer(outs[1], np.float32).reshape(len(toks), -1)
    base = run_eval(model, {0: toks}, ["step 0:0:10"], 1)
    worst_base = np.abs(base - base_ref).max()
    worst = np.abs(got - lora_ref).max()
    effect = np.abs(lora_ref - base_ref).max()
    report(f"lora {name:22s}: runtime delta vs float64 max abs {worst:.2e} (base {worst_base:.2e}, "
           f"effect {effect:.2f})")
    assert worst <= 2 * worst_base + 5e-3, (worst, worst_base)
    assert effect > 50 * worst, (effect, worst)


def test_q8_cache_refused_with_an_attention_softcap(tmp_path):
    """The q8_0 cache's kernels have no soft-cap: gemma2 with --kv-type q8_0 is refused naming it, gemma3
    (no attention soft-cap) runs."""
    import subprocess
    from conftest import tool
    g2 = build_gemma(tmp_path / "g2.gguf", gemma2_config())
    err = eval_error(g2, ("--kv-type", "q8_0"), "seq 0 1\nstep 0:0:1\n")
    assert "--kv-type q8_0" in err and "attn_logit_softcapping" in err, err
    g3 = build_gemma(tmp_path / "g3.gguf", gemma3_config())
    p = subprocess.run([str(tool("nx-eval")), str(g3), "--kv-type", "q8_0"], input=b"seq 0 1\nstep 0:0:1\n",
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
