"""test_forward_gemma1.py - gemma (Gemma 1: gemma-2b/7b, CodeGemma) through tools/nx-eval against the float64 reference on tiny random models.

Each model is written as llama.cpp's converter writes a Hugging Face GemmaForCausalLM checkpoint
(convert_hf_to_gguf.py: GemmaModel): context, embedding, block count, FFN length, heads, KV heads, RMS
epsilon, key_length and value_length (head_dim) - no rope.freq_base (HF's rope_theta 10000), no caps, no
window; norm weights stored as 1 + w; the tensors of gguf-py's GEMMA (no post-norms: HF's
post_attention_layernorm is the FFN's pre-norm, ffn_norm); no output.weight (tied). Graded against
reference.GemmaReference, written from modeling_gemma.py, with test_forward's plans, thread counts and
bounds; and each Gemma feature taken out of the reference is far outside those bounds.
"""
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import gguf

import make_tiny
from reference import GemmaReference
from test_forward import (family, SEQ_LENS, TOL, eval_error, grade, grade_one_part, logits_every_plan,
                          packed_matrices, plans, run_eval, split)


def gemma_config(**kw):
    """A Hugging Face GemmaConfig's keys the model depends on (its defaults)."""
    return {"arch": "gemma", "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
            "hidden_activation": "gelu_pytorch_tanh", **kw}


