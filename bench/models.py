"""models.py - the benchmark's model files: re-quantizations of the default model with OUR quantizer
(build/libnx.so, nx_type_ref(t)->quant), a Qwen2.5-0.5B-shaped qwen2 model with random weights and a
Qwen3-30B-A3B-shaped qwen3moe model (fewer layers) with random weights.

Type choice follows llama.cpp's llama_tensor_get_type() so that our "Q4_K_M" is what llama-quantize
would make from the same weights:
  - Q4_K by default; attn_v and ffn_down in Q6_K for the layers where use_more_bits() holds
    (the first and last eighth and every third layer in between: about half);
  - the output matrix (token_embd when tied) in Q6_K, or Q8_0 when its rows are not a multiple of 256;
  - any tensor whose rows are not a multiple of 256 (QK_K) falls back: Q4_K -> Q5_0, Q6_K -> Q8_0
    (SmolLM2-135M's dim 576 and Qwen2.5-0.5B's 896 are not, so their attention and gate/up
    matrices end up Q5_0 in llama.cpp's Q4_K_M files too);
  - 1-D tensors (norms, biases) stay F32.
Files are written with the gguf package into a cache directory and reused when present.
"""
import ctypes
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import gguf

T = gguf.GGMLQuantizationType
QK_K = 256
FTYPE = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2}  # llama_ftype: LLAMA_FTYPE_MOSTLY_Q4_K_M, _Q8_0, _Q4_0


