"""test_tokenizer_gemma4.py - the SentencePiece-style BPE vocabularies of llama.cpp's loader
(src/llama-vocab.cpp), against Hugging Face `tokenizers`:

- Gemma 4 (`tokenizer.ggml.model` = gemma4, which llama.cpp reads as `tokenizer.ggml.pre` = gemma4
  whatever the file says), `granite-embed-multi-311m` (the same type) and `sarvam-moe`: BPE merges
  over the raw UTF-8 characters of the text with every ' ' written U+2581 (escape_whitespaces), cut
  only between newline runs and the rest ("[^\\n]+|[\\n]+"), `<0xXX>` byte fallback (byte_encode =
  false); gemma4 also takes a newline run that is a token whole and always adds BOS.
- `whitespace` (`tokenizer.ggml.model` = whitespace, jina-embeddings-v2-base-zh): whitespace ends a
  piece and is dropped, the pieces merged over their raw UTF-8 characters.

The reference for the first is a tokenizers.Tokenizer laid out as a SentencePiece BPE converted to
tokenizer.json is (transformers' GemmaConverter): normalizer Replace(" ", "▁"), no pre-tokenizer,
BPE with byte_fallback, decoder Replace("▁", " ") + ByteFallback + Fuse. Its vocabulary is trained
here with that normalizer on the test strings, split at newline runs only (so no merge crosses the
cut llama.cpp draws), on half the strings so that the other half has characters only the byte
fallback covers. The GGUF is written with the keys llama.cpp's converter writes (Gemma4Model.set_vocab:
tokenizer.ggml.model gemma4, tokens, scores, types, merges, special ids, add_space_prefix false,
add_bos_token true; _set_vocab_whitespace: model and pre whitespace).

The whitespace reference is jina-embeddings-v2-base-zh's pipeline without its Lowercase normalizer
(nxd refuses tokenizer.ggml.normalizer.lowercase = true on these vocabularies): the Whitespace
pre-tokenizer and a raw-character BPE, with byte fallback tokens added to show that path.
"""
import re
import subprocess

import gguf
import pytest

from test_pretokenizers import STRINGS
from test_tokenizer import BUILD, Tok, _lib

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
USER = ["<|turn>", "<turn|>"]  # Gemma 4's turn markers: user-defined, matched wherever they appear
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# Unicode White_Space, which both llama.cpp's whitespace session and HF's Whitespace drop
WHITE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
        "\u2028\u2029\u202f\u205f\u3000"

EXTRA = [
    "<|turn>user\nhello there<turn|>\n<|turn>model\n", "a<|turn>b", "\n", "\n\n", "\n\n\n", "\n" * 7,
    "x\n\n\ny", "  \n  \n", " leading", "trailing ", "   ", "two  spaces   three", "tab\tand\x0bvt",
    "🙂🙃🫠 emoji 👩‍👩‍👧", "漢字と かな 한국어", "₁₂₃ ½ 1234567890", "\u2581already escaped\u2581",
]
CORPUS = STRINGS + EXTRA


@pytest.fixture(scope="module")
def lib():
    return _lib()


def _train(normalizer, pre_tokenizer, texts, extra_vocab):
    """(tokens, merges): extra_vocab first (their ids fixed), then a BPE trained on texts."""
    import json

    from tokenizers import Tokenizer, models, trainers

    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizer
    tk.pre_tokenizer = pre_tokenizer
    tk.train_from_iterator(texts * 2, trainer=trainers.BpeTrainer(vocab_size=3000, min_frequency=2,
                                                                  show_progress=False))
    model = json.loads(tk.to_str())["model"]
    trained = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if t not in extra_vocab]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return list(extra_vocab) + trained, merges


@pytest.fixture(scope="module")
def spm_bpe_vocab():
    from tokenizers import Regex, normalizers, pre_tokenizers

    tokens, merges = _train(normalizers.Replace(" ", "\u2581"),
                            pre_tokenizers.Split(Regex("[^\n]+|[\n]+"), behavior="isolated"),
                            CORPUS[::2], SPECIALS + USER + BYTES)
    assert len(tokens) > 1500 and len(merges) > 800
    unseen = [s for s in CORPUS if any(c not in tokens for c in s.replace(" ", "\u2581"))]
    assert len(unseen) > 30  # characters left to the byte fallback
    return tokens, merges


