"""nxd-http: chat_template_kwargs.enable_thinking (as vLLM and llama.cpp's server take it) is nxd's "think"."""
from pathlib import Path

import pytest

import make_tiny
from http_helpers import Gateway, request
from nxd_helpers import Client, Daemon

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


@pytest.fixture
def qwen3_stack(tmp_path):
    model = make_tiny.build(tmp_path / "q.gguf", wtype="Q8_0", vocab=True,
                            chat_template=(TEMPLATES / "qwen3.jinja").read_text().removesuffix("\n"))
    with Daemon(model, tmp_path, workers=1, args=["--slots", "1", "--ctx", "256"]) as d:
        with Gateway(d.sock, tmp_path) as g:
            yield d, g


def chat(g, **kw):
    st, _, models = request(g, "GET", "/v1/models")
    assert st == 200, models
    body = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
    body.update(kw)
    return request(g, "POST", "/v1/chat/completions", body)


def tokens_of(d, text):
    with Client(d.sock) as c:
        return len(c.request({"id": "t", "op": "tokenize", "text": text, "special": True})["tokens"])


def test_enable_thinking_false_is_qwen3s_switch(qwen3_stack):
    d, g = qwen3_stack
    plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    for kwargs, text in [(None, plain), ({"enable_thinking": True}, plain),
                         ({"enable_thinking": False}, plain + "<think>\n\n</think>\n\n")]:
        st, _, body = chat(g, **({} if kwargs is None else {"chat_template_kwargs": kwargs}))
        assert st == 200, body
        assert body["usage"]["prompt_tokens"] == tokens_of(d, text), kwargs


def test_other_template_kwargs_are_refused(qwen3_stack):
    _, g = qwen3_stack
    st, _, body = chat(g, chat_template_kwargs={"reasoning_effort": "low"})
    assert st == 400 and "chat_template_kwargs.reasoning_effort" in body["error"]["message"], body
    st, _, body = chat(g, chat_template_kwargs={"enable_thinking": "no"})
    assert st == 400 and "must be a boolean" in body["error"]["message"], body


def test_ollamas_think_false_is_the_same_switch(qwen3_stack):
    d, g = qwen3_stack
    st, _, models = request(g, "GET", "/api/tags")
    model = models["models"][0]["name"]
    plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    chat_body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                 "options": {"num_predict": 1, "temperature": 0}}
    gen_body = {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 1, "temperature": 0}}
    for body in (chat_body, gen_body):
        for think, text in ((None, plain), (False, plain + "<think>\n\n</think>\n\n")):
            st, _, r = request(g, "POST", "/api/chat" if "messages" in body else "/api/generate",
                               body if think is None else dict(body, think=think))
            assert st == 200, r
            assert r["prompt_eval_count"] == tokens_of(d, text), (body, think, r)
        # true asks for the thinking apart from the content, which the gateway does not do: refused by name
        st, _, r = request(g, "POST", "/api/chat" if "messages" in body else "/api/generate", dict(body, think=True))
        assert st == 400 and "think" in r["error"], r


def test_ollamas_show_names_the_tools_of_a_template_with_them(qwen3_stack):
    d, g = qwen3_stack
    with Client(d.sock) as c:
        st = c.request({"id": "s", "op": "status"})
    assert st["chat_template"] == "qwen3" and st["tools"] is True, st
    st, _, models = request(g, "GET", "/api/tags")
    st, _, show = request(g, "POST", "/api/show", {"name": models["models"][0]["name"]})  # the older field
    assert st == 200 and show["capabilities"] == ["completion", "tools"], show