class _Traits(ctypes.Structure):
    # struct nx_type_traits (kern/quant.h)
    _fields_ = [("name", ctypes.c_char_p), ("blck", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("dequant", ctypes.c_void_p), ("quant", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("dot", ctypes.c_void_p)]


_DEQ = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_Q = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class NxQuant:
    """Our reference quantizers through ctypes; calls release the GIL, so rows are split over threads."""

    def __init__(self, libpath, threads=2):
        self.lib = ctypes.CDLL(libpath)
        self.lib.nx_type_ref.restype = ctypes.POINTER(_Traits)
        self.lib.nx_type_ref.argtypes = [ctypes.c_int]
        self.threads = threads

    def _traits(self, t):
        p = self.lib.nx_type_ref(int(t))
        if not p:
            raise ValueError(f"libnx: no traits for type {T(t).name}")
        return p.contents

    def row_bytes(self, t, n):
        tr = self._traits(t)
        return n // tr.blck * tr.type_size

    def _split(self, rows):
        k = max(1, min(self.threads, rows))
        step = (rows + k - 1) // k
        return [(a, min(rows, a + step)) for a in range(0, rows, step)]

    def dequant(self, t, data, rows, cols):
        tr = self._traits(t)
        if not tr.dequant:
            raise ValueError(f"libnx cannot dequantize {T(t).name}")
        fn = _DEQ(tr.dequant)
        src = np.ascontiguousarray(data, dtype=np.uint8).reshape(rows, -1)
        out = np.empty((rows, cols), dtype=np.float32)

        def run(ab):
            a, b = ab
            fn(src[a:b].ctypes.data, out[a:b].ctypes.data, (b - a) * cols)

        with ThreadPoolExecutor(self.threads) as ex:
            list(ex.map(run, self._split(rows)))
        return out

    def quant(self, t, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = x.shape
        tr = self._traits(t)
        if not tr.quant:
            raise ValueError(f"libnx cannot quantize to {T(t).name}")
        if cols % tr.blck:
            raise ValueError(f"{T(t).name}: rows of {cols} are not a multiple of {tr.blck}")
        fn = _Q(tr.quant)
        out = np.empty((rows, cols // tr.blck * tr.type_size), dtype=np.uint8)

        def run(ab):
            a, b = ab
            fn(x[a:b].ctypes.data, out[a:b].ctypes.data, (b - a) * cols)

        with ThreadPoolExecutor(self.threads) as ex:
            list(ex.map(run, self._split(rows)))
        return out


def use_more_bits(i, n):
    # llama.cpp's use_more_bits(i_layer, n_layers)
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name):
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" else -1


def pick_type(mode, name, ne0, n_layer, has_output):
    """GGML type for a 2-D weight `name` whose rows have ne0 elements, as llama.cpp's quantizer picks it."""
    if mode == "q8_0":
        return T.Q8_0
    is_output = name == "output.weight" or (not has_output and name == "token_embd.weight")
    if mode == "q4_0":
        return (T.Q8_0 if ne0 % QK_K else T.Q6_K) if is_output else T.Q4_0
    assert mode == "q4_k_m", mode
    if is_output:
        return T.Q8_0 if ne0 % QK_K else T.Q6_K
    t = T.Q4_K
    if "attn_v.weight" in name or "ffn_down" in name:
        if use_more_bits(_layer(name), n_layer):
            t = T.Q6_K
    if ne0 % QK_K:  # k-quants need whole 256-element super-blocks: llama.cpp's fallbacks
        t = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}[t]
    return t


def _copy_kv(reader, writer, overrides):
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        if field.name in overrides:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for k, (v, vt) in overrides.items():
        writer.add_key_value(k, v, vt)


def requantize(libpath, src, dst, mode, threads=2, log=print):
    """Dequantize every 2-D weight of src to f32 with our dequantizer and quantize it to mode's mixture."""
    t0 = time.time()
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    has_output = any(t.name == "output.weight" for t in r.tensors)
    nq = NxQuant(libpath, threads)
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    _copy_kv(r, w, {"general.file_type": (FTYPE[mode], gguf.GGUFValueType.UINT32)})
    counts = {}
    for t in r.tensors:
        shape = [int(s) for s in t.shape]  # ne0 first
        if len(shape) == 1:
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32), raw_dtype=T.F32)
            continue
        ne0, rows = shape[0], int(np.prod(shape[1:]))
        want = pick_type(mode, t.name, ne0, n_layer, has_output)
        counts[want.name] = counts.get(want.name, 0) + 1
        if t.tensor_type == want:
            data = np.array(t.data, dtype=np.uint8).reshape(rows, -1)
        else:
            f = (np.array(t.data, dtype=np.float32).reshape(rows, ne0) if t.tensor_type == T.F32
                 else nq.dequant(t.tensor_type, np.array(t.data).view(np.uint8), rows, ne0))
            data = nq.quant(want, f)
        w.add_tensor(t.name, data.reshape(list(reversed(shape[1:])) + [-1]), raw_dtype=want)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    log(f"models: wrote {dst} ({mode}: {counts}) in {time.time() - t0:.1f} s")


# ---------------------------------------------------------------- random models of real shapes

# Shapes from each model's config.json; weights random, quantized by us. Only the shapes, types and
# layout matter to the benchmark (it sends token ids); both engines must load the file.
QWEN = dict(arch="qwen2", name="Qwen2.5-0.5B", dim=896, n_layer=24, n_head=14, n_kv=2, ffn=4864, vocab=151936,
            n_ctx=32768, rope_base=1000000.0, eps=1e-6, bias=True)
QWEN3 = dict(arch="qwen3", name="Qwen3-0.6B", dim=1024, n_layer=28, n_head=16, n_kv=8, head_dim=128, ffn=3072,
             vocab=151936, n_ctx=40960, rope_base=1000000.0, eps=1e-6, qk_norm=True)
# Llama 3.2 1B, with its RoPE frequency factors (rope_scaling: llama3, factor 32, low 1, high 4, 8192).
LLAMA1B = dict(arch="llama", name="Llama-3.2-1B", dim=2048, n_layer=16, n_head=32, n_kv=8, ffn=8192, vocab=128256,
               n_ctx=131072, rope_base=500000.0, eps=1e-5,
               llama3_rope=dict(factor=32.0, low=1.0, high=4.0, original=8192))


def _byte_chars():
    # GPT-2's bytes_to_unicode(): the 256 printable stand-ins byte-level BPE uses for raw bytes.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_USER = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
             "<|repo_name|>", "<|file_sep|>"]


