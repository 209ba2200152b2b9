"""Tokenizer against an independent one: HF `tokenizers` built from the GGUF's own
vocabulary and merges, with the pre-tokenizer llama.cpp's "smollm" stands for
(Digits(individual_digits) then ByteLevel, as in SmolLM2's tokenizer.json).
Also: decode(encode(s)) == s, special tokens, the streaming detokenizer against
Python's UTF-8 decoder, and the nx-tokenize tool."""

import ctypes
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NX_BUILD", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
VOCAB_DIR = ROOT.parent / "shared" / "data" / "vocab"

NX_DETOK_SPECIAL = 1
NX_DETOK_STRIP = 2


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 512)]


def _lib():
    path = BUILD / "libnx.so"
    if not path.exists():
        pytest.fail(f"{path} not built (make B={BUILD.name})")
    lib = ctypes.CDLL(str(path))
    P, S, I32P = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)
    lib.gguf_open.argtypes = [P, ctypes.c_char_p, P]
    lib.gguf_close.argtypes = [P]
    lib.nx_tok_load.argtypes = [ctypes.POINTER(P), P, P]
    lib.nx_tok_free.argtypes = [P]
    lib.nx_tok_encode.argtypes = [P, ctypes.c_char_p, S, ctypes.c_bool, I32P, S, ctypes.POINTER(S), P]
    lib.nx_tok_decode.argtypes = [P, I32P, S, ctypes.c_uint, ctypes.c_char_p, S, ctypes.POINTER(S), P]
    lib.nx_tok_find.argtypes = [P, ctypes.c_char_p, S]
    lib.nx_tok_find.restype = ctypes.c_int32
    for f in ("nx_tok_n_vocab", "nx_tok_bos", "nx_tok_eos", "nx_tok_eot"):
        getattr(lib, f).argtypes = [P]
        getattr(lib, f).restype = ctypes.c_int32
    lib.nx_tok_add_bos.argtypes = [P]
    lib.nx_tok_add_bos.restype = ctypes.c_bool
    lib.nx_tok_is_eog.argtypes = [P, ctypes.c_int32]
    lib.nx_tok_is_eog.restype = ctypes.c_bool
    lib.nx_detok_init.argtypes = [P, P, ctypes.c_uint]
    lib.nx_detok_bound.argtypes = [P]
    lib.nx_detok_bound.restype = S
    lib.nx_detok_push.argtypes = [P, ctypes.c_int32, ctypes.c_char_p, S, ctypes.POINTER(S), P]
    lib.nx_detok_flush.argtypes = [P, ctypes.c_char_p, S]
    lib.nx_detok_flush.restype = S
    return lib


class Tok:
    """The engine's tokenizer through ctypes."""

    def __init__(self, lib, path):
        self.lib = lib
        err = Err()
        mapped = ctypes.create_string_buffer(4096)  # struct gguf_mapped; its gguf_file comes first
        if lib.gguf_open(mapped, str(path).encode(), ctypes.byref(err)):
            raise RuntimeError(err.msg.decode())
        self.t = ctypes.c_void_p()
        rc = lib.nx_tok_load(ctypes.byref(self.t), mapped, ctypes.byref(err))
        lib.gguf_close(mapped)  # the tokenizer keeps its own copy
        if rc:
            raise RuntimeError(err.msg.decode())

    def close(self):
        self.lib.nx_tok_free(self.t)

    def encode(self, text, special=False):
        b = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        cap = len(b) + 8
        out = (ctypes.c_int32 * cap)()
        n = ctypes.c_size_t()
        err = Err()
        if self.lib.nx_tok_encode(self.t, b, len(b), special, out, cap, ctypes.byref(n), ctypes.byref(err)):
            raise RuntimeError(err.msg.decode())
        return list(out[: n.value])

    def decode(self, ids, flags=0):
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        n = ctypes.c_size_t()
        err = Err()
        cap = 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            rc = self.lib.nx_tok_decode(self.t, arr, len(ids), flags, buf, cap, ctypes.byref(n), ctypes.byref(err))
            if rc == 0:
                return buf.raw[: n.value]
            if n.value <= cap:
                raise RuntimeError(err.msg.decode())
            cap = n.value

    def find(self, text):
        b = text.encode()
        return self.lib.nx_tok_find(self.t, b, len(b))

    def stream(self, ids, flags=0):
        """Pushes ids one by one; returns the chunks each push (then the flush) emitted."""
        d = ctypes.create_string_buffer(64)  # struct nx_detok
        self.lib.nx_detok_init(d, self.t, flags)
        cap = self.lib.nx_detok_bound(self.t)
        buf = ctypes.create_string_buffer(cap)
        n = ctypes.c_size_t()
        err = Err()
        chunks = []
        for i in ids:
            if self.lib.nx_detok_push(d, i, buf, cap, ctypes.byref(n), ctypes.byref(err)):
                raise RuntimeError(err.msg.decode())
            chunks.append(buf.raw[: n.value])
        k = self.lib.nx_detok_flush(d, buf, cap)
        chunks.append(buf.raw[:k])
        return chunks


