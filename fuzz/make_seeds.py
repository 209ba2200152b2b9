#!/usr/bin/env python3
"""make_seeds.py - writes the fuzz seed corpora, the tiny vocabularies and fuzz/seeds.tsv.

    python3 fuzz/make_seeds.py            # rewrites fuzz/corpus/*, fuzz/data/*, fuzz/seeds.tsv

Everything is built here with struct packing (no downloads, no third-party
modules), deterministically, so the committed files can be regenerated and
diffed. The files:

  fuzz/corpus/gguf/         every docs/reliability.md 1-10 case, tiny valid models
                            (llama with a byte-level BPE vocab and a ChatML
                            template, qwen2 with a SentencePiece vocab), vocab-only
                            files, GGUF LoRA adapters (docs/reliability.md 12)
  fuzz/corpus/tokenizer/    inputs for fuzz_tokenizer: byte 0 picks the vocabulary
                            and the mode (see fuzz_tokenizer.c), the rest is text or ids
  fuzz/corpus/protocol/     request lines of every op and every bad-request case
  fuzz/corpus/safetensors/  docs/reliability.md 11 and 12 cases, valid PEFT adapters
  fuzz/corpus/grammar/      GBNF grammars and JSON schemas for fuzz_grammar (byte 0: mode, see fuzz_grammar.c)
  fuzz/corpus/tools/        model answers for fuzz_tools: calls, text, malformed calls; a schema and a value
  fuzz/data/                tiny-bpe.vocab, tiny-spm.vocab (GGUF vocab-only files) for
                            fuzz_tokenizer; tiny-llama.model, the model fuzz_safetensors and
                            fuzz_gguf check adapters against
  fuzz/seeds.tsv            what each seed must give in the normal build:
                            target, file, "ok" or "error", the words the error must contain

Names carry no .gguf / .safetensors suffix: those are ignored by git (models
are never committed); these are our own few-KB files.
"""
import json
import os
import shutil
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "fuzz"

# --- GGUF writer ----------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
          U64: "<Q", I64: "<q", F64: "<d"}
T_F32, T_F16, T_Q8_0 = 0, 1, 8