def spm_bpe_reference(tokens, merges):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], unk_token="<unk>",
                              byte_fallback=True, fuse_unk=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER])
    return tk


def write_spm_bpe(path, tokens, merges, model="gemma4", pre=None, add_bos=True, bos=True, space_prefix=False):
    """As convert_hf_to_gguf.py's Gemma4Model.set_vocab writes it (LlamaHfVocab types <0xXX> BYTE); with
    model gpt2, as _set_vocab_gpt2 does (get_vocab_base types every token not added NORMAL)."""
    byte = gguf.TokenType.BYTE if model == "gemma4" else gguf.TokenType.NORMAL
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.USER_DEFINED if t in USER else
             byte if t in BYTES else gguf.TokenType.NORMAL for t in tokens]
    w = gguf.GGUFWriter(str(path), arch="gemma4")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos:
        w.add_bos_token_id(tokens.index("<bos>"))
    w.add_eos_token_id(tokens.index("<eos>"))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_pad_token_id(tokens.index("<pad>"))
    w.add_add_space_prefix(space_prefix)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


# (tokenizer.ggml.model, tokenizer.ggml.pre) of each way a file names these vocabularies
SPM_BPE_FILES = [("gemma4", None), ("gemma4", "default"), ("gpt2", "gemma4"), ("gpt2", "granite-embed-multi-311m"),
                 ("gpt2", "sarvam-moe")]


@pytest.mark.parametrize("model,pre", SPM_BPE_FILES)
def test_spm_bpe_matches_hf_tokenizers(lib, spm_bpe_vocab, tmp_path, model, pre):
    tokens, merges = spm_bpe_vocab
    ref = spm_bpe_reference(tokens, merges)
    path = write_spm_bpe(tmp_path / "g.gguf", tokens, merges, model, pre)
    t = Tok(lib, path)
    try:
        bad = []
        for s in CORPUS:
            want = ref.encode(s, add_special_tokens=False).ids
            got = t.encode(s, special=True)
            if got != want:
                bad.append((s, [tokens[i] for i in got], [tokens[i] for i in want]))
            # a U+2581 typed in the text comes back a space, as it does from HF's decoder
            assert t.decode(got) == s.replace("\u2581", " ").encode(), f"round trip of {s!r}"
            assert t.decode(got) == ref.decode(want, skip_special_tokens=False).encode(), s
        assert not bad, f"{model}/{pre}: {len(bad)}/{len(CORPUS)} differ; first: {bad[0]!r}"
    finally:
        t.close()

    text = "\n".join(CORPUS)
    out = subprocess.run([BUILD / "nx-tokenize", path, "--ids"], input=text.encode(), capture_output=True,
                         check=True).stdout
    ids = [int(x) for x in out.split()]
    want = ref.encode(text, add_special_tokens=False).ids
    assert ids in (want, [tokens.index("<bos>")] + want)


def test_one_long_line(lib, spm_bpe_vocab, tmp_path):
    """Without a newline the whole text is one piece for the merges: half a megabyte of it, as HF has it."""
    import random

    tokens, merges = spm_bpe_vocab
    rng = random.Random(3)
    text = " ".join(rng.choice(CORPUS).replace("\n", " ") for _ in range(20000))
    assert len(text.encode()) > 400_000
    t = Tok(lib, write_spm_bpe(tmp_path / "g.gguf", tokens, merges))
    try:
        assert t.encode(text) == spm_bpe_reference(tokens, merges).encode(text, add_special_tokens=False).ids
    finally:
        t.close()


def test_byte_fallback_and_spaces(lib, spm_bpe_vocab, tmp_path):
    """A character without a token is its UTF-8 bytes as <0xXX>; spaces are U+2581 pieces, not bytes."""
    tokens, merges = spm_bpe_vocab
    t = Tok(lib, write_spm_bpe(tmp_path / "g.gguf", tokens, merges))
    try:
        ch = next(c for s in CORPUS for c in s if c not in tokens and ord(c) > 0x7FF)
        ids = t.encode(ch)
        assert [tokens[i] for i in ids] == [f"<0x{b:02X}>" for b in ch.encode()]
        assert t.decode(ids) == ch.encode()
        ids = t.encode("a  b")
        assert "\u2581" in "".join(tokens[i] for i in ids) and not any(tokens[i] == "<0x20>" for i in ids)
    finally:
        t.close()


