"""Every BPE pre-tokenizer llama.cpp's vocabulary loader names (tokenizer.ggml.pre),
against Hugging Face `tokenizers` running the split patterns of those models'
tokenizer.json files.

The vocabulary is a byte-level BPE trained here with `tokenizers` on the test
strings without any split (so its merges fire on them, across every boundary
a pre-tokenizer may draw: two ways of splitting give different tokens), written as a vocabulary-only GGUF with
gguf-py once per pre-tokenizer name. The reference tokenizer is a
tokenizers.Tokenizer with that vocabulary and merges and a Sequence of Split
pre-tokenizers (behavior "isolated") with each model's own patterns, then
ByteLevel without its regex: the same pipeline as the model's tokenizer.json.
Where llama.cpp replaces a pattern by a splitter of its own (AFMoE's digit
groups), the reference is that splitter written again in Python.

Also: decode(encode(s)) == s, nx-tokenize on the whole text, every name of a
group (llama.cpp's aliases) tokenizing alike, the refusals, and the ggml
tokenizer vectors of ../shared/data/vocab (skipped, saying so, where that
folder is absent)."""

import subprocess
import unicodedata
from pathlib import Path

import pytest

from test_tokenizer import BUILD, VOCAB_DIR, Tok, _lib, _strings

# --- the patterns, as the models' tokenizer.json files (or llama.cpp) write them -------------

CONTR = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
UP, LO = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{UP}*{LO}+{CONTR}?|[^\r\n\p{{L}}\p{{N}}]?{UP}+{LO}*{CONTR}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{UP}*{LO}+|[^\r\n\p{{L}}\p{{N}}]?{UP}+{LO}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenization_kimi.py's pat_str, with Oniguruma's class intersection
K2_UP = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
K2_LO = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
KIMI_K2 = (rf"[\p{{Han}}]+|[^\r\n\p{{L}}\p{{N}}]?{K2_UP}*{K2_LO}+{CONTR}?|[^\r\n\p{{L}}\p{{N}}]?{K2_UP}+{K2_LO}*{CONTR}?"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BLOOM = " ?[^(\\s|.,!?…。，、।۔،)]+"
CJK = "[一-龥ࠀ-一가-퟿]+"
HAN_KANA = "[一-龥぀-ゟ゠-ヿ]+"
DS3_HEAD = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
DS3 = DS3_HEAD + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# DeepSeek LLM's letters (code point ranges of its tokenizer.json class)
_DS_LETTERS = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3),
    (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
]
DS_LETTERS = "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in _DS_LETTERS)


def afmoe_digits(pretok):
    """llama.cpp's \\p{AFMoE_digits}: runs of \\p{N} cut in threes from the right, the rest kept whole."""

    def cut(_, s):
        text, out, i = str(s), [], 0
        while i < len(text):
            j = i
            isnum = unicodedata.category(text[i])[0] == "N"
            while j < len(text) and (unicodedata.category(text[j])[0] == "N") == isnum:
                j += 1
            if isnum:
                k = i + (j - i) % 3
                if k > i:
                    out.append(s[i:k])
                for g in range(k, j, 3):
                    out.append(s[g:g + 3])
            else:
                out.append(s[i:j])
            i = j
        return out

    pretok.split(cut)


class AfmoeDigits:
    def pre_tokenize(self, pretok):
        afmoe_digits(pretok)