@pytest.fixture(scope="module")
def lib():
    return _lib()


def _model_path():
    m = os.environ.get("NXD_MODEL")
    if not m or not Path(m).exists():
        pytest.skip("NXD_MODEL not set or missing (scripts/fetch-model prints its path)")
    return m


@pytest.fixture(scope="module")
def model_tok(lib):
    t = Tok(lib, _model_path())
    yield t
    t.close()


@pytest.fixture(scope="module")
def model_vocab():
    """(tokens, token types, merges) as the GGUF holds them, read with the gguf package."""
    import gguf

    r = gguf.GGUFReader(_model_path())
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert r.fields["tokenizer.ggml.pre"].contents() == "smollm"
    return (
        r.fields["tokenizer.ggml.tokens"].contents(),
        r.fields["tokenizer.ggml.token_type"].contents(),
        r.fields["tokenizer.ggml.merges"].contents(),
    )


@pytest.fixture(scope="module")
def hf(model_vocab):
    """HF tokenizers built from the GGUF's own vocabulary and merges: (plain, with specials)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, types, merges = model_vocab
    merges = [tuple(m.split(" ", 1)) for m in merges]
    vocab = {t: i for i, t in enumerate(tokens)}

    def build(with_specials):
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tk.decoder = decoders.ByteLevel()
        if with_specials:
            tk.add_special_tokens(
                [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
            )
        return tk

    return build(False), build(True)


# --- test strings ---------------------------------------------------------------------

FIXED = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    "\r\n",
    " \n \t ",
    "Hello world",
    " Hello World!",
    "Hello, world! How are you doing today?",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "don't won't can't shouldn't y'all o'clock",
    "3333333 1234567890 3.14159 1,000,000 0x1F 1e-9 ٣٤٥ ௫ ⅷ ½",
    "    def foo(x):\n        return x * 2  # comment\n",
    'int main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    "for (int i = 0; i < n; ++i) { a[i] += b[i] << 2; }",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>",
    "SELECT * FROM users WHERE id=1 AND name LIKE '%bob%';",
    "$ ls -la | grep '^d' > out.txt 2>&1",
    "日本語のテキストです。中文文本，还有标点！",
    "한국어 텍스트입니다",
    "Привет, мир! Ёжик в тумане.",
    "Ελληνικά κείμενα και ΚΕΦΑΛΑΙΑ",
    "مرحبا بالعالم",
    "שלום עולם",
    "हिन्दी पाठ और संख्या १२३",
    "ภาษาไทยไม่มีช่องว่าง",
    "🦙🦙 llama 🚀 rocket 👨‍👩‍👧‍👦 family 🏳️‍🌈 flag ✅",
    "e\u0301 a\u0308 n\u0303 Z\u0335\u0327a\u0336l\u0337g\u0338o",  # combining marks
    "café naïve façade Ångström",
    "\u00a0nbsp\u2009thin\u3000ideographic\u200bzwsp\ufefffeff",
    "\u0085nel\u2028ls\u2029ps\u000bvt\u000cff",
    "tabs\t\t\tand    spaces     mixed \t \t end   ",
    "trailing spaces     ",
    "     leading spaces",
    "a\n\n\nb\r\n\r\nc",
    "''''''```````\"\"\"\"......!!!!!!??????",
    "------======= ~~~~~ ##### ***** ____",
    "ſ K ﬁ ＡＢＣ ｆｕｌｌｗｉｄｔｈ １２３",
    "Mixed123Numbers456and789Letters",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "https://example.com/path?query=1&x=y#frag",
    "user@example.com +1 (555) 123-4567",
    "\x00\x01\x02 control \x7f chars",
    "a" * 300,
    " " * 100 + "x",
    "\n" * 50,
    "🙂" * 20,
]

FRAGS = [
    "the", " quick", " brown", "fox", "'s", "'ll", "'VE", " 42", "1337", "٣", " ", "  ", "\t", "\n", "\r\n",
    "   ", "日本", "語", "한국", "🙂", "👍🏽", "e\u0301", "\u0308", "ß", "İ", "ǅ", "...", "!?", "()", "{}", "=>",
    "->", "//", "#", "\"", "'", "`", "$", "€", "£", "¥", "©", "™", "∑", "√", "∞", "≠", "→", "ℕ", "𝕏", "𝒜",
    "x = 1;", "if (", "return", " None", "\u00a0", "\u3000", "\u2028", "−", "–", "—", "…", "·",
]


def _strings():
    rng = random.Random(20240607)
    out = list(FIXED)
    for _ in range(220):  # fragment soup
        out.append("".join(rng.choice(FRAGS) for _ in range(rng.randint(1, 14))))
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF), (0x3000, 0x30FF),
              (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x1D400, 0x1D7FF)]
    for _ in range(120):  # random code points, some whitespace mixed in
        s = []
        for _ in range(rng.randint(1, 24)):
            if rng.random() < 0.2:
                s.append(rng.choice(" \t\n  \u00a0"))
            else:
                lo, hi = rng.choice(blocks)
                s.append(chr(rng.randint(lo, hi)))
        out.append("".join(s))
    return out


STRINGS = _strings()


def test_strings_count():
    assert len(STRINGS) >= 300


def test_matches_hf_tokenizers(model_tok, hf):
    plain, _ = hf
    bad = []
    for s in STRINGS:
        want = plain.encode(s, add_special_tokens=False).ids
        got = model_tok.encode(s, special=False)
        if got != want:
            bad.append((s, got, want))
    assert not bad, f"{len(bad)}/{len(STRINGS)} differ; first: {bad[0]!r}"


# Other pre-tokenizers on the same vocabulary: a vocab-only GGUF with another
# tokenizer.ggml.pre against HF Split pre-tokenizers using the regexes of those
# models' tokenizer.json files (llama.cpp's own list for "default" and "falcon").
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
RE_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
RE_QWEN2 = RE_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
RE_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TYPES = {
    # pre name: (split regexes in order, ignore_merges)
    "gpt-2": ([RE_GPT2], False),
    "llama-bpe": ([RE_LLAMA3], True),
    "qwen2": ([RE_QWEN2], False),
    "starcoder": ([r"\p{N}", RE_GPT2], False),
    "deepseek-coder": ([r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"], False),
    "gpt-4o": ([RE_GPT4O], False),
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", RE_GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], False),
    "falcon": ([r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, "[0-9][0-9][0-9]"], False),
}


@pytest.mark.parametrize("pre", sorted(PRE_TYPES))
def test_pre_types_match_hf(lib, model_vocab, tmp_path, pre):
    import gguf
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tokens, types, merges = model_vocab
    path = tmp_path / f"vocab-{pre}.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()

    regexes, ignore_merges = PRE_TYPES[pre]
    vocab = {t: i for i, t in enumerate(tokens)}
    ref = Tokenizer(
        models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=ignore_merges)
    )
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    t = Tok(lib, path)
    try:
        bad = []
        for s in STRINGS:
            want = ref.encode(s, add_special_tokens=False).ids
            got = t.encode(s)
            if got != want:
                bad.append((s, got, want))
            assert t.decode(got) == s.encode(), repr(s)
        assert not bad, f"{pre}: {len(bad)}/{len(STRINGS)} differ; first: {bad[0]!r}"
    finally:
        t.close()


def test_roundtrip(model_tok, hf):
    plain, _ = hf
    for s in STRINGS:
        ids = model_tok.encode(s)
        assert model_tok.decode(ids) == s.encode(), repr(s)
        assert plain.decode(ids, skip_special_tokens=False) == s  # the reference agrees


def test_invalid_utf8_input(model_tok):
    # stray and truncated sequences are kept as byte tokens, not rejected
    for b in [b"abc \xe4\xb8 def", b"\x80\xbf\x80", b"x\xed\xa0\x80y", b"\xf0\x9f\x99", b"12\xe0\x8034"]:
        ids = model_tok.encode(b)
        assert model_tok.decode(ids) == b.decode("utf-8", "replace").encode()
        assert b"".join(model_tok.stream(ids)) == b.decode("utf-8", "replace").encode()


def test_special_tokens(model_tok, hf):
    _, special = hf
    im_start, im_end = model_tok.find("<|im_start|>"), model_tok.find("<|im_end|>")
    assert (im_start, im_end) == (1, 2)
    chat = [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 123!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|><|im_end|>",
        "text<|im_end|>more<|endoftext|>",
        "a <|im_start|> b <|im_end|> c",
        "<|im_start|",  # not a whole token
        "<repo_name>x<file_sep>y<filename>z",
    ]
    for s in chat:
        got = model_tok.encode(s, special=True)
        assert got == special.encode(s, add_special_tokens=False).ids, repr(s)
        plain = model_tok.encode(s, special=False)
        assert not set(plain) & set(range(17)), repr(s)  # no control ids without parse_special
        assert model_tok.decode(plain) == s.encode()
        assert model_tok.decode(got, NX_DETOK_SPECIAL) == s.encode()
    ids = model_tok.encode(chat[0], special=True)
    assert ids[0] == im_start and ids.count(im_end) == 2
    assert model_tok.decode(ids) == b"system\nYou are helpful.\nuser\nHi 123!\nassistant\n"


def test_special_ids(model_tok, lib):
    t = model_tok.t
    assert lib.nx_tok_n_vocab(t) == 49152
    assert (lib.nx_tok_bos(t), lib.nx_tok_eos(t), lib.nx_tok_eot(t)) == (1, 2, 2)
    assert lib.nx_tok_add_bos(t) is False
    assert lib.nx_tok_is_eog(t, 2) and lib.nx_tok_is_eog(t, 0)  # <|im_end|>, <|endoftext|>
    assert not lib.nx_tok_is_eog(t, 1) and not lib.nx_tok_is_eog(t, 100)


def _byte_token_ids(tok):
    """Token id of each single byte: GPT-2's byte stand-ins, or SPM's <0xXX>."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    if tok.find("<0x00>") >= 0:
        ids = {b: tok.find(f"<0x{b:02X}>") for b in range(256)}
    else:
        ids = {b: tok.find(chr(c)) for b, c in zip(bs, cs)}
    # SmolLM2 has no token for a few bytes (C0, C1, F5..FF, some controls); keep the rest
    return {b: i for b, i in ids.items() if i >= 0}