def test_invalid_utf8_round_trips(lib, spm_bpe_vocab, tmp_path):
    """Bytes that are not UTF-8 (stray continuations, overlongs, surrogates, cut sequences) are their own
    <0xXX> tokens and come back as they were; the valid characters around them still merge."""
    import random

    tokens, merges = spm_bpe_vocab
    t = Tok(lib, write_spm_bpe(tmp_path / "g.gguf", tokens, merges))
    rng = random.Random(5)
    pieces = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe4\xb8",
              b"\xf0\x9f\x99", b"\xff", b" ", b"\n", "日本".encode(), "hello".encode(), "🙂".encode()]
    try:
        for _ in range(300):
            b = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
            ids = t.encode(b)
            raw = b"".join(tokens[i].replace("\u2581", " ").encode() if not tokens[i].startswith("<0x") else
                           bytes([int(tokens[i][3:5], 16)]) for i in ids)
            assert raw == b, b
            # the detokenizer puts U+FFFD where the bytes are not UTF-8, as Python's errors="replace"
            assert t.decode(ids) == b.decode("utf-8", "replace").encode(), b
        hello = t.encode(b"\x80hello")
        assert hello[0] == tokens.index("<0x80>") and len(hello) < 6
    finally:
        t.close()


def test_newline_runs(lib, tmp_path):
    """gemma4 takes a run of newlines that is a token whole (llama.cpp's fix for Gemma 4, #21343);
    sarvam-moe merges it as any piece. Neither merges across the cut before and after a newline run."""
    tokens = SPECIALS + BYTES + ["\n", "\n\n", "\n\n\n", "a", "\u2581", "a\n"]
    merges = ["\n \n", "a \n"]  # "\n\n\n" is a token no merge makes; "a\n" one the split never lets form
    for pre, three in [("gemma4", ["\n\n\n"]), ("sarvam-moe", ["\n\n", "\n"])]:
        t = Tok(lib, write_spm_bpe(tmp_path / "n.gguf", tokens, merges, "gpt2", pre))
        try:
            assert [tokens[i] for i in t.encode("\n\n\n")] == three, pre
            assert [tokens[i] for i in t.encode("a\n")] == ["a", "\n"], pre
            assert [tokens[i] for i in t.encode("a \n")] == ["a", "\u2581", "\n"], pre
        finally:
            t.close()


def test_bos(lib, spm_bpe_vocab, tmp_path):
    """Gemma 4 adds BOS even where the file says add_bos_token = false (llama.cpp's workaround, #21500);
    sarvam-moe follows the file and defaults to none."""
    tokens, merges = spm_bpe_vocab
    for (model, pre), add_bos, want in [(("gemma4", None), False, True), (("gemma4", None), None, True),
                                        (("gpt2", "granite-embed-multi-311m"), False, True),
                                        (("gpt2", "sarvam-moe"), False, False), (("gpt2", "sarvam-moe"), None, False),
                                        (("gpt2", "sarvam-moe"), True, True)]:
        t = Tok(lib, write_spm_bpe(tmp_path / "b.gguf", tokens, merges, model, pre, add_bos))
        try:
            assert lib.nx_tok_add_bos(t.t) is want, (model, pre, add_bos)
            assert lib.nx_tok_bos(t.t) == tokens.index("<bos>")
        finally:
            t.close()
    path = write_spm_bpe(tmp_path / "nob.gguf", tokens, merges, add_bos=None, bos=False)
    with pytest.raises(RuntimeError, match="tokenizer.ggml.pre 'gemma4' always adds BOS but there is no "
                                           "tokenizer.ggml.bos_token_id"):
        Tok(lib, path)


def test_space_prefix_refused(lib, spm_bpe_vocab, tmp_path):
    """A dummy prefix (tokenizer.json's Prepend("▁")) is not what llama.cpp's BPE does: refused, named."""
    tokens, merges = spm_bpe_vocab
    for model, pre, name in [("gemma4", None, "gemma4"), ("gpt2", "sarvam-moe", "sarvam-moe")]:
        path = write_spm_bpe(tmp_path / "p.gguf", tokens, merges, model, pre, space_prefix=True)
        with pytest.raises(RuntimeError, match=re.escape(f"tokenizer.ggml.add_space_prefix = true with "
                                                         f"tokenizer.ggml.pre '{name}' is not implemented")):
            Tok(lib, path)


