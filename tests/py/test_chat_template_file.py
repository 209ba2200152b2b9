"""nxd --chat-template FILE: a Jinja template read from a file in place of the
model's, told apart as the model's would be; one nxd cannot render, or a path
that is neither a name nor a file, stops nxd at start saying why.

Tiny models (tests/fixtures/make_tiny.py) with a byte-level vocabulary, served by
the real daemon; the templates are the real ones of tests/fixtures/chat_templates."""
from pathlib import Path

import make_tiny
from nxd_helpers import Client, Daemon

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
UNKNOWN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def tiny(tmp_path, **kw):
    return make_tiny.build(tmp_path / "m.gguf", wtype="Q8_0", vocab=True, chat_template=UNKNOWN_TEMPLATE, **kw)


def prompt_tokens(d, messages):
    with Client(d.sock) as c:
        _, _, ev = c.generate(rid="g", messages=messages, max_tokens=1, temperature=0)
        assert ev["event"] == "done", ev
        return ev["usage"]["prompt_tokens"]


def tokens_of(d, text):
    """The prompt's tokens as generate makes them: special tokens parsed, BOS as the model asks."""
    with Client(d.sock) as c:
        ev = c.request({"id": "t", "op": "tokenize", "text": text, "special": True})
        assert ev["event"] == "tokens", ev
        return len(ev["tokens"])


def test_template_file_replaces_the_models(tmp_path):
    model = tiny(tmp_path)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    with Daemon(model, tmp_path, workers=1, args=["--slots", "1", "--ctx", "256", "--chat-template",
                                                   str(TEMPLATES / "mistral-v3.jinja")]) as d:
        assert "chat template mistral-v3 (--chat-template FILE)" in d.log()
        assert "is not one nxd can render" not in d.log()
        # the file's rendering (Mistral v3 puts the system message in the last user turn), not the model's
        assert prompt_tokens(d, msgs) == tokens_of(d, "<s>[INST] S\n\nhi[/INST]")
        assert prompt_tokens(d, msgs) != tokens_of(d, "system: S\nuser: hi\n")


def test_template_file_of_no_known_family_stops_nxd(tmp_path):
    bad = tmp_path / "t.jinja"
    bad.write_text(UNKNOWN_TEMPLATE)
    d = Daemon(tiny(tmp_path), tmp_path, args=["--chat-template", str(bad)])
    d.spawn()
    assert d.proc.wait(10) == 2
    assert f"--chat-template: chat: the template in {bad} is not one nxd can render" in d.log()


def test_template_path_that_is_not_there_stops_nxd(tmp_path):
    d = Daemon(tiny(tmp_path), tmp_path, args=["--chat-template", str(tmp_path / "nope.jinja")])
    d.spawn()
    assert d.proc.wait(10) == 2
    assert f"'{tmp_path / 'nope.jinja'}' is not one of raw, chatml" in d.log() and "nor a template file" in d.log()


def test_empty_template_file_stops_nxd(tmp_path):
    empty = tmp_path / "e.jinja"
    empty.write_text("\n")
    d = Daemon(tiny(tmp_path), tmp_path, args=["--chat-template", str(empty)])
    d.spawn()
    assert d.proc.wait(10) == 2
    assert "is empty (for no template, --chat-template raw)" in d.log()


# ---------------------------------------------------------------- "think": the template's thinking switch

def test_think_false_opens_qwen3s_answer_with_an_empty_think_block(tmp_path):
    model = make_tiny.build(tmp_path / "q.gguf", wtype="Q8_0", vocab=True,
                            chat_template=(TEMPLATES / "qwen3.jinja").read_text().removesuffix("\n"))
    msgs = [{"role": "user", "content": "hi"}]
    with Daemon(model, tmp_path, workers=1, args=["--slots", "1", "--ctx", "256"]) as d:
        assert "chat template qwen3" in d.log()
        plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        with Client(d.sock) as c:
            for think, text in [(None, plain), (True, plain), (False, plain + "<think>\n\n</think>\n\n")]:
                kw = {} if think is None else {"think": think}
                _, _, ev = c.generate(rid="g", messages=msgs, max_tokens=1, temperature=0, **kw)
                assert ev["event"] == "done", ev
                assert ev["usage"]["prompt_tokens"] == tokens_of(d, text), think
            # the same through a prompt
            _, _, ev = c.generate(rid="p", prompt="hi", think=False, max_tokens=1, temperature=0)
            assert ev["usage"]["prompt_tokens"] == tokens_of(d, plain + "<think>\n\n</think>\n\n")


def test_think_is_refused_where_the_template_has_no_switch(tmp_path):
    with Daemon(tiny(tmp_path), tmp_path, workers=1, args=["--slots", "1", "--ctx", "256", "--chat-template",
                                                           "chatml"]) as d:
        with Client(d.sock) as c:
            _, _, ev = c.generate(rid="g", messages=[{"role": "user", "content": "hi"}], think=False, max_tokens=1)
            assert ev["event"] == "error" and ev["code"] == "bad_request", ev
            assert '"think": false' in ev["message"] and "chatml" in ev["message"], ev
            for bad in ({"prompt": "hi", "raw": True}, {"tokens": [1, 2]}):
                _, _, ev = c.generate(rid="b", think=True, max_tokens=1, **bad)
                assert ev["event"] == "error" and "field 'think' applies only to" in ev["message"], ev