def synthetic_vocab(n_vocab, n_normal=151643, specials=QWEN_SPECIALS, user=QWEN_USER):
    """A byte-level BPE vocabulary: 256 byte tokens, pair and triple merges up to n_normal, the
    special (control) tokens, user-defined ones, then [PADn] up to n_vocab. Only its size and layout
    matter: the benchmark sends token ids, but both engines must load it (llama.cpp needs a newline
    token)."""
    chars = _byte_chars()
    toks, merges = list(chars), []
    pairs = []
    for a in chars:
        for b in chars:
            if len(toks) >= n_normal:
                break
            toks.append(a + b)
            merges.append(f"{a} {b}")
            pairs.append(a + b)
    k = 0
    while len(toks) < n_normal:
        p, c = pairs[k // 256], chars[k % 256]
        toks.append(p + c)
        merges.append(f"{p} {c}")
        k += 1
    types = [gguf.TokenType.NORMAL] * len(toks)
    for s in specials:
        toks.append(s)
        types.append(gguf.TokenType.CONTROL)
    for s in user:
        toks.append(s)
        types.append(gguf.TokenType.USER_DEFINED)
    while len(toks) < n_vocab:
        toks.append(f"[PAD{len(toks)}]")
        types.append(gguf.TokenType.USER_DEFINED)
    return toks, types, merges


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def llama3_rope_factors(head_dim, base, factor, low, high, original):
    """rope_freqs.weight as llama.cpp's converter writes it for rope_scaling llama3 (LlamaModel's
    generate_extra_tensors): per pair, the divisor of its frequency."""
    out = []
    low_wl, high_wl = original / low, original / high
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wl = 2 * np.pi / freq
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (original / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def make_random(libpath, dst, q, mode="q4_k_m", threads=2, seed=0, log=print):
    """A model of q's shapes (a dict above) with random weights, tied embeddings, quantized by us."""
    t0 = time.time()
    d, nl = q["dim"], q["n_layer"]
    hd = q.get("head_dim", d // q["n_head"])
    qd, kvd = q["n_head"] * hd, q["n_kv"] * hd
    rng = np.random.default_rng(seed)
    nq = NxQuant(libpath, threads)
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, q["arch"])
    w.add_name(f"{q['name']}-shaped random (nxd bench)")
    w.add_block_count(nl)
    w.add_context_length(q["n_ctx"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(q["ffn"])
    w.add_head_count(q["n_head"])
    w.add_head_count_kv(q["n_kv"])
    if "head_dim" in q:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_freq_base(q["rope_base"])
    w.add_layer_norm_rms_eps(q["eps"])
    w.add_file_type(FTYPE[mode])
    if q["arch"] == "llama":
        w.add_vocab_size(q["vocab"])
        w.add_rope_dimension_count(hd)
        specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(254)]
        toks, types, merges = synthetic_vocab(q["vocab"], n_normal=128000, specials=specials, user=[])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_bos_token_id(128000)
        w.add_eos_token_id(128001)
    else:
        toks, types, merges = synthetic_vocab(q["vocab"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_bos_token_id(151643)
        w.add_eos_token_id(151645)
        w.add_pad_token_id(151643)
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)

    def weight(name, ne0, ne1, std=0.02):
        t = pick_type(mode, name, ne0, nl, has_output=False)
        x = rng.standard_normal((ne1, ne0), dtype=np.float32) * np.float32(std)
        w.add_tensor(name, nq.quant(t, x), raw_dtype=t)

    def vec(name, n, val=None):
        x = np.full(n, val, np.float32) if val is not None else rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
        w.add_tensor(name, x, raw_dtype=T.F32)

    weight("token_embd.weight", d, q["vocab"])
    if "llama3_rope" in q:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(hd, q["rope_base"], **q["llama3_rope"]),
                     raw_dtype=T.F32)
    for i in range(nl):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d, 1.0)
        for t, n in (("q", qd), ("k", kvd), ("v", kvd)):
            weight(p + f"attn_{t}.weight", d, n)
            if q.get("bias"):
                vec(p + f"attn_{t}.bias", n)
        if q.get("qk_norm"):
            vec(p + "attn_q_norm.weight", hd, 1.0)
            vec(p + "attn_k_norm.weight", hd, 1.0)
        weight(p + "attn_output.weight", qd, d)
        vec(p + "ffn_norm.weight", d, 1.0)
        weight(p + "ffn_gate.weight", d, q["ffn"])
        weight(p + "ffn_up.weight", d, q["ffn"])
        weight(p + "ffn_down.weight", q["ffn"], d)
    vec("output_norm.weight", d, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    log(f"models: wrote {dst} ({q['arch']} {q['name']}-shaped, random, {mode}) in {time.time() - t0:.1f} s")


def make_qwen(libpath, dst, mode="q4_k_m", threads=2, seed=0, log=print):
    """Qwen2.5-0.5B's shapes (tied embeddings, Q/K/V biases) with random weights, quantized by us."""
    make_random(libpath, dst, QWEN, mode, threads, seed, log)


# ---------------------------------------------------------------- Qwen3-30B-A3B-shaped MoE model

# Qwen3-30B-A3B's config (48 layers there), its layers cut to what this machine holds twice over
# (nxd's copy and the page cache llama.cpp reads): the same 128 experts, 8 per token, 768 each.
QWEN3MOE = dict(dim=2048, n_layer=12, n_head=32, n_kv=4, head_dim=128, ffn=6144, ffn_exp=768, n_expert=128,
                n_used=8, vocab=151936, n_ctx=40960, rope_base=1000000.0, eps=1e-6)
DRAWS = 8  # distinct random experts per tensor; expert e holds draw e % DRAWS


def make_qwen3moe(libpath, dst, mode="q4_k_m", threads=2, seed=0, log=print, n_layer=None):
    """Qwen3-30B-A3B's shapes (untied output, per-head Q/K norms, 128 experts of which 8 per token, the
    router F32 as the converter keeps it) with random weights, quantized by us as llama.cpp's Q4_K_M
    picks types. To keep the build short, each expert tensor's experts repeat DRAWS random draws: the
    bytes a token reads are as many (each expert has its own copy), only the values repeat."""
    t0 = time.time()
    q = dict(QWEN3MOE)
    if n_layer:
        q["n_layer"] = n_layer
    d, nl, hd, ne, ff = q["dim"], q["n_layer"], q["head_dim"], q["n_expert"], q["ffn_exp"]
    qd, kvd = q["n_head"] * hd, q["n_kv"] * hd
    rng = np.random.default_rng(seed)
    nq = NxQuant(libpath, threads)
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, "qwen3moe")
    w.add_name(f"Qwen3-30B-A3B-shaped random, {nl} layers (nxd bench)")
    w.add_block_count(nl)
    w.add_context_length(q["n_ctx"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(q["ffn"])
    w.add_head_count(q["n_head"])
    w.add_head_count_kv(q["n_kv"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(q["rope_base"])
    w.add_layer_norm_rms_eps(q["eps"])
    w.add_expert_count(ne)
    w.add_expert_used_count(q["n_used"])
    w.add_expert_feed_forward_length(ff)
    w.add_file_type(FTYPE[mode])
    toks, types, merges = synthetic_vocab(q["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(151643)
    w.add_eos_token_id(151645)
    w.add_pad_token_id(151643)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def quantized(name, ne0, ne1, std):
        t = pick_type(mode, name, ne0, nl, has_output=True)
        x = rng.standard_normal((ne1, ne0), dtype=np.float32) * np.float32(std)
        return nq.quant(t, x), t

    def weight(name, ne0, ne1, std=0.02):
        data, t = quantized(name, ne0, ne1, std)
        w.add_tensor(name, data, raw_dtype=t)

    def experts(name, ne0, ne1, std=0.02):
        draws = [quantized(name, ne0, ne1, std) for _ in range(DRAWS)]
        data = np.stack([draws[e % DRAWS][0] for e in range(ne)])  # (n_expert, ne1, bytes)
        w.add_tensor(name, data, raw_dtype=draws[0][1])

    def vec(name, n, val=1.0):
        w.add_tensor(name, np.full(n, val, np.float32), raw_dtype=T.F32)

    weight("token_embd.weight", d, q["vocab"])
    for i in range(nl):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d)
        weight(p + "attn_q.weight", d, qd)
        weight(p + "attn_k.weight", d, kvd)
        weight(p + "attn_v.weight", d, kvd)
        vec(p + "attn_q_norm.weight", hd)
        vec(p + "attn_k_norm.weight", hd)
        weight(p + "attn_output.weight", qd, d)
        vec(p + "ffn_norm.weight", d)
        router = rng.standard_normal((ne, d), dtype=np.float32) * np.float32(0.02)
        w.add_tensor(p + "ffn_gate_inp.weight", router, raw_dtype=T.F32)
        experts(p + "ffn_gate_exps.weight", d, ff)
        experts(p + "ffn_up_exps.weight", d, ff)
        experts(p + "ffn_down_exps.weight", ff, d)
    vec("output_norm.weight", d)
    weight("output.weight", d, q["vocab"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    log(f"models: wrote {dst} (qwen3moe 30B-A3B-shaped, {nl} layers, random, {mode}) in {time.time() - t0:.1f} s")


def bytes_per_token(path):
    """Weight bytes one decode step reads: every layer tensor, the output norm and the output matrix
    (token_embd when tied); the embedding row for the input token is negligible and left out. Of a
    mixture-of-experts tensor (ffn_*_exps), the experts one token takes: expert_used_count of
    expert_count (the active bytes)."""
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    n_exp = r.fields.get(f"{arch}.expert_count")
    share = int(r.fields[f"{arch}.expert_used_count"].contents()) / int(n_exp.contents()) if n_exp else 1.0
    total = 0
    for t in r.tensors:
        if t.name.endswith("_exps.weight"):
            total += int(t.n_bytes * share)
        elif t.name.startswith("blk.") or t.name in ("output.weight", "output_norm.weight"):
            total += int(t.n_bytes)
        elif t.name == "token_embd.weight" and "output.weight" not in names:
            total += int(t.n_bytes)
    return total


def describe(path):
    """Counts of tensor types and the file's size, for the report."""
    r = gguf.GGUFReader(path)
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return {"path": path, "bytes": os.path.getsize(path), "types": counts,
            "bytes_per_token": bytes_per_token(path)}


if __name__ == "__main__":
    # python bench/models.py LIBNX SRC DST q4_k_m|q8_0     or     python bench/models.py LIBNX qwen|qwen3moe DST
    lib, what, dst = sys.argv[1:4]
    if what == "qwen":
        make_qwen(lib, dst)
    elif what == "qwen3moe":
        make_qwen3moe(lib, dst)
    else:
        requantize(lib, what, dst, sys.argv[4])
    print(describe(dst))


def make_truncated(src, dst, n_keep, log=print):
    """A draft model for src: its first n_keep layers and its head (embedding, output norm, output or tied
    embedding, rope factors), the tensors copied byte for byte, block_count set to n_keep; every other key
    (the vocabulary) as src's. Its drafts have a known relation to src's answers."""
    t0 = time.time()
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    _copy_kv(r, w, {f"{arch}.block_count": (n_keep, gguf.GGUFValueType.UINT32),
                    "general.name": (f"first {n_keep} layers of {os.path.basename(src)}", gguf.GGUFValueType.STRING)})
    for t in r.tensors:
        if t.name.startswith("blk.") and _layer(t.name) >= n_keep:
            continue
        shape = [int(s) for s in t.shape]  # ne0 first
        if len(shape) == 1:
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32), raw_dtype=T.F32)
            continue
        rows = int(np.prod(shape[1:]))
        data = np.array(t.data, dtype=np.uint8).reshape(rows, -1)
        w.add_tensor(t.name, data.reshape(list(reversed(shape[1:])) + [-1]), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    log(f"models: wrote {dst} (the first {n_keep} layers and the head) in {time.time() - t0:.1f} s")


def make_damped(src, dst, from_layer, scale, log=print):
    """src with the output projections (attn_output, ffn_down) of layers >= from_layer scaled by scale, by
    their Q4_0 blocks' f16 scales (exact: a block's values are d * q): what those layers add to the residual
    shrinks, so src's first from_layer layers and head (make_truncated) predict its tokens the better the
    smaller scale is, 0 giving the same argmax. A target of known relation to a cheap draft."""
    t0 = time.time()
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    _copy_kv(r, w, {"general.name": (f"{os.path.basename(src)}, layers >= {from_layer} damped x{scale}",
                                     gguf.GGUFValueType.STRING)})
    for t in r.tensors:
        shape = [int(s) for s in t.shape]
        if len(shape) == 1:
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32), raw_dtype=T.F32)
            continue
        rows = int(np.prod(shape[1:]))
        data = np.array(t.data, dtype=np.uint8).reshape(rows, -1)
        if (_layer(t.name) >= from_layer and ("attn_output" in t.name or "ffn_down" in t.name)):
            if t.tensor_type != T.Q4_0:
                raise ValueError(f"make_damped: {t.name} is {T(t.tensor_type).name}, not Q4_0")
            blocks = data.reshape(-1, 18).copy()
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32) * np.float32(scale)
            blocks[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
            data = blocks.reshape(rows, -1)
        w.add_tensor(t.name, data.reshape(list(reversed(shape[1:])) + [-1]), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    log(f"models: wrote {dst} (layers >= {from_layer}: output projections x{scale}) in {time.time() - t0:.1f} s")