def _check_stream(tok, rng, rounds):
    byte_id = _byte_token_ids(tok)
    pool = list("aZ ".encode()) + list("é中🙂".encode()) + [0x80, 0xBF, 0xC0, 0xC1, 0xE0, 0xED, 0xF0, 0xF4, 0xF5, 0xFF]
    pool = [b for b in pool if b in byte_id]
    assert {0x80, 0xBF, 0xE0, 0xED, 0xF0, 0xF4} <= set(pool)
    for _ in range(rounds):
        data = bytes(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        chunks = tok.stream([byte_id[b] for b in data])
        for c in chunks:
            c.decode("utf-8")  # every chunk is whole, valid UTF-8
        assert b"".join(chunks) == data.decode("utf-8", "replace").encode(), data


def test_stream_detok_bytes_model(model_tok):
    _check_stream(model_tok, random.Random(7), 1500)


def test_stream_detok_bytes_spm(lib):
    path = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"
    if not path.exists():
        pytest.skip(f"{path} absent (../shared/data not here)")
    t = Tok(lib, path)
    try:
        _check_stream(t, random.Random(8), 1500)
    finally:
        t.close()


def test_stream_detok_split_char(model_tok):
    # 🙂 forced into four byte tokens: nothing, nothing, nothing, the whole character
    byte_id = _byte_token_ids(model_tok)
    chunks = model_tok.stream([byte_id[b] for b in "x🙂".encode()])
    assert chunks == [b"x", b"", b"", b"", "🙂".encode(), b""]
    # real tokens of text: concatenated chunks give the text, each chunk valid
    s = "日本語のテキスト 🦙🙂 café"
    chunks = model_tok.stream(model_tok.encode(s))
    assert b"".join(chunks) == s.encode()
    for c in chunks:
        c.decode("utf-8")


def test_encode_speed(model_tok):
    text = "".join(STRINGS)[:8192]
    t0 = time.perf_counter()
    for _ in range(20):
        model_tok.encode(text)
    dt = (time.perf_counter() - t0) / 20
    assert dt < 0.05, f"8 KiB took {dt * 1000:.1f} ms"


def test_nx_tokenize_tool(model_tok):
    tool = BUILD / "nx-tokenize"
    if not tool.exists():
        pytest.fail(f"{tool} not built")
    m = _model_path()
    s = "Hello <|im_start|>user\n 123 日本 🙂"
    ids = subprocess.run([tool, m, "--ids"], input=s.encode(), capture_output=True, check=True).stdout
    assert [int(x) for x in ids.split()] == model_tok.encode(s)
    ids = subprocess.run([tool, m, "--ids", "--special"], input=s.encode(), capture_output=True, check=True).stdout
    assert [int(x) for x in ids.split()] == model_tok.encode(s, special=True)
    back = subprocess.run([tool, m, "--detok", "--special"], input=ids, capture_output=True, check=True).stdout
    assert back == s.encode()
    pieces = subprocess.run([tool, m], input=b"Hi\n", capture_output=True, check=True).stdout.decode()
    assert pieces.splitlines() == [f"{model_tok.find('Hi')} 'Hi'", f"{model_tok.find(chr(0x10A))} '\\n'"]
    bad = subprocess.run([tool, m, "--detok"], input=b"1 99999999", capture_output=True)
    assert bad.returncode == 1 and b"outside the vocabulary" in bad.stderr