# pre type: (tokenizer.ggml.pre names as llama.cpp maps them, split patterns, ignore_merges, add_bos)
PRE = {
    "default": (["default"], [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], False, False),
    "minicpm5": (["minicpm5"], [r"\p{N}{1,3}", LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}+")], True, False),
    "llama3": (["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                "jina-v5-nano"], [LLAMA3], True, True),
    "deepseek-llm": (["deepseek-llm"], ["[\r\n]", rf"\s?[{DS_LETTERS}]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", CJK,
                                        r"\p{N}+"], False, False),
    "deepseek-coder": (["deepseek-coder"], ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"], False, False),
    "deepseek-v3": (["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"], [r"\p{N}{1,3}", HAN_KANA, DS3], False,
                    False),
    "spark2_5": (["spark2_5"], [r"\p{N}{1,3}", HAN_KANA, DS3_HEAD + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
                                r"\p{N}"], False, False),
    "youtu": (["youtu"], ["[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + HAN_KANA,
                          GPT4O.replace(r"\p{N}{1,3}", r"\p{N}")], True, False),
    "falcon": (["falcon"], [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], False, False),
    "gpt-2": (["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
               "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo", "jais",
               "trillion", "granite-docling"], [GPT2], False, False),
    "starcoder": (["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
                  [r"\p{N}", GPT2], False, False),
    "jais-2": (["jais-2"], [LLAMA3.replace(r"|\s+(?!\S)|\s+", "") + r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)"
                            r"|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"],
               False, False),
    "qwen2": (["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "grok-2",
               "solar-open"], [QWEN2], False, False),
    "qwen35": (["qwen35"], [CONTR + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                            r"|\s*[\r\n]+|\s+(?!\S)|\s+"], False, False),
    "dbrx": (["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"], [LLAMA3], False, False),
    "bloom": (["bloom", "poro-chat", "gpt3-finnish"], [BLOOM], False, False),
    "viking": (["viking"], [BLOOM, r"\p{N}"], False, False),
    "tekken": (["tekken"], [TEKKEN], True, True),
    "exaone-moe": (["exaone-moe"], [CONTR + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                                    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"], False, False),
    "chameleon": (["chameleon"], ["<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
                                  r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2], False, True),
    "gpt-4o": (["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], [GPT4O], False, False),
    "tiny_aya": (["tiny_aya", "cohere2moe"], [r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O], False, False),
    "superbpe": (["superbpe"], [r"\p{N}+", r"(?=(\d{3})+(?!\d))"], False, False),
    "bailingmoe": (["bailingmoe", "bailingmoe2", "llada-moe"],
                   [r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
                    r"|\s+(?!\S)|\s+"], False, False),
    "seed-coder": (["seed-coder"], [CONTR + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                                    r"|\s+(?!\S)|\s+"], False, False),
    "kimi-k2": (["kimi-k2"], [KIMI_K2], False, False),
    "ufakzeka": (["ufakzeka"], [QWEN2.removeprefix(CONTR + "|")], False, False),
    "afmoe": (["afmoe"], [AfmoeDigits, "[一-鿿㐀-䶿\uf900-\ufaff぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+", DS3],
              False, False),
    "laguna": (["laguna"], ["[^\\n]+|[\\n]+", QWEN2], False, False),
}

EXTRA = [
    "1234567 12345678 123456789 1 12 123 1234 ١٢٣٤٥٦٧ ½⅓ 3.14159265 1,000,000 abc123def4567 x12345y",
    "İstanbul'da Türkiye'nin don't I'M YOU'RE we'Ll it'S",
    "漢字かなカナ混じり文、そして한국어ㄱㄴㄷ와 ㄅㄆㄇ注音！…“引用”‘单’—：；，、〜",
    "ภาษาไทย ຄຳລາວ ភាសាខ្មែរ မြန်မာစာ ꩠꩡ ꧠꧡ ･ｶﾀｶﾅ ⼀⼁ 豈更",
    "<sentinel:12> IMGIMGABCZ IMGIMGABCDEZ text\tand\n    four  two spaces",
    " " * 600 + "x" + " " * 37 + "\n" + "\t" * 9,
    "e\u0301e\u0301 n\u0303 q\u0307\u0323 ज़िंदगी नमस्ते বাংলা తెలుగు",
    "ÀÉÎÕÜ àéîõü ΑΒΓ αβγ ǅungla ǈ ǋ ᾼ ῌ ῼ Ω K Å µ ﬁ ﬀ ＡＢＣａｂｃ 𐐀𐐨 𞤀𞤢",
    "CamelCaseWORDSAnd_snake XMLHttpRequest iPhone McDonald's HTML5Parser",
    "a/b/c path/to/file.txt //comment\n/* c */ <a href='/x'>",
    "end with spaces   ",
    "\r\n\r\n  \r\n",
]
# Characters Unicode had not assigned by the version this Python knows (14.0, as
# PCRE2 10.42) are left out: Oniguruma knows a later Unicode, and the engines
# would disagree on their classes, not on the patterns.
STRINGS = [s for s in _strings() + EXTRA if not any(unicodedata.category(c) == "Cn" for c in s)]


def _names():
    return [n for names, *_ in PRE.values() for n in names]


def test_every_row_of_the_table_is_tested():
    # the names here are exactly those nxd knows: each is accepted below; a name
    # of llama.cpp's nxd lacks would fail test_all_names_load
    assert len(STRINGS) >= 300
    assert len(set(_names())) == len(_names())


@pytest.fixture(scope="module")
def lib():
    return _lib()


@pytest.fixture(scope="module")
def bpe_vocab():
    """(tokens, merges) of a byte-level BPE trained on the test strings."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # merges across any split
    trainer = trainers.BpeTrainer(vocab_size=4000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(STRINGS * 2 + [s.lower() for s in STRINGS], trainer=trainer)
    import json
    model = json.loads(tk.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    assert len(tokens) > 1000 and len(merges) > 700
    return tokens, merges


def write_vocab(path, pre, tokens, merges):
    import gguf

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def hf_tokenizer(tokens, merges, patterns, ignore_merges):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                              ignore_merges=ignore_merges))
    steps = [pre_tokenizers.PreTokenizer.custom(p()) if isinstance(p, type) else
             pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns]
    tk.pre_tokenizer = pre_tokenizers.Sequence(steps + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                   use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk


@pytest.mark.parametrize("pre", sorted(PRE))
def test_matches_hf_tokenizers(lib, bpe_vocab, tmp_path, pre):
    names, patterns, ignore_merges, add_bos = PRE[pre]
    tokens, merges = bpe_vocab
    ref = hf_tokenizer(tokens, merges, patterns, ignore_merges)
    path = write_vocab(tmp_path / f"{pre}.gguf", names[0], tokens, merges)
    t = Tok(lib, path)
    try:
        assert lib.nx_tok_add_bos(t.t) is False  # no BOS token in this vocabulary: the default cannot apply
        bad = []
        for s in STRINGS:
            want = ref.encode(s, add_special_tokens=False).ids
            got = t.encode(s)
            if got != want:
                bad.append((s, [tokens[i] for i in got], [tokens[i] for i in want]))
            assert t.decode(got) == s.encode(), f"{pre}: round trip of {s!r}"
        assert not bad, f"{pre}: {len(bad)}/{len(STRINGS)} differ; first: {bad[0]!r}"
    finally:
        t.close()

    # nx-tokenize on all the strings as one text
    text = "\n".join(STRINGS)
    out = subprocess.run([BUILD / "nx-tokenize", path, "--ids"], input=text.encode(), capture_output=True,
                         check=True).stdout
    assert [int(x) for x in out.split()] == ref.encode(text, add_special_tokens=False).ids


def test_aliases_tokenize_alike(lib, bpe_vocab, tmp_path):
    """Every name llama.cpp maps to a pre-tokenizer type loads and tokenizes as its type does."""
    tokens, merges = bpe_vocab
    sample = STRINGS[:60] + EXTRA
    for pre, (names, _, _, _) in PRE.items():
        want = None
        for name in names:
            t = Tok(lib, write_vocab(tmp_path / "v.gguf", name, tokens, merges))
            try:
                got = [t.encode(s) for s in sample]
            finally:
                t.close()
            want = want or got
            assert got == want, f"{name} does not tokenize as {names[0]}"


def test_add_bos_defaults(lib, tmp_path):
    """llama3, tekken and chameleon add BOS unless the file says otherwise (llama.cpp's loader)."""
    import gguf

    tokens = ["<s>"] + [chr(c) for c in range(0x21, 0x7F)]
    for pre, (names, _, _, add_bos) in PRE.items():
        for flag in (None, not add_bos):
            path = tmp_path / "b.gguf"
            w = gguf.GGUFWriter(str(path), arch="llama")
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre(names[0])
            w.add_token_list(tokens)
            w.add_token_merges(["! \""])
            w.add_bos_token_id(0)
            if flag is not None:
                w.add_add_bos_token(flag)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.close()
            t = Tok(lib, path)
            try:
                assert lib.nx_tok_add_bos(t.t) is (add_bos if flag is None else flag), (pre, flag)
            finally:
                t.close()


def test_ignore_merges(lib, tmp_path):
    """llama3's ignore_merges: a piece that is a token is taken whole, even where the merges would not make it."""
    import gguf

    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    merges = ["b c", "a bc"]  # abc -> a bc -> abc; "ab" is a token no merge reaches
    path = tmp_path / "m.gguf"
    for pre, whole in [("llama-bpe", True), ("qwen2", False), ("tekken", True), ("youtu", True),
                       ("minicpm5", True), ("gpt-2", False)]:
        w = gguf.GGUFWriter(str(path), arch="llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens + ["abab"])
        w.add_token_merges(merges)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        t = Tok(lib, path)
        try:
            assert t.encode("abc") == [5]
            assert t.encode("abab") == ([6] if whole else [0, 1, 0, 1]), pre
        finally:
            t.close()


@pytest.mark.parametrize("pre,msg", [
    ("granite-embed-multi-97m", "tokenizer.ggml.pre 'granite-embed-multi-97m' is not implemented"),
    ("no-such-pre", "unknown pre-tokenizer tokenizer.ggml.pre 'no-such-pre'"),
])
def test_refused_by_name(lib, tmp_path, pre, msg):
    path = write_vocab(tmp_path / "r.gguf", pre, ["a", "b", "ab"], ["a b"])
    with pytest.raises(RuntimeError, match=msg.replace(".", r"\.")):
        Tok(lib, path)


# --- the ggml vocabularies of ../shared/data/vocab -------------------------------------------

VOCABS = ["ggml-vocab-gpt-2", "ggml-vocab-llama-bpe", "ggml-vocab-llama-spm", "ggml-vocab-qwen2"]


@pytest.mark.parametrize("name", VOCABS)
def test_ggml_vocab_vectors(lib, name):
    path = VOCAB_DIR / f"{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} absent (../shared/data/vocab is not here)")
    inp = Path(f"{path}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    out = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    assert len(inp) >= 40
    t = Tok(lib, path)
    try:
        for i, s in enumerate(inp):
            want = [int(x) for x in out[i].split()]
            assert t.encode(s) == want, f"{name} pair {i}: {s!r}"
    finally:
        t.close()


# --- a real vocabulary: Qwen2's 151936 tokens and merges, under the pre-tokenizers of today's models

REAL_VOCAB_PRES = ["llama3", "qwen35", "tekken", "gpt-4o", "deepseek-v3", "kimi-k2"]


@pytest.fixture(scope="module")
def qwen2_vocab():
    path = VOCAB_DIR / "ggml-vocab-qwen2.gguf"
    if not path.exists():
        pytest.skip(f"{path} absent (../shared/data/vocab is not here)")
    import gguf

    r = gguf.GGUFReader(str(path))
    return r.fields["tokenizer.ggml.tokens"].contents(), r.fields["tokenizer.ggml.merges"].contents()


@pytest.mark.parametrize("pre", REAL_VOCAB_PRES)
def test_real_vocabulary_matches_hf_tokenizers(lib, qwen2_vocab, tmp_path, pre):
    names, patterns, ignore_merges, _ = PRE[pre]
    tokens, merges = qwen2_vocab
    ref = hf_tokenizer(tokens, merges, patterns, ignore_merges)
    t = Tok(lib, write_vocab(tmp_path / "q.gguf", names[0], tokens, merges))
    try:
        bad = [s for s in STRINGS if t.encode(s) != ref.encode(s, add_special_tokens=False).ids]
        assert not bad, f"{pre}: {len(bad)}/{len(STRINGS)} differ; first: {bad[0]!r}"
    finally:
        t.close()
