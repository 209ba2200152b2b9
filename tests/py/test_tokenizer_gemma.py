"""test_tokenizer_gemma.py - Gemma's SentencePiece vocabulary (tokenizer.ggml.model = llama, no space prefix) against SentencePiece itself.

There are no Gemma vectors in ../shared/data/vocab/ and no Gemma tokenizer can be fetched here, so the
test trains a small SentencePiece BPE model with the normalizer options Gemma's tokenizer.model has
(no dummy prefix, no whitespace folding, the identity normalization, byte fallback, digits split,
whitespace-only pieces, user-defined symbols), converts it as llama.cpp's converter does
(convert_hf_to_gguf.py: _set_vocab_sentencepiece, then Gemma's add_space_prefix = false; the turn
markers CONTROL, as Gemma's tokenizer_config.json has them special) and compares nxd's ids with
sentencepiece's own encoding on a few hundred varied strings.
"""
import io
import random

import gguf
import pytest

from test_tokenizer import Tok, _lib

spm = pytest.importorskip("sentencepiece")

WORDS = ["hello", "world", "the", "gemma", "model", "token", "piece", "running", "ünïcode", "日本語", "emoji🙂",
         "<tag>", "x=1+2", "  spaced", "tab\tbed", "new\nline", "Zürich", "naïve", "1999", "co-op"]
TURNS = ["<start_of_turn>", "<end_of_turn>"]  # Gemma's control tokens
USER = ["<tag>"]  # a user-defined symbol: matched wherever it appears, as SentencePiece does


def _train():
    rng = random.Random(1)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(3000)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=buf, vocab_size=440, model_type="bpe", add_dummy_prefix=False,
        remove_extra_whitespaces=False, normalization_rule_name="identity", byte_fallback=True, split_digits=True,
        allow_whitespace_only_pieces=True, user_defined_symbols=TURNS + USER, pad_id=0, eos_id=1, bos_id=2,
        unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        character_coverage=1.0, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


@pytest.fixture(scope="module")
def gemma_vocab(tmp_path_factory):
    sp = _train()
    path = tmp_path_factory.mktemp("gemma_vocab") / "gemma-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        tt = gguf.TokenType.NORMAL
        if sp.is_unknown(i):
            tt = gguf.TokenType.UNKNOWN
        elif sp.is_control(i) or piece in TURNS:
            tt = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            tt = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            tt = gguf.TokenType.BYTE
        elif piece in USER:
            tt = gguf.TokenType.USER_DEFINED
        tokens.append(piece.encode())
        scores.append(sp.get_score(i))
        types.append(tt)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = Tok(_lib(), path)
    yield sp, tok
    tok.close()


def _strings():
    rng = random.Random(7)
    alphabet = "abcxyz ZÄöü日本🙂\n\t 0123456789<>-=+.,!?"
    out = ["", " ", "  ", "hello", " hello", "hello world", "hello  world", "\n\nhello", "12345", "x=1+2 ",
           "<tag>hello<tag>", "a<tag>b", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
           "trailing space ", "日本語テキスト", "🙂🙂 🙂", "tab\t\tx", "ünïcode naïve Zürich"]
    for _ in range(300):
        kind = rng.random()
        if kind < 0.5:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))))
        elif kind < 0.8:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))))
        else:
            out.append(rng.choice(TURNS) + " ".join(rng.choice(WORDS) for _ in range(3)) + rng.choice(TURNS))
    return out


def test_no_space_prefix_and_bos(gemma_vocab):
    sp, tok = gemma_vocab
    assert tok.encode("hello world") == sp.encode("hello world")
    assert sp.id_to_piece(tok.encode("hello")[0]) == "hello"  # no "▁hello": add_space_prefix false
    assert tok.lib.nx_tok_add_bos(tok.t) and tok.lib.nx_tok_bos(tok.t) == 2


def test_matches_sentencepiece(gemma_vocab, report):
    """With special tokens parsed (the chat path): SentencePiece matches its user-defined symbols, the
    turn markers among them, wherever they appear."""
    sp, tok = gemma_vocab
    strings = _strings()
    bad = [(s, tok.encode(s, special=True), sp.encode(s)) for s in strings if tok.encode(s, special=True) != sp.encode(s)]
    report(f"gemma SentencePiece vocabulary: {len(strings) - len(bad)}/{len(strings)} strings as sentencepiece encodes them")
    assert not bad, bad[:5]


def test_plain_text_keeps_turn_markers_as_text(gemma_vocab):
    """Without special parsing a control token's text is text (as llama.cpp's parse_special = false), while
    a user-defined one is still matched."""
    sp, tok = gemma_vocab
    ids = tok.encode("<start_of_turn>x<tag>", special=False)
    assert sp.piece_to_id("<start_of_turn>") not in ids
    assert sp.piece_to_id("<tag>") in ids


def test_roundtrip(gemma_vocab):
    sp, tok = gemma_vocab
    for s in _strings():
        if not any(t in s for t in TURNS):
            assert tok.decode(tok.encode(s)).decode() == s, s