def test_gemma4_end_tokens(lib, tmp_path):
    """<eos>, <turn|> and <|tool_response> end generation, as llama.cpp's list has them for Gemma 4."""
    tokens = SPECIALS + BYTES + ["<turn|>", "<|tool_response>", "a"]
    t = Tok(lib, write_spm_bpe(tmp_path / "e.gguf", tokens, ["a a"]))
    try:
        for name in ("<eos>", "<turn|>", "<|tool_response>"):
            assert lib.nx_tok_is_eog(t.t, tokens.index(name)), name
        assert not lib.nx_tok_is_eog(t.t, tokens.index("a"))
    finally:
        t.close()


# --- whitespace ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def whitespace_vocab():
    from tokenizers import pre_tokenizers

    tokens, merges = _train(None, pre_tokenizers.Whitespace(), CORPUS[::2], ["<s>", "<pad>", "</s>", "<unk>"] + BYTES)
    assert len(tokens) > 1000 and len(merges) > 500
    return tokens, merges


def write_whitespace(path, tokens, merges, lowercase=None, pre="whitespace"):
    """As convert_hf_to_gguf.py's _set_vocab_whitespace writes it."""
    w = gguf.GGUFWriter(str(path), arch="jina-bert-v2")
    w.add_tokenizer_model("whitespace")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in ("<s>", "<pad>", "</s>", "<unk>") else
                       gguf.TokenType.BYTE if t in BYTES else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    if lowercase is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_whitespace_matches_hf_tokenizers(lib, whitespace_vocab, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokens, merges = whitespace_vocab
    ref = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in merges], byte_fallback=True))
    ref.pre_tokenizer = pre_tokenizers.Whitespace()
    for lowercase in (None, False):
        path = write_whitespace(tmp_path / "w.gguf", tokens, merges, lowercase)
        t = Tok(lib, path)
        try:
            bad = []
            for s in CORPUS:
                want = ref.encode(s, add_special_tokens=False).ids
                got = t.encode(s)
                if got != want:
                    bad.append((s, [tokens[i] for i in got], [tokens[i] for i in want]))
                # the whitespace is gone, the rest comes back
                assert t.decode(got) == re.sub(f"[{WHITE}]", "", s).encode(), s
            assert not bad, f"{len(bad)}/{len(CORPUS)} differ; first: {bad[0]!r}"
            # an overlong ' ' or NEL is no whitespace but bytes that are not UTF-8
            for junk in (b"\xe0\x80\xa0", b"\xc0\xa0", b"\x85"):
                assert [tokens[i] for i in t.encode(b"a" + junk + b"b")][1:-1] == [f"<0x{c:02X}>" for c in junk]
        finally:
            t.close()


def test_whitespace_drops_what_has_no_token(lib, tmp_path):
    """Without byte tokens a character no token has is dropped, as llama.cpp's BPE session does."""
    tokens = ["<s>", "</s>", "a", "b", "ab", "中", "\u2581"]
    t = Tok(lib, write_whitespace(tmp_path / "d.gguf", tokens, ["a b"]))
    try:
        assert [tokens[i] for i in t.encode("ab\u3000中 x\u00a0b\u0085a")] == ["ab", "中", "b", "a"]
        # a piece is its text: U+2581 is no space here
        assert t.decode(t.encode("a \u2581b")) == "a\u2581b".encode()
    finally:
        t.close()


@pytest.mark.parametrize("kv,msg", [
    ({"lowercase": True}, "tokenizer.ggml.normalizer.lowercase = true (lowercasing a whitespace vocabulary's text) "
                          "is not implemented"),
    ({"pre": "gpt-2"}, "tokenizer.ggml.model 'whitespace' with tokenizer.ggml.pre 'gpt-2' (only 'whitespace') is "
                       "not implemented"),
])
def test_whitespace_refusals(lib, tmp_path, kv, msg):
    path = write_whitespace(tmp_path / "r.gguf", ["<s>", "</s>", "a"], [], **kv)
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        Tok(lib, path)


def test_granite_97m_refused_by_name(lib, tmp_path):
    import test_pretokenizers

    path = test_pretokenizers.write_vocab(tmp_path / "g.gguf", "granite-embed-multi-97m", ["a", "b", "ab"], ["a b"])
    with pytest.raises(RuntimeError, match="tokenizer.ggml.pre 'granite-embed-multi-97m' is not implemented"):
        Tok(lib, path)