def s_(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def val(t, v):
    """Encodes value v of GGUF type t; arrays are (elem_type, [values])."""
    if t == STR:
        return s_(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(val(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def kv(key, t, v):
    return s_(key) + struct.pack("<I", t) + val(t, v)


def tinfo(name, ne, ttype, offset):
    return s_(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in ne) + \
        struct.pack("<IQ", ttype, offset & (2**64 - 1))


def gguf(kvs, tensors=(), version=3, align=32, n_kv=None, n_tensors=None, magic=b"GGUF"):
    """kvs: [(key, type, value)]; tensors: [(name, ne, type, data bytes)] laid out in order, aligned.
    Returns the file bytes."""
    out = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                              len(kvs) if n_kv is None else n_kv)
    out += b"".join(kv(*x) for x in kvs)
    off, infos, data = 0, [], b""
    for name, ne, ttype, raw in tensors:
        off = -(-off // align) * align
        data += b"\0" * (off - len(data)) + raw
        infos.append(tinfo(name, ne, ttype, off))
        off += len(raw)
    out += b"".join(infos)
    if tensors:
        out += b"\0" * (-len(out) % align) + data
    return out


def f32s(vals):
    return struct.pack(f"<{len(vals)}f", *vals)


def q8_0(rows, n_in, seed):
    """rows x n_in Q8_0 blocks: f16 scale + 32 int8 per 32 weights."""
    out, x = bytearray(), seed
    for _ in range(rows * n_in // 32):
        out += struct.pack("<e", 0.01)
        for _ in range(32):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            out.append((x >> 16) & 0xFF)
    return bytes(out)


# --- vocabularies --------------------------------------------------------------


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (byte-level BPE)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def bpe_vocab(full=True):
    """A byte-level BPE vocabulary: all 256 bytes (full) or a few letters, some merges, control and user tokens."""
    b2u = bytes_to_unicode()
    if full:
        tokens = [b2u[b] for b in range(256)]
    else:
        tokens = [b2u[b] for b in b" abehlnot\n"]
    merges = []
    for a, b in [("h", "e"), ("Ġ", "t"), ("Ġt", "he"), ("l", "l"), ("ll", "o"), ("Ġ", "a"), ("o", "n"),
                 ("Ġ", "b"), ("Ġb", "e"), ("n", "o"), ("Ġ", "h"), ("Ġh", "e"), ("Ġhe", "llo")]:
        if a in tokens and b in tokens and a + b not in tokens:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    if full:
        for a, b in [("Ã", "©"), ("Ġ", "Ã©"), ("ä", "¸")]:  # é, " é", a piece of a CJK char
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    types = [1] * len(tokens)
    specials = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool>", 4)]
    for text, tt in specials:
        tokens.append(text)
        types.append(tt)
    eos = tokens.index("<|endoftext|>")
    return [
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "gpt-2"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, eos),
        ("tokenizer.ggml.eos_token_id", U32, eos),
        ("tokenizer.ggml.eot_token_id", U32, tokens.index("<|im_end|>")),
        ("tokenizer.chat_template", STR, CHATML),
    ], len(tokens)


def spm_vocab(full=True):
    """A SentencePiece vocabulary: <unk> <s> </s>, byte fallback (full), scored pieces."""
    tokens, types, scores = ["<unk>", "<s>", "</s>"], [2, 3, 3], [0.0, 0.0, 0.0]
    if full:
        for b in range(256):
            tokens.append(f"<0x{b:02X}>")
            types.append(6)
            scores.append(0.0)
    pieces = ["▁", "e", "h", "l", "o", "t", "a", "n", "é", "▁t", "he", "▁the", "ll", "llo", "▁he", "▁hello",
              "▁a", "an", "▁an", "▁é", "on", "no", "▁no"]
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-float(len(pieces) - i) if len(p) > 1 else -100.0 - i)
    tokens.append("[INST]")
    types.append(4)
    scores.append(0.0)
    return [
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.ggml.add_bos_token", BOOL, 1),
        ("tokenizer.chat_template", STR, "{{ bos_token }}[INST] {{ content }} [/INST]"),
    ], len(tokens)


def sp_bpe_vocab():
    """A Gemma 4-style vocabulary (tokenizer.ggml.model gemma4): BPE over raw UTF-8 pieces, U+2581 for
    spaces, <0xXX> byte fallback, newline runs as tokens."""
    tokens, types = ["<pad>", "<eos>", "<bos>", "<unk>"], [3, 3, 3, 2]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
    pieces = ["▁", "a", "b", "e", "h", "l", "n", "o", "t", "é", "你", "\n"]
    merges = []
    for a, b in [("▁", "t"), ("h", "e"), ("▁t", "he"), ("l", "l"), ("ll", "o"), ("▁", "a"), ("▁", "é"), ("\n", "\n"),
                 ("\n\n", "\n"), ("o", "n"), ("▁", "▁")]:
        pieces.append(a + b)
        merges.append(f"{a} {b}")
    tokens += pieces
    types += [1] * len(pieces)
    tokens.append("<start_of_turn>")
    types.append(4)
    return [
        ("tokenizer.ggml.model", STR, "gemma4"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.scores", ARR, (F32, [0.0] * len(tokens))),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 2),
        ("tokenizer.ggml.eos_token_id", U32, 1),
        ("tokenizer.ggml.unknown_token_id", U32, 3),
        ("tokenizer.ggml.add_space_prefix", BOOL, 0),
    ], len(tokens)


def whitespace_vocab():
    """A whitespace-split vocabulary (tokenizer.ggml.model whitespace): pieces merged over their
    characters, whitespace dropped."""
    tokens, types = ["<s>", "<pad>", "</s>", "<unk>"], [3, 3, 3, 2]
    pieces = ["a", "b", "e", "h", "l", "o", "t", "你", "好"]
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("你", "好")]:
        pieces.append(a + b)
        merges.append(f"{a} {b}")
    tokens += pieces
    types += [1] * len(pieces)
    return [
        ("tokenizer.ggml.model", STR, "whitespace"),
        ("tokenizer.ggml.pre", STR, "whitespace"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 0),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 3),
    ], len(tokens)


# --- tiny models -------------------------------------------------------------------

DIM, N_HEAD, N_HEAD_KV, N_FF = 32, 2, 1, 32
HEAD_DIM = DIM // N_HEAD


def model(arch="llama", vocab=None, n_layer=1, tied=False, extra_kv=(), drop=(), override=None, align=32):
    """A tiny model: Q8_0 matrices, F32 norms (and qwen2 biases)."""
    vkv, n_vocab = vocab if vocab else bpe_vocab(full=False)
    kvs = [("general.architecture", STR, arch), ("general.name", STR, f"tiny {arch}"),
           (f"{arch}.block_count", U32, n_layer), (f"{arch}.context_length", U32, 64),
           (f"{arch}.embedding_length", U32, DIM), (f"{arch}.feed_forward_length", U32, N_FF),
           (f"{arch}.attention.head_count", U32, N_HEAD), (f"{arch}.attention.head_count_kv", U32, N_HEAD_KV),
           (f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-5), (f"{arch}.rope.freq_base", F32, 10000.0)]
    kvs += list(extra_kv) + vkv
    kv_dim = N_HEAD_KV * HEAD_DIM
    t = [("token_embd.weight", [DIM, n_vocab], T_Q8_0, q8_0(n_vocab, DIM, 1)),
         ("output_norm.weight", [DIM], T_F32, f32s([1.0] * DIM))]
    if not tied:
        t.append(("output.weight", [DIM, n_vocab], T_Q8_0, q8_0(n_vocab, DIM, 2)))
    for il in range(n_layer):
        p = f"blk.{il}."
        t += [(p + "attn_norm.weight", [DIM], T_F32, f32s([1.0] * DIM)),
              (p + "attn_q.weight", [DIM, DIM], T_Q8_0, q8_0(DIM, DIM, 3 + il)),
              (p + "attn_k.weight", [DIM, kv_dim], T_Q8_0, q8_0(kv_dim, DIM, 4 + il)),
              (p + "attn_v.weight", [DIM, kv_dim], T_Q8_0, q8_0(kv_dim, DIM, 5 + il)),
              (p + "attn_output.weight", [DIM, DIM], T_Q8_0, q8_0(DIM, DIM, 6 + il)),
              (p + "ffn_norm.weight", [DIM], T_F32, f32s([1.0] * DIM)),
              (p + "ffn_gate.weight", [DIM, N_FF], T_Q8_0, q8_0(N_FF, DIM, 7 + il)),
              (p + "ffn_up.weight", [DIM, N_FF], T_Q8_0, q8_0(N_FF, DIM, 8 + il)),
              (p + "ffn_down.weight", [N_FF, DIM], T_Q8_0, q8_0(DIM, N_FF, 9 + il))]
        if arch == "qwen2":
            t += [(p + "attn_q.bias", [DIM], T_F32, f32s([0.0] * DIM)),
                  (p + "attn_k.bias", [kv_dim], T_F32, f32s([0.0] * kv_dim)),
                  (p + "attn_v.bias", [kv_dim], T_F32, f32s([0.0] * kv_dim))]
    t = [x for x in t if x[0] not in drop]
    if override:
        kvs, t = override(kvs, t)
    return gguf(kvs, t, align=align)


# --- the gguf seeds ----------------------------------------------------------------
# (file name, bytes, expectation, words the error must contain). Expectations:
#   ok        gguf_parse, nx_model_bind and nx_tok_load all succeed
#   ok-parse  gguf_parse succeeds (no model or tokenizer in the file)
#   error     gguf_parse fails
#   model     gguf_parse succeeds, nx_model_bind fails
#   tok       gguf_parse succeeds, nx_tok_load fails
#   adapter   gguf_parse and nx_lora_parse_gguf (against fuzz/data/tiny-llama.model) succeed
#   lora      gguf_parse succeeds, nx_lora_parse_gguf fails

GEN = [("general.architecture", STR, "llama")]


def one_tensor(ne, ttype=T_F32, size=None, align=32, extra=(), offset=None):
    """A file with one tensor info; its data is size bytes (default: what ne x type needs, when small)."""
    if size is None:
        n = 1
        for d in ne:
            n *= d
        size = n * 4 if ttype == T_F32 else 64
    kvs = GEN + list(extra)
    if offset is None:
        return gguf(kvs, [("w", ne, ttype, b"\x11" * size)], align=align)
    hdr = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kv(*x) for x in kvs)
    hdr += tinfo("w", ne, ttype, offset)
    return hdr + b"\0" * (-len(hdr) % align) + b"\x11" * size


def raw_header(version=3, n_tensors=0, n_kv=0, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_tensors & (2**64 - 1), n_kv & (2**64 - 1))


def gguf_seeds():
    S = []
    add = lambda name, data, exp, words="": S.append((name, data, exp, words))
    tiny_llama = model("llama")
    add("ok-llama-bpe", tiny_llama, "ok")
    add("ok-qwen2-spm-tied", model("qwen2", vocab=spm_vocab(full=False), tied=True), "ok")
    add("ok-llama-2layers", model("llama", n_layer=2, extra_kv=[("general.alignment", U32, 64)], align=64), "ok")
    vb, _ = bpe_vocab()
    vs, _ = spm_vocab()
    add("ok-vocab-bpe", gguf(GEN + vb), "ok-parse")
    add("ok-vocab-spm", gguf(GEN + vs), "ok-parse")
    add("ok-empty", gguf([]), "ok-parse")
    add("ok-every-value-type", gguf([(f"k.{t}", t, v) for t, v in [
        (U8, 255), (I8, -1), (U16, 65535), (I16, -2), (U32, 7), (I32, -3), (F32, 1.5), (BOOL, 1),
        (STR, "héllo"), (U64, 2**64 - 1), (I64, -2**63), (F64, 2.5)]] +
        [("k.arr.nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["a", ""]), (ARR, [(I32, [1])])])),
         ("k.arr.empty", ARR, (F32, []))]), "ok-parse")

    # 1. magic, version, byte order
    add("r01-bad-magic", b"GGUG" + tiny_llama[4:], "error", "magic")
    add("r01-version-0", raw_header(0) , "error", "version")
    add("r01-version-1", raw_header(1), "error", "version 1")
    add("r01-version-99", raw_header(99), "error", "version 99")
    add("r01-byte-swapped", b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "error", "byte-swapped")
    add("r01-empty", b"", "error", "empty")
    # 2. counts
    for nm, n in [("minus1", -1), ("int64max", 2**63 - 1), ("sizemax-8", (2**64 - 1) // 8)]:
        add(f"r02-n-tensors-{nm}", raw_header(3, n, 0) + b"\0" * 64, "error", "n_tensors")
        add(f"r02-n-kv-{nm}", raw_header(3, 0, n) + b"\0" * 64, "error", "n_kv")
    add("r02-n-kv-one-too-many", gguf(GEN, n_kv=2), "error", "key 1")
    # 3. strings
    hdr1 = raw_header(3, 0, 1)
    add("r03-key-len-2^64-1", hdr1 + struct.pack("<Q", 2**64 - 1) + b"abc" * 20, "error", "key")
    add("r03-key-past-eof", hdr1 + struct.pack("<Q", 100) + b"general.architecture", "error", "key")
    add("r03-value-1gib", hdr1 + s_("general.name") + struct.pack("<IQ", STR, 1 << 30) + b"x" * 16, "error",
        "general.name")
    add("r03-value-len-2^64-1", hdr1 + s_("general.name") + struct.pack("<IQ", STR, 2**64 - 1), "error",
        "general.name")
    add("r03-tensor-name-huge", raw_header(3, 1, 0) + struct.pack("<Q", 2**62) + b"w" * 40, "error", "tensor")
    # 4. arrays, value types, duplicates
    add("r04-array-count-huge", hdr1 + s_("a") + struct.pack("<IIQ", ARR, U32, 2**61) + b"\0" * 32, "error", "'a'")
    add("r04-array-str-count-huge", hdr1 + s_("a") + struct.pack("<IIQ", ARR, STR, 2**60) + s_("x"), "error", "'a'")
    nest = (U8, [1])
    for _ in range(12):
        nest = (ARR, [nest])
    add("r04-nested-too-deep", gguf([("deep", ARR, nest)]), "error", "deep")
    add("r04-array-of-unknown-type", hdr1 + s_("a") + struct.pack("<IIQ", ARR, 13, 1) + b"\0" * 16, "error", "'a'")
    add("r04-value-type-13", hdr1 + s_("a") + struct.pack("<I", 13) + b"\0" * 16, "error", "'a'")
    add("r04-value-type-ffffffff", hdr1 + s_("a") + struct.pack("<I", 0xFFFFFFFF) + b"\0" * 16, "error", "'a'")
    add("r04-bool-2", gguf([("b", BOOL, 2)]), "error", "'b'")
    add("r04-duplicate-key", gguf(GEN + [("general.architecture", STR, "qwen2")]), "error", "duplicate key")
    add("r04-duplicate-tensor", gguf(GEN, [("w", [8], T_F32, b"\0" * 32), ("w", [8], T_F32, b"\0" * 32)]),
        "error", "duplicate tensor")
    add("r04-empty-key", gguf([("", U32, 1)]), "error", "empty key")
    # 5. alignment
    for a in (0, 3, 2**31):
        add(f"r05-alignment-{a}", one_tensor([8], extra=[("general.alignment", U32, a)]), "error", "alignment")
    add("r05-alignment-u64", one_tensor([8], extra=[("general.alignment", U64, 32)]), "error", "alignment")
    add("r05-alignment-string", one_tensor([8], extra=[("general.alignment", STR, "32")]), "error", "alignment")
    add("ok-alignment-1", one_tensor([8], align=1, extra=[("general.alignment", U32, 1)]), "ok-parse")
    # alignment 1 is legal GGUF, but a model whose floats land on odd addresses must not bind
    add("r05-alignment-1-misaligned-model", model(extra_kv=[("general.alignment", U32, 1), ("general.pad", STR, "x")],
                                                  align=1), "model", "not 4-byte aligned")
    # 6. n_dims
    add("r06-n-dims-5", one_tensor([8, 1, 1, 1, 1]), "error", "n_dims")
    add("r06-n-dims-0", one_tensor([]), "error", "n_dims")
    hdr_t = raw_header(3, 1, 0) + s_("w") + struct.pack("<I", 0xFFFFFFFF) + b"\0" * 64
    add("r06-n-dims-ffffffff", hdr_t, "error", "n_dims")
    # 7. dimensions
    add("r07-dim-negative", one_tensor([-1], size=64), "error", "negative")
    add("r07-dim-zero", one_tensor([0], size=64), "error", "ne[0]")
    add("r07-dim-int64max-2", one_tensor([2**63 - 1, 2, 1, 1], size=64), "error", "'w'")
    add("r07-dim-2^42+1", one_tensor([2**42 + 1], size=64), "error", "'w'")
    add("r07-dim-product-overflow", one_tensor([2**32, 2**32], size=64), "error", "'w'")
    add("r07-ne0-not-block-multiple", one_tensor([33], T_Q8_0, size=68), "error", "block size")
    # 8. tensor type
    add("r08-type-40", one_tensor([32], 40, size=64), "error", "type 40")
    add("r08-type-ffffffff", one_tensor([32], 0xFFFFFFFF, size=64), "error", "type")
    add("r08-type-removed-4", one_tensor([32], 4, size=64), "error", "type 4")
    # 9. tensor data ranges
    add("r09-past-eof", one_tensor([64], size=128), "error", "past end")
    add("r09-offset-huge", one_tensor([8], size=32, offset=2**64 - 32), "error", "'w'")
    add("r09-offset-misaligned", one_tensor([8], size=64, offset=4), "error", "alignment")
    ov = gguf(GEN, [("a", [16], T_F32, b"\0" * 64), ("b", [16], T_F32, b"\0" * 64)])
    ov = ov.replace(tinfo("b", [16], T_F32, 64), tinfo("b", [16], T_F32, 32))
    add("r09-overlap", ov, "error", "overlaps")
    rv = gguf(GEN, [("a", [8], T_F32, b"\0" * 32), ("b", [8], T_F32, b"\0" * 32)])
    rv = rv.replace(tinfo("a", [8], T_F32, 0), tinfo("a", [8], T_F32, 32)).replace(
        tinfo("b", [8], T_F32, 32), tinfo("b", [8], T_F32, 0))
    add("ok-out-of-order", rv, "ok-parse")
    # 10. truncation, wrong metadata types, layer count
    for cut in (3, 7, 23, 40, 200, len(tiny_llama) // 2, len(tiny_llama) - 1):
        add(f"r10-truncated-{cut}", tiny_llama[:cut], "error", "")
    wrong = lambda key, t, v: lambda kvs, ts: ([(k, tt, vv) if k != key else (k, t, v) for k, tt, vv in kvs], ts)
    n_tok = len(bpe_vocab(full=False)[0][2][2][1])
    add("r10-tokens-as-u8", model(override=wrong("tokenizer.ggml.tokens", ARR, (U8, [0] * n_tok))), "tok",
        "tokenizer.ggml.tokens")
    add("r10-token-type-as-f32", model(override=wrong("tokenizer.ggml.token_type", ARR, (F32, [1.0] * n_tok))),
        "tok", "token_type")
    add("r10-token-type-short", model(override=wrong("tokenizer.ggml.token_type", ARR, (I32, [1] * 3))), "tok",
        "token_type")
    add("r10-merges-as-i32", model(override=wrong("tokenizer.ggml.merges", ARR, (I32, [1]))), "tok", "merges")
    # an out-of-range special id is ignored (as llama.cpp does): the tokenizer has no BOS
    add("r10-bos-out-of-range", model(override=wrong("tokenizer.ggml.bos_token_id", U32, 10**6)), "ok")
    add("r10-unknown-tokenizer", model(override=wrong("tokenizer.ggml.model", STR, "bert")), "tok", "bert")
    add("r10-unknown-pre", model(override=wrong("tokenizer.ggml.pre", STR, "nonesuch")), "tok", "nonesuch")
    add("r10-block-count-too-big", model(override=wrong("llama.block_count", U32, 3)), "model", "blk.1")
    add("r10-block-count-as-string", model(override=wrong("llama.block_count", STR, "1")), "model",
        "block_count")
    add("r10-block-count-1000", model(override=wrong("llama.block_count", U32, 1000)), "model", "block_count")
    add("r10-head-count-0", model(override=wrong("llama.attention.head_count", U32, 0)), "model", "head_count")
    add("r10-missing-ffn-down", model(drop=("blk.0.ffn_down.weight",)), "model", "blk.0.ffn_down.weight")
    add("r10-unknown-arch", model(override=wrong("general.architecture", STR, "gpt-j")), "model", "gpt-j")

    def bad_norm(kvs, ts):
        return kvs, [(n, [DIM], T_Q8_0 if False else T_F32, r[:64]) if n == "output_norm.weight" else (n, s, t, r)
                     for n, s, t, r in ts]
    add("r10-norm-short", model(override=bad_norm), "error", "output_norm.weight")

    def wrong_shape(kvs, ts):
        # (64, 8) holds as many Q8_0 bytes as the right (32, 16): the file parses, the model does not bind
        return kvs, [(n, [64, 8] if n == "blk.0.attn_k.weight" else s, t, r) for n, s, t, r in ts]
    add("r10-k-wrong-shape", model(override=wrong_shape), "model", "attn_k.weight")

    # 12. GGUF LoRA adapters for tiny-llama.model (dim 32, kv 16, ffn 32, 2 layers)
    def adapter(mods, rank=2, arch="llama", extra=(), kind="adapter"):
        kvs = [("general.architecture", STR, arch), ("general.type", STR, kind), ("adapter.type", STR, "lora"),
               ("adapter.lora.alpha", F32, 4.0)] + list(extra)
        ts = []
        for name, n_in, n_out, ra, rb in mods:
            ts.append((name + ".weight.lora_a", [n_in, ra if ra else rank], T_F32, f32s([0.01] * n_in * (ra or rank))))
            ts.append((name + ".weight.lora_b", [rb if rb else rank, n_out], T_F32, f32s([0.02] * n_out * (rb or rank))))
        return gguf(kvs, ts)
    qk = [("blk.0.attn_q", 32, 32, 0, 0), ("blk.1.attn_k", 32, 16, 0, 0), ("blk.1.ffn_down", 32, 32, 0, 0)]
    add("ok-lora-gguf", adapter(qk), "adapter")
    add("r12-lora-gguf-rank-mismatch", adapter([("blk.0.attn_q", 32, 32, 2, 3)]), "lora", "blk.0.attn_q")
    add("r12-lora-gguf-shape", adapter([("blk.0.attn_k", 32, 32, 0, 0)]), "lora", "blk.0.attn_k")
    add("r12-lora-gguf-arch", adapter(qk, arch="qwen2"), "lora", "qwen2")
    add("r12-lora-gguf-hidden", adapter([("blk.0.attn_q", 64, 64, 0, 0)]), "lora", "blk.0.attn_q")
    add("r12-lora-gguf-layer", adapter([("blk.7.attn_q", 32, 32, 0, 0)]), "lora", "blk.7")
    add("r12-lora-gguf-not-adapter", adapter(qk, kind="model"), "lora", "general.type")
    add("r12-lora-gguf-truncated", adapter(qk)[:-1], "error", "past end")
    return S


# --- tokenizer seeds --------------------------------------------------------------
# Byte 0: bits 0-1 vocabulary (0 tiny-bpe, 1 tiny-spm, 2 gpt-2, 3 llama-spm; the
# shared ones fall back to the tiny ones when ../shared/data is absent), bit 2
# parse_special, bit 3 detokenize with NX_DETOK_SPECIAL, bit 4 NX_DETOK_STRIP,
# bit 5 ids mode (the rest is little-endian u16 token ids instead of text),
# bit 6: vocabulary 4 + bit 0 instead (tiny-sp-bpe, tiny-ws).

TEXTS = [
    b"Hello world", b" hello the a", b"the\n\nhello  \t  x", "héllo wörld 你好 🦙 ÿ".encode(),
    b"<|endoftext|>hello<|im_start|>user\nhi<|im_end|>", b"<s>[INST] hi [/INST]</s>", b"<tool>x<tool>",
    b"\xff\xfe invalid \xc3 utf8 \xe4\xb8", b"\x00\x01\x02 ctrl", b"12345 678.9", b"   ", b"'s 're 've",
    "\u2581\u2581 spm".encode(), b"a" * 200,
]


def tokenizer_seeds():
    S = []
    for i, t in enumerate(TEXTS):
        for v in range(4):
            flags = v | (4 if i % 2 else 0) | (8 if i % 3 == 0 else 0) | (16 if v % 2 else 0)
            S.append((f"text-{i:02d}-v{v}", bytes([flags]) + t))
    for i, t in enumerate(TEXTS):
        for v in range(2):
            flags = 64 | v | (4 if i % 2 else 0) | (8 if i % 3 == 0 else 0) | (16 if i % 4 == 1 else 0)
            S.append((f"text-{i:02d}-v{4 + v}", bytes([flags]) + t))
    for v in range(4):
        ids = [0, 1, 2, 3, 10, 200, 255, 256, 259, 260, 270, 50000, 65535]
        S.append((f"ids-v{v}", bytes([v | 32 | 8]) + b"".join(struct.pack("<H", x) for x in ids)))
    for v in range(2):
        S.append((f"ids-v{4 + v}", bytes([64 | v | 32 | 8]) + b"".join(struct.pack("<H", x) for x in range(0, 300, 7))))
        # bytes of a UTF-8 sequence split over byte tokens, then cut short
        S.append((f"ids-split-v{v}", bytes([v | 32]) + b"".join(struct.pack("<H", x) for x in
                                                               [0xE4 + 3, 0xB8 + 3, 0xAD + 3, 0xE4 + 3])))
    return S


# --- tool-call reader seeds (fuzz_tools.c) -----------------------------------------
# Byte 0: bits 0 and 7 the convention (0 Qwen, 1 Llama, 2 Mistral, 3 Mistral Nemo), bits 1-2 tool_choice
# (auto, required, named), bit 3 parallel_tool_calls false, bits 4-6 the piece size; 0xff: "schema\0value".

def tools_seeds():
    S = [
        ("qwen-call", 0x00, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
        ("qwen-text-calls", 0x30, 'Let me see.\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n'
                                  '<tool_call>{"name":"get_weather","arguments":{"city":"Rome","days":2}}</tool_call>'),
        ("qwen-bad", 0x10, '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call> <tool_cal'),
        ("qwen-named", 0x24, '{"city": "Paris"}}\n</tool_call>'),
        ("qwen-required-one", 0x0a, 'now", "arguments": {}}\n</tool_call><tool_call>{"name":"now","arguments":{}}</tool_call>'),
        ("llama-call", 0x01, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
        ("llama-text", 0x11, ' It is {sunny}'),
        ("mistral-call", 0x80, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
        ("mistral-calls", 0xb0, 'Sure. [TOOL_CALLS] [{"name": "now", "arguments": {}, "id": "abcdefghi"}, '
                                '{"name": "get_weather", "arguments": {"city": "R]o\\"me", "days": 2}}]'),
        ("mistral-bad", 0x90, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": }}] [TOOL_CALLS] {} [TOOL_CAL'),
        ("mistral-named", 0xa4, '{"city": "Paris"}}]'),
        ("mistral-one", 0x88, '[TOOL_CALLS] [{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}]'),
        ("nemo-required", 0xc3, 'now", "arguments": {}}][TOOL_CALLS][{"name":"now","arguments":{}}]'),
        ("nemo-args-form", 0x81, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
        # answers the call grammar takes (tok/tool_grammar.c), which the reader must take too
        ("qwen-required-held", 0x12, 'get_weather", "arguments": {"city": "Rome", "days": 12}}\n</tool_call>'),
        ("llama-required-held", 0x03, 'now", "parameters": {"x": [1, {"y": null}], "z": "\\u00e9"}}'),
        ("llama-named-held", 0x25, '{"city": "Paris"}}'),
        ("mistral-required-held", 0x92, 'get_weather", "arguments": {"city": "Rome"}, "id": "a1B2c3D4e"}]'),
        ("nemo-named-held", 0xc5, '{"city": "Paris"}}]'),
    ]
    out = [(n, bytes([f]) + t.encode()) for n, f, t in S]
    out.append(("schema", b"\xff" + b'{"type":"object","properties":{"a":{"anyOf":[{"type":"string","pattern":"^x"},'
                b'{"minimum":3}]}},"required":["a"]}\x00{"a":"xy"}'))
    return out


# --- protocol seeds ---------------------------------------------------------------
# One request line per file. fuzz_protocol.c parses it with the limits
# n_vocab 1000, n_ctx 64, max_tokens 128, max_line 8192 (expectations below are
# for those), then again with no limits.

def proto_seeds():
    ok = [
        {"op": "hello", "version": 1},
        {"id": 1, "op": "hello", "version": 1},
        {"id": 1, "op": "generate", "prompt": "Name three colors.", "max_tokens": 32, "temperature": 0},
        {"id": 2, "op": "generate", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi!"}]},
        {"id": 3, "op": "generate", "tokens": [1, 99, 198], "stream": False},
        {"id": 4, "op": "generate", "prompt": "<|im_start|>user\nHi<|im_end|>\n", "raw": True},
        {"id": "g", "op": "generate", "prompt": "x", "system": "sys", "top_k": 5, "top_p": 0.5, "min_p": 0.1,
         "repeat_penalty": 1.1, "repeat_last_n": 8, "seed": 42, "stop": ["\n", "END"], "ignore_eos": True,
         "logprobs": 3, "lora": [{"name": "a", "scale": 0.5}, {"name": "b"}], "version": 1},
        {"id": 5, "op": "generate", "prompt": "x", "stop": "one", "max_tokens": 2.0, "extra": None},
        {"id": "t", "op": "tokenize", "text": "Hello<|im_end|>", "special": True},
        {"id": "t2", "op": "tokenize", "text": "héllo", "add_bos": False},
        {"id": "d", "op": "detokenize", "tokens": [19, 2]},
        {"id": "d2", "op": "detokenize", "tokens": []},
        {"id": 9, "op": "status"},
        {"id": 10, "op": "cancel", "target": 1},
        {"id": 11, "op": "cancel", "target": "a\"b"},
        {"id": "\u00e9\u0001", "op": "status", "temperature": None},
        {"id": 20, "op": "shutdown"},
        {"id": 21, "op": "lora_load", "name": "sql", "path": "/srv/adapters/sql-r16.gguf", "scale": 0.5},
        {"id": 22, "op": "lora_list", "checksum": True},
        {"id": 23, "op": "lora_unload", "name": "sql"},
        {"id": 24, "op": "lora_fold", "name": "sql", "type": "f16", "dry_run": True, "prompt": "hi", "layers": [0, 1]},
        {"id": 25, "op": "lora_unfold", "name": "sql"},
        {"id": 26, "op": "lora_report", "name": "sql", "types": ["keep", "q8_0"], "layers": [1]},
        {"id": 27, "op": "lora_report", "name": "a.b_c-1", "types": "f16", "scale": 2},
        {"id": 7, "op": "generate", "prompt": "hi", "max_tokens": 2**31},  # past the limit: capped, not refused
        {"id": 30, "op": "generate", "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21"}],
         "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False},
        {"id": 31, "op": "generate", "prompt": "x", "tools": [{"function": {"name": "f"}}], "tool_choice": "required"},
    ]
    S = [(f"ok-{i:02d}", json.dumps(r, ensure_ascii=(i % 2 == 0)).encode() + b"\n", "ok", "") for i, r in enumerate(ok)]
    gen = lambda **kw: {"id": 7, "op": "generate", "prompt": "hi", **kw}
    bad = [
        # 13. size, JSON, types, ops
        ("line-too-long", b'{"id":1,"op":"tokenize","text":"' + b"a" * 9000 + b'"}', "too_large"),
        ("not-json", b"hello", "parse_error"),
        ("not-object", b"[1,2]", "parse_error"),
        ("truncated-json", b'{"id":1,"op":"gen', "parse_error"),
        ("nan", b'{"id":1,"op":"generate","prompt":"x","temperature":NaN}', "parse_error"),
        ("number-overflow", b'{"id":1,"op":"generate","prompt":"x","temperature":1e999}', "parse_error"),
        ("int-overflow", b'{"id":99999999999999999999,"op":"status"}', "parse_error"),
        ("duplicate-key", b'{"id":1,"op":"status","op":"hello"}', "parse_error"),
        ("nul-escape", b'{"id":1,"op":"tokenize","text":"a\\u0000b"}', "parse_error"),
        ("lone-surrogate", b'{"id":1,"op":"tokenize","text":"\\ud800"}', "parse_error"),
        ("invalid-utf8", b'{"id":1,"op":"tokenize","text":"\xff\xfe"}', "parse_error"),
        ("deep-nesting", b'{"id":1,"op":"status","x":' + b"[" * 2100 + b"]" * 2100 + b"}", "parse_error"),
        ("two-objects", b'{"id":1,"op":"status"} {"id":2}', "parse_error"),
        ("unknown-op", b'{"id":1,"op":"launch"}', "unknown_op"),
        ("unknown-field", b'{"id":1,"op":"generate","prompt":"x","temprature":0}', "bad_request"),
        ("op-missing", b'{"id":1}', "bad_request"),
        ("op-not-string", b'{"id":1,"op":5}', "bad_request"),
        ("id-real", b'{"id":1.5,"op":"status"}', "bad_request"),
        ("id-bool", b'{"id":true,"op":"status"}', "bad_request"),
        ("id-object", b'{"id":{},"op":"status"}', "bad_request"),
        ("id-too-long", json.dumps({"id": "x" * 300, "op": "status"}).encode(), "out_of_range"),
        ("hello-no-version", b'{"op":"hello"}', "bad_request"),
        ("version-2", b'{"id":1,"op":"status","version":2}', "unsupported_version"),
        ("generate-no-input", json.dumps({"id": 1, "op": "generate"}).encode(), "bad_request"),
        ("generate-two-inputs", json.dumps(gen(tokens=[1])).encode(), "bad_request"),
        ("prompt-not-string", json.dumps({"id": 1, "op": "generate", "prompt": 5}).encode(), "bad_request"),
        ("messages-empty", json.dumps({"id": 1, "op": "generate", "messages": []}).encode(), "out_of_range"),
        ("messages-bad-role", json.dumps({"id": 1, "op": "generate", "messages": [{"role": "god", "content": "x"}]}).encode(), "bad_request"),
        ("messages-no-content", json.dumps({"id": 1, "op": "generate", "messages": [{"role": "user"}]}).encode(), "bad_request"),
        ("raw-with-messages", json.dumps({"id": 1, "op": "generate", "messages": [{"role": "user", "content": "x"}], "raw": True}).encode(), "bad_request"),
        ("system-with-raw", json.dumps(gen(raw=True, system="s")).encode(), "bad_request"),
        ("tokenize-no-text", b'{"id":1,"op":"tokenize"}', "bad_request"),
        ("detokenize-no-tokens", b'{"id":1,"op":"detokenize"}', "bad_request"),
        ("cancel-no-target", b'{"id":1,"op":"cancel"}', "bad_request"),
        # 14. numbers
        ("prompt-tokens-over-ctx", json.dumps({"id": 1, "op": "generate", "tokens": [1] * 65}).encode(), "context_overflow"),
        ("max-tokens-0", json.dumps(gen(max_tokens=0)).encode(), "out_of_range"),
        ("max-tokens-minus1", json.dumps(gen(max_tokens=-1)).encode(), "out_of_range"),
        ("max-tokens-1.5", json.dumps(gen(max_tokens=1.5)).encode(), "bad_request"),
        ("temperature-negative", json.dumps(gen(temperature=-1)).encode(), "out_of_range"),
        ("top-p-0", json.dumps(gen(top_p=0)).encode(), "out_of_range"),
        ("top-p-negative", json.dumps(gen(top_p=-0.5)).encode(), "out_of_range"),
        ("min-p-2", json.dumps(gen(min_p=2)).encode(), "out_of_range"),
        ("repeat-penalty-0", json.dumps(gen(repeat_penalty=0)).encode(), "out_of_range"),
        ("top-k-negative", json.dumps(gen(top_k=-1)).encode(), "out_of_range"),
        ("seed-negative", json.dumps(gen(seed=-1)).encode(), "out_of_range"),
        ("logprobs-21", json.dumps(gen(logprobs=21)).encode(), "out_of_range"),
        ("token-id-negative", json.dumps({"id": 1, "op": "generate", "tokens": [-1]}).encode(), "out_of_range"),
        ("token-id-n-vocab", json.dumps({"id": 1, "op": "generate", "tokens": [1000]}).encode(), "out_of_range"),
        ("token-id-2^40", json.dumps({"id": 1, "op": "detokenize", "tokens": [2**40]}).encode(), "out_of_range"),
        ("token-id-string", json.dumps({"id": 1, "op": "detokenize", "tokens": ["1"]}).encode(), "bad_request"),
        ("stop-too-many", json.dumps(gen(stop=["a"] * 9)).encode(), "out_of_range"),
        ("stop-empty", json.dumps(gen(stop=[""])).encode(), "out_of_range"),
        ("stop-too-long", json.dumps(gen(stop=["s" * 300])).encode(), "out_of_range"),
        ("lora-too-many", json.dumps(gen(lora=[{"name": f"a{i}"} for i in range(9)])).encode(), "out_of_range"),
        ("lora-repeat", json.dumps(gen(lora=[{"name": "a"}, {"name": "a"}])).encode(), "bad_request"),
        ("lora-no-name", json.dumps(gen(lora=[{"scale": 1}])).encode(), "bad_request"),
        ("stream-not-bool", json.dumps(gen(stream="yes")).encode(), "bad_request"),
        ("lora-load-no-path", b'{"id":1,"op":"lora_load","name":"x"}', "bad_request"),
        ("lora-load-no-name", b'{"id":1,"op":"lora_load","path":"/a"}', "bad_request"),
        ("lora-name-bad-chars", b'{"id":1,"op":"lora_unload","name":"../x y"}', "bad_request"),
        ("lora-name-too-long", json.dumps({"id": 1, "op": "lora_unload", "name": "n" * 129}).encode(), "out_of_range"),
        ("lora-fold-scale-nan", b'{"id":1,"op":"lora_fold","name":"x","scale":NaN}', "parse_error"),
        ("lora-report-types-too-many", json.dumps({"id": 1, "op": "lora_report", "name": "x", "types": ["f16"] * 9}).encode(), "out_of_range"),
        ("lora-report-layers-not-ints", json.dumps({"id": 1, "op": "lora_report", "name": "x", "layers": ["0"]}).encode(), "bad_request"),
    ]
    S += [(f"bad-{n}", line + b"\n", "error", code) for n, line, code in bad]
    S.append(("ok-crlf", b'{"id":12,"op":"status"}\r\n', "ok", ""))
    S.append(("ok-no-newline", b'{"id":13,"op":"status"}', "ok", ""))
    return S


# --- safetensors seeds (docs/reliability.md 11, 12) -----------------------------------
# Expectations: ok (nx_st_parse and nx_lora_parse_peft, with the rank-2 or the
# rank-4 config of fuzz_safetensors.c, succeed), lora (nx_st_parse succeeds,
# both configs fail), error (nx_st_parse fails).

def st(header, data=b"", hlen=None):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


PEFT_MODS = [("layers.0.self_attn.q_proj", 32, 32), ("layers.1.self_attn.k_proj", 32, 16),
             ("layers.0.mlp.down_proj", 32, 32), ("layers.1.mlp.gate_proj", 32, 32)]


def lora_header(rank=2, dtype="F32", mods=PEFT_MODS[:1], rank_b=None, prefix="base_model.model.model."):
    """A PEFT header for tiny-llama.model: A (rank, n_in), B (n_out, rank) per module; returns (header, data bytes)."""
    sz = {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    h, off = {"__metadata__": {"format": "pt"}}, 0
    for mod, n_in, n_out in mods:
        for ab, shape in (("A", [rank, n_in]), ("B", [n_out, rank if rank_b is None else rank_b])):
            n = shape[0] * shape[1] * sz
            h[f"{prefix}{mod}.lora_{ab}.weight"] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
            off += n
    return h, off


def st_data(n, dtype="F32"):
    """n bytes of small finite values (0x3c00 = 1.0 in f16, 0x3c23d70a = 0.01 in f32)."""
    unit = {"F32": struct.pack("<f", 0.01), "F16": struct.pack("<e", 0.5), "BF16": b"\x80\x3f"}[dtype]
    return unit * (n // len(unit))


def safetensors_seeds():
    S = []
    r12_words = {"r12-rank-mismatch": "rank mismatch", "r12-shape-not-base": "expected [16, 2]",
                 "r12-hidden-size": "hidden size", "r12-layer-out-of-range": "layer 9 is out of range",
                 "r12-unknown-module": "x_proj"}
    for nm, kw in [("ok-lora-f32", {}), ("ok-lora-f16-r4", dict(rank=4, dtype="F16")),
                   ("ok-lora-bf16-all", dict(dtype="BF16", mods=PEFT_MODS)),
                   ("ok-lora-short-prefix", dict(mods=PEFT_MODS[1:3], prefix="model.")),
                   # 12: parse fine, but do not fit the model
                   ("r12-rank-mismatch", dict(rank_b=3)),
                   ("r12-shape-not-base", dict(mods=[("layers.0.self_attn.k_proj", 32, 32)])),
                   ("r12-hidden-size", dict(mods=[("layers.0.self_attn.q_proj", 64, 64)])),
                   ("r12-layer-out-of-range", dict(mods=[("layers.9.self_attn.q_proj", 32, 32)])),
                   ("r12-unknown-module", dict(mods=[("layers.0.self_attn.x_proj", 32, 32)]))]:
        h, n = lora_header(**kw)
        want = ("lora", r12_words[nm]) if nm.startswith("r12") else ("ok", "")
        S.append((nm, st(h, st_data(n, kw.get("dtype", "F32"))), *want))
    h, n = lora_header()
    del h["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    S.append(("r12-half-pair", st(h, st_data(n // 2)), "lora", "lora_B"))
    S.append(("r12-no-tensors", st({}), "lora", "no LoRA tensors"))
    one = lambda meta, data: st({"t": meta}, data)
    S += [
        ("r11-header-len-1e8", st(b"{}", hlen=10**8), "error", "header"),
        ("r11-header-len-2^64-1", st(b"{}", hlen=2**64 - 1), "error", "header"),
        ("r11-header-past-eof", st(b'{"a":1}', hlen=100), "error", "header"),
        ("r11-file-short", b"\x10\x00\x00", "error", ""),
        ("r11-header-not-json", st(b"not json at all"), "error", "JSON"),
        ("r11-header-not-utf8", st(b'{"\xff\xfe":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
         "error", ""),
        ("r11-header-array", st(b"[1,2,3]"), "error", ""),
        ("r11-overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), "error", ""),
        ("r11-gap", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12), "error", ""),
        ("r11-reversed", one({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, b"\0" * 4), "error", ""),
        ("r11-short-of-end", one({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, b"\0" * 8), "error", ""),
        ("r11-past-end", one({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, b"\0" * 8), "error", ""),
        ("r11-shape-mismatch", one({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, b"\0" * 8), "error", ""),
        ("r11-shape-overflow", one({"dtype": "F32", "shape": [2**62, 8], "data_offsets": [0, 8]}, b"\0" * 8),
         "error", ""),
        ("r11-shape-negative", one({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, b"\0" * 8), "error", ""),
        ("r11-unknown-dtype", one({"dtype": "F31", "shape": [2], "data_offsets": [0, 8]}, b"\0" * 8), "error",
         "F31"),
        ("r11-offsets-not-ints", one({"dtype": "F32", "shape": [2], "data_offsets": ["0", 8]}, b"\0" * 8),
         "error", ""),
        ("r11-offsets-huge", one({"dtype": "F32", "shape": [2], "data_offsets": [2**64 - 8, 2**64]}, b"\0" * 8),
         "error", ""),
        ("r11-duplicate-name", st(b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                  b'"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8), "error", ""),
    ]
    return S


# --- grammar and schema --------------------------------------------------------------


def grammar_seeds():
    """fuzz_grammar inputs: byte 0 even for GBNF text, odd for a JSON schema."""
    gbnf = [
        ("gbnf-alternatives", 'root ::= greet ( " " name )? "!"{1,3}\ngreet ::= "hi" | "hello"\nname ::= [A-Z] [a-z]*\n'),
        ("gbnf-classes", 'root ::= [^"\\\\\\n]+ . [\\x41-\\x43\\u00e9] ( "x" |\n "y" )\n'),
        ("gbnf-repeat", 'root ::= "a"{2} "b"{1,} "c"{,2} ("de")* [0-9]{3,5}\n'),
        ("gbnf-utf8", 'root ::= [α-ω]+ "日本"?\n'),
        ("gbnf-json", None),
        ("gbnf-left-recursive", 'root ::= root "a" | "b"\n'),
        ("gbnf-undefined", 'root ::= foo\n'),
    ]
    schemas = [
        ("schema-object", {"type": "object", "properties": {"a": {"type": "integer", "minimum": -15, "maximum": 123},
                                                              "b": {"type": "string", "maxLength": 4}}, "required": ["b"]}),
        ("schema-array", {"type": "array", "items": {"enum": ["x", 1, None]}, "minItems": 1, "maxItems": 3}),
        ("schema-pattern", {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}(x|y)?$"}),
        ("schema-anyof", {"anyOf": [{"type": "number", "minimum": -5, "maximum": 2}, {"type": "null"}]}),
        ("schema-refused", {"type": "object", "patternProperties": {"a": {}}}),
    ]
    out = []
    for name, text in gbnf:
        if text is None:
            text = ('root ::= value\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
                    'object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"\n'
                    'array ::= "[" ( value ( "," value )* )? "]"\nstring ::= "\\"" [a-z]* "\\""\n'
                    'number ::= "-"? [0-9]+\n')
        out.append((name, bytes([2]) + text.encode()))
    for name, sch in schemas:
        out.append((name, bytes([3]) + json.dumps(sch).encode()))
    return out


# --- writing -----------------------------------------------------------------------


def write_dir(d, items):
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for name, data, *_ in items:
        (d / name).write_bytes(data)


def main():
    corpus = FUZZ / "corpus"
    g, t, p, s = gguf_seeds(), tokenizer_seeds(), proto_seeds(), safetensors_seeds()
    write_dir(corpus / "gguf", g)
    write_dir(corpus / "tokenizer", t)
    write_dir(corpus / "protocol", p)
    write_dir(corpus / "safetensors", s)
    write_dir(corpus / "grammar", grammar_seeds())
    write_dir(corpus / "tools", tools_seeds())
    data = FUZZ / "data"
    data.mkdir(exist_ok=True)
    # Replaced by rename: a running fuzzer keeps these mapped.
    for name, blob in [("tiny-bpe.vocab", gguf([("general.architecture", STR, "llama")] + bpe_vocab()[0])),
                       ("tiny-spm.vocab", gguf([("general.architecture", STR, "llama")] + spm_vocab()[0])),
                       ("tiny-sp-bpe.vocab", gguf([("general.architecture", STR, "llama")] + sp_bpe_vocab()[0])),
                       ("tiny-ws.vocab", gguf([("general.architecture", STR, "llama")] + whitespace_vocab()[0])),
                       ("tiny-llama.model", model("llama", n_layer=2))]:
        tmp = data / (name + ".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, data / name)
    lines = ["# target\tfile\texpect\terror words (written by fuzz/make_seeds.py)"]
    lines += [f"gguf\t{n}\t{e}\t{w}" for n, _, e, w in g]
    lines += [f"protocol\t{n}\t{e}\t{w}" for n, _, e, w in p]
    lines += [f"safetensors\t{n}\t{e}\t{w}" for n, _, e, w in s]
    (FUZZ / "seeds.tsv").write_text("\n".join(lines) + "\n")
    total = sum(f.stat().st_size for f in FUZZ.rglob("*") if f.is_file() and ("corpus" in f.parts or "data" in f.parts))
    print(f"make_seeds: {len(g)} gguf, {len(t)} tokenizer, {len(p)} protocol, {len(s)} safetensors seeds; "
          f"{total} bytes with the vocabularies", file=sys.stderr)


if __name__ == "__main__":
    main()