def build_gemma1(path, hf, wtype="Q8_0", seed=0, dim=256, n_layer=3, n_head=4, n_head_kv=1, head_dim=64,
                 n_ff=512, n_vocab=300, n_ctx=8192, types=None, mutate=None, vocab=False, chat_template=None):
    """Writes the GGUF llama.cpp's converter makes of a GemmaForCausalLM checkpoint with config hf; hf gets
    head_dim."""
    rng = np.random.default_rng(seed)
    hf["head_dim"] = head_dim
    types = dict(types or {})
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def ty(role):
        return types.get(role, wtype)

    a = "gemma"
    meta = {  # GemmaModel.set_gguf_parameters
        f"{a}.context_length": ("u32", n_ctx),
        f"{a}.embedding_length": ("u32", dim),
        f"{a}.block_count": ("u32", n_layer),
        f"{a}.feed_forward_length": ("u32", n_ff),
        f"{a}.attention.head_count": ("u32", n_head),
        f"{a}.attention.head_count_kv": ("u32", n_head_kv),
        f"{a}.attention.layer_norm_rms_epsilon": ("f32", hf["rms_norm_eps"]),
        f"{a}.attention.key_length": ("u32", head_dim),
        f"{a}.attention.value_length": ("u32", head_dim),
    }

    def norm(n):  # HF's weight w is stored as 1 + w
        return ((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), None)

    t = {"token_embd.weight": make_tiny.weight(rng, n_vocab, dim, ty("embd"), 3.0 / np.sqrt(dim)),
         "output_norm.weight": norm(dim)}
    for il in range(n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(dim)
        t[p + "attn_q.weight"] = make_tiny.weight(rng, q_dim, dim, ty("q"), 1 / np.sqrt(dim))
        t[p + "attn_k.weight"] = make_tiny.weight(rng, kv_dim, dim, ty("k"), 1 / np.sqrt(dim))
        t[p + "attn_v.weight"] = make_tiny.weight(rng, kv_dim, dim, ty("v"), 1 / np.sqrt(dim))
        t[p + "attn_output.weight"] = make_tiny.weight(rng, dim, q_dim, ty("o"), 1 / np.sqrt(q_dim))
        t[p + "ffn_norm.weight"] = norm(dim)
        t[p + "ffn_gate.weight"] = make_tiny.weight(rng, n_ff, dim, ty("gate"), 1 / np.sqrt(dim))
        t[p + "ffn_up.weight"] = make_tiny.weight(rng, n_ff, dim, ty("up"), 1 / np.sqrt(dim))
        t[p + "ffn_down.weight"] = make_tiny.weight(rng, dim, n_ff, ty("down"), 1 / np.sqrt(n_ff))
    if mutate:
        mutate(meta, t)
    w = gguf.GGUFWriter(str(path), meta.pop("general.architecture", ("str", a))[1])
    for k, (kind, v) in meta.items():
        {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string, "bool": w.add_bool}[kind](k, v)
    if vocab:
        add_gemma_vocab(w, n_vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for name, (arr, raw) in t.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_gemma_vocab(w, n_vocab):
    """A SentencePiece vocabulary laid out as Gemma's begins (<pad> <eos> <bos> <unk>, its turn markers
    control tokens), then the 256 byte tokens and words: any text encodes, "<bos>" and the markers as one
    token each. BOS added, no space prefix, as the converter writes Gemma's."""
    toks = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581w{i}" for i in range(n_vocab - len(toks))]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * len(toks))
    w.add_token_types([3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * (len(toks) - 262))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)


# (name, hf config, build kwargs). The float models keep few K/V values per position (two layers, one kv
# head: see test_forward_gemma.py's VARIANTS); gemma-2b's multi-query attention (one kv head) in all but
# the 7b-shaped ones, whose kv heads are all the query heads and whose Q is wider than the embedding
# (gemma-7b: 16 heads of 256 over 3072).
VARIANTS = {}
for _i, _ty in enumerate(["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K"]):
    _float = _ty in ("F32", "F16", "BF16")
    VARIANTS[f"gemma-{_ty.lower()}"] = (gemma_config(), dict(wtype=_ty, seed=400 + _i,
                                                              **(dict(n_layer=2) if _float else {})))
VARIANTS["gemma-2b-hd256"] = (gemma_config(), dict(wtype="Q8_0", seed=420, head_dim=256, n_head=2, n_head_kv=1))
VARIANTS["gemma-7b-shape"] = (gemma_config(), dict(wtype="Q4_K", seed=421, head_dim=128, n_head=4, n_head_kv=4))
VARIANTS["gemma-mixed"] = (gemma_config(), dict(wtype="Q4_K", seed=422, n_head=4, n_head_kv=2,
                                                types=dict(embd="Q8_0", v="Q6_K", k="Q5_0", o="Q4_1",
                                                           down="Q6_K", up="Q5_K", gate="F16")))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """name -> (path, the Hugging Face config it stands for)."""
    d = tmp_path_factory.mktemp("tiny_gemma1")
    out = {}
    for name, (hf, kw) in VARIANTS.items():
        hf = dict(hf)
        out[name] = (build_gemma1(d / f"{name}.gguf", hf, **kw), hf)
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_reference(tiny, name, report):
    model, hf = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = GemmaReference(model, hf)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs)
    emu = GemmaReference(model, hf, emulate=True, packed=packed_matrices(ref))
    grade(f"{name:22s}", family(VARIANTS[name][1]), seqs, base, ref, emu, report)


@pytest.mark.parametrize("name", ["gemma-q8_0", "gemma-mixed"])
def test_fast_activations_match_one_part_reference(tiny, name, report):
    model, hf = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = GemmaReference(model, hf)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = GemmaReference(model, hf, emulate=True, packed=packed_matrices(ref), one_part=True)
    grade_one_part(f"{name:22s}", seqs, base, ref, emu, report)


class _NoEmbdScale(GemmaReference):
    def __init__(self, path, hf):
        super().__init__(path, hf)
        self.embd_scale = 1.0


class _PlainNorm(GemmaReference):
    """RMSNorm times HF's w, not 1 + w: what reading HF's weights as llama's would give."""

    def __init__(self, path, hf):
        super().__init__(path, hf)
        self.norm_offset = 0.0


class _PostNorms(GemmaReference):
    """Gemma 2's block: the output norms after attention and FFN (with the pre-norm's weights, the only
    ones the file has): what computing gemma as gemma2 would give."""

    def __init__(self, path, hf):
        super().__init__(path, hf)
        self.arch = "gemma2"
        self.hf = {**hf, "query_pre_attn_scalar": hf["head_dim"], "sliding_window": None,
                   "attn_logit_softcapping": None, "final_logit_softcapping": None}
        self.t = dict(self.t)
        for il in range(self.n_layer):
            self.t[f"blk.{il}.post_attention_norm.weight"] = self.t[f"blk.{il}.attn_norm.weight"]
            self.t[f"blk.{il}.post_ffw_norm.weight"] = self.t[f"blk.{il}.ffn_norm.weight"]


# Each Gemma feature, taken out of the reference (what nxd computing without it would be graded against):
# nxd's logits must be far outside the bounds they meet with it.
ABLATIONS = [
    ("gemma-q8_0", "no embedding scale", lambda m, hf: _NoEmbdScale(m, hf)),
    ("gemma-q8_0", "RMSNorm by w, not 1 + w", lambda m, hf: _PlainNorm(m, hf)),
    ("gemma-q8_0", "SwiGLU, not GeGLU", lambda m, hf: GemmaReference(m, {**hf, "hidden_activation": "silu"})),
    ("gemma-q8_0", "Gemma 2's post-norms", lambda m, hf: _PostNorms(m, hf)),
]


@pytest.mark.parametrize("name,what,wrong", ABLATIONS, ids=[f"{n}:{w}" for n, w, _ in ABLATIONS])
def test_each_feature_is_not_ignored(tiny, name, what, wrong, report):
    model, hf = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = wrong(model, hf)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    ours = split(run_eval(model, seqs, plans()["batched"], 1), seqs)
    err = max((np.abs(got - ref.logits(toks)) / ref.logits(toks).std()).max()
              for toks, got in zip(seqs.values(), ours))
    report(f"forward {name:22s} against a reference with {what}: max|d|/std {err:.2e}")
    assert err > 10 * TOL[family(VARIANTS[name][1])][0]


# ---------------------------------------------------------------- refusals


def _refused(tmp_path, mutate):
    model = build_gemma1(tmp_path / "bad.gguf", gemma_config(), mutate=mutate)
    return eval_error(model, stdin="seq 0 1\nstep 0:0:1\n")


@pytest.mark.parametrize("key,kind,value,want", [
    ("attn_logit_softcapping", "f32", 50.0, "soft-capping of the attention scores is not implemented"),
    ("final_logit_softcapping", "f32", 30.0, "soft-capping of the logits is not implemented"),
    ("attention.sliding_window", "u32", 4096, "sliding-window attention is not implemented"),
    ("rope.freq_base_swa", "f32", 10000.0, "sliding-window layers' own RoPE base is not implemented"),
])
def test_refuses_gemma2_keys(tmp_path, key, kind, value, want):
    """Gemma 2's and 3's keys on a gemma file would change the arithmetic: refused, named."""
    def add(meta, t):
        meta[f"gemma.{key}"] = (kind, value)
    err = _refused(tmp_path, add)
    assert f"key 'gemma.{key}' = " in err and want in err, err


def test_window_past_the_context_is_no_window(tmp_path, report):
    """A window no position can leave changes nothing: accepted (key_rules' IF_CTX)."""
    import subprocess
    from conftest import tool

    def add(meta, t):
        meta["gemma.attention.sliding_window"] = ("u32", 8192)
    model = build_gemma1(tmp_path / "w.gguf", gemma_config(), mutate=add)
    p = subprocess.run([str(tool("nx-eval")), str(model)], input=b"seq 0 1\nstep 0:0:1\n", capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr.decode()


def test_refuses_post_norms_on_gemma(tmp_path):
    def add(meta, t):
        t["blk.0.post_attention_norm.weight"] = (np.ones(256, np.float32), None)
    assert "tensor 'blk.0.post_attention_norm.weight' is not one nxd's gemma reads" in _refused(tmp_path, add)


def test_refuses_yarn_on_gemma(tmp_path):
    def add(meta, t):
        meta["gemma.rope.scaling.type"] = ("str", "yarn")
        meta["gemma.rope.scaling.factor"] = ("f32", 4.0)
    assert "YaRN on gemma is not implemented" in _refused(tmp_path, add)


# ---------------------------------------------------------------- served by the daemon

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


def test_daemon_serves_gemma_with_either_gemma1_template(tmp_path):
    """nxd with two workers: greedy decoding of a gemma model is nx-eval's, token for token; a chat request
    under Gemma 1's first template (no bos_token) and under its later one ({{ bos_token }} first) is the same
    prompt - one BOS, the tokenizer's or the template's - and the same answer."""
    from conftest import tool
    from nxd_helpers import Client, Daemon
    prompt, n = [1, 17, 250, 3, 99, 42], 12
    answers = []
    for name in ("gemma-7b-it.jinja", "gemma2.jinja"):
        template = (TEMPLATES / name).read_text().removesuffix("\n")
        d = tmp_path / name
        d.mkdir()
        model = build_gemma1(d / "served.gguf", gemma_config(), wtype="Q4_K", seed=430, vocab=True,
                             chat_template=template)
        p = subprocess.run([str(tool("nx-eval")), str(model), "--threads", "2", "--generate", str(n), "--prompt-ids",
                            ",".join(map(str, prompt))], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode()
        want = [int(x) for x in p.stdout.split()]
        with Daemon(model, d, workers=2, args=["--slots", "2", "--ctx", "256"]) as dm:
            assert "chat template gemma" in dm.log()
            with Client(dm.sock) as c:
                toks, _, ev = c.generate(rid="t", tokens=prompt, max_tokens=n, temperature=0, ignore_eos=True)
                assert ev["event"] == "done", ev
                assert toks == want
                msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                        {"role": "user", "content": "bye"}]
                toks, _, ev = c.generate(rid="m", messages=msgs, max_tokens=4, temperature=0, ignore_eos=True)
                assert ev["event"] == "done", ev
                answers.append((ev["usage"]["prompt_tokens"], toks))
    # one token each for <bos> and the 7 turn markers, the rest of the text by bytes
    text = "user\nhi\nmodel\nhello\nuser\nbye\nmodel\n"
    assert answers[0] == answers[1] and answers[0][0] == 8 + len(text), answers


@pytest.mark.parametrize("arch", ["gemma3n", "gemma-embedding"])
def test_other_gemma_architectures_refused_by_name(tmp_path, arch):
    """Gemma 3n and EmbeddingGemma are not Gemma 1's block: refused, naming the architecture."""
    def rename(meta, t):
        for k in list(meta):
            meta[arch + k[len("gemma"):]] = meta.pop(k)
        meta["general.architecture"] = ("str", arch)
    err = _refused(tmp_path, rename)
    assert f"architecture '{arch}' is not supported" in err, err
