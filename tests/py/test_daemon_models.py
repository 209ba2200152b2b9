"""test_daemon_models.py - what nxd does at start with what a model file says: its chat template, its context.

Tiny models (tests/fixtures/make_tiny.py) with a byte-level vocabulary, served by
the real daemon.
"""
import pytest

import make_tiny
from nxd_helpers import Client, Daemon

UNKNOWN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CHATML = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"


def tiny(tmp_path, name="m", **kw):
    return make_tiny.build(tmp_path / f"{name}.gguf", wtype="Q8_0", vocab=True, **kw)


def test_unknown_template_warns_and_refuses_chat_requests(tmp_path):
    model = tiny(tmp_path, chat_template=UNKNOWN_TEMPLATE)
    with Daemon(model, tmp_path, workers=1, args=["--slots", "1", "--ctx", "256"]) as d:
        assert "tokenizer.chat_template is not one nxd can render" in d.log()
        assert "chat template unknown" in d.log()
        with Client(d.sock) as c:
            for req in ({"messages": [{"role": "user", "content": "hi"}]}, {"prompt": "hi"}):
                _, _, ev = c.generate(rid="g", max_tokens=2, **req)
                assert ev["event"] == "error", ev
                assert "--chat-template NAME" in ev["message"] and "raw" in ev["message"], ev
            # a raw prompt needs no template
            toks, _, ev = c.generate(rid="r", prompt="hi", raw=True, max_tokens=2, temperature=0)
            assert ev["event"] == "done" and len(toks) == 2, ev


def test_chat_template_option_overrides_the_file(tmp_path):
    model = tiny(tmp_path, chat_template=UNKNOWN_TEMPLATE)
    with Daemon(model, tmp_path, workers=1, args=["--slots", "1", "--ctx", "256", "--chat-template", "chatml"]) as d:
        assert "chat template chatml (--chat-template)" in d.log()
        assert "is not one nxd can render" not in d.log()
        with Client(d.sock) as c:
            toks, _, ev = c.generate(rid="g", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                     temperature=0)
            assert ev["event"] == "done", ev
            assert ev["usage"]["prompt_tokens"] > 10  # "<|im_start|>user\nhi<|im_end|>\n" and more, by bytes


def test_no_template_is_raw_and_says_so(tmp_path):
    with Daemon(tiny(tmp_path), tmp_path, workers=1, args=["--slots", "1", "--ctx", "256"]) as d:
        assert "chat template raw (none in the file)" in d.log()


def test_bad_chat_template_name_is_refused(tmp_path):
    d = Daemon(tiny(tmp_path, chat_template=CHATML), tmp_path, args=["--chat-template", "vicuna"])
    d.spawn()
    assert d.proc.wait(10) == 2
    assert "--chat-template: 'vicuna' is not one of raw, chatml, llama2, llama3, llama3.1, qwen3" in d.log()
