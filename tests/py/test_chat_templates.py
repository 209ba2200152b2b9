"""test_chat_templates.py - nxd's chat templates (tok/chat.c, through libnx.so) against real templates rendered by jinja2 as Hugging Face's apply_chat_template does.

The templates and their renderings are in tests/fixtures/chat_templates
(render.py writes expected.json; see its README.md). nxd has no Jinja
interpreter: it tells a template's family by its markers and renders the
family by hand, so each family is checked on conversations that walk its
branches (system or not, trimmed content, Qwen3's reasoning turns, a
conversation that ends on an assistant turn). A template nxd does not know is
"unknown", and rendering it is an error naming --chat-template, never a guess.
"""
import ctypes
import importlib.util
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import pytest

from conftest import build_dir

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
sys.path.insert(0, str(TEMPLATES))
import render  # noqa: E402  (tests/fixtures/chat_templates/render.py)

EXPECTED = json.loads((TEMPLATES / "expected.json").read_text())


class _Msg(ctypes.Structure):  # struct nx_chat_msg (tok/chat.h)
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


class _Err(ctypes.Structure):  # struct nx_err (common/err.h)
    _fields_ = [("msg", ctypes.c_char * 512)]


class _Opts(ctypes.Structure):  # struct nx_chat_opts (tok/chat.h)
    _fields_ = [("add_generation_prompt", ctypes.c_bool), ("thinking", ctypes.c_int)]


THINK = {None: 0, False: 1, True: 2}  # enum nx_chat_thinking


@pytest.fixture(scope="module")
def lib():
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_chat_detect.restype = ctypes.c_int
    so.nx_chat_detect.argtypes = [ctypes.c_char_p]
    so.nx_chat_tmpl_name.restype = ctypes.c_char_p
    so.nx_chat_tmpl_name.argtypes = [ctypes.c_int]
    so.nx_chat_render.restype = ctypes.c_int
    so.nx_chat_render.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Msg), ctypes.c_int, ctypes.c_bool,
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Err)]
    so.nx_chat_render_opts.restype = ctypes.c_int
    so.nx_chat_render_opts.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Msg), ctypes.c_int,
                                       ctypes.POINTER(_Opts), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Err)]
    return so


def detect(lib, src):
    return lib.nx_chat_tmpl_name(lib.nx_chat_detect(src.encode())).decode()


def nxd_render(lib, src, msgs, think=None, tmpl=None):
    """(rendered text or None, error message) of the template nxd detects in src (or tmpl, a family number)."""
    arr = (_Msg * len(msgs))(*[_Msg(m["role"].encode(), m["content"].encode()) for m in msgs])
    out, err = ctypes.c_void_p(), _Err()
    opts = _Opts(True, THINK[think])
    t = lib.nx_chat_detect(src.encode()) if tmpl is None else tmpl
    rc = lib.nx_chat_render_opts(t, src.encode(), arr, len(msgs), ctypes.byref(opts), ctypes.byref(out),
                                 ctypes.byref(err))
    if rc != 0:
        return None, err.msg.decode()
    text = ctypes.string_at(out.value).decode()
    ctypes.CDLL(None).free(out)
    return text, ""


@pytest.mark.parametrize("case", EXPECTED, ids=[f"{c['template']}-{i % len(render.CONVERSATIONS)}"
                                                + ("-nothink" if c.get("enable_thinking") is False else "")
                                                for i, c in enumerate(EXPECTED)])
def test_render_matches_the_template(lib, case):
    src = render.source(case["template"])
    assert detect(lib, src) == case["family"]
    got, err = nxd_render(lib, src, case["messages"], think=case.get("enable_thinking"))
    if "error" in case:  # the template raises: nxd refuses too, saying why
        assert got is None and case["family"] in err, err
        assert "alternate" in err or "System role not supported" in err or "system message only first" in err, err
        return
    assert got is not None, err
    want = case["text"]
    for fmt in re.findall(r'strftime_now\("([^"]+)"\)', src):  # today's date, as Hugging Face's strftime_now gives it
        want = want.replace(render.DAY.strftime(fmt), datetime.now().strftime(fmt))
    assert got == want


@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="no jinja2 here to render the templates anew")
def test_expected_renderings_are_the_templates_own():
    assert render.expected() == EXPECTED


@pytest.mark.parametrize("name", ["qwen3-thinking.jinja", "mistral.jinja"])
def test_templates_nxd_cannot_render_are_refused(lib, name):
    src = render.source(name)
    assert detect(lib, src) == "unknown"
    got, err = nxd_render(lib, src, render.CONVERSATIONS[0])
    assert got is None
    assert "--chat-template NAME" in err and "\"raw\": true" in err


def test_a_template_of_no_family_is_unknown_not_raw(lib):
    assert detect(lib, "{% for m in messages %}{{ m['content'] }}{% endfor %}") == "unknown"
    assert detect(lib, "") == "raw"


def test_thinking_option_needs_a_template_with_the_switch(lib):
    conv = render.CONVERSATIONS[0]
    for name in ["llama3.1.jinja", "mistral-v3.jinja", "deepseek-r1-distill.jinja"]:
        got, err = nxd_render(lib, render.source(name), conv, think=False)
        assert got is None and '"think": false' in err and "qwen3" in err, name
    got, err = nxd_render(lib, render.source("llama3.1.jinja"), conv, think=True)
    assert got is None and '"think": true' in err
    # thinking on is what Qwen3 and DeepSeek R1 do anyway
    for name in ["qwen3.jinja", "deepseek-r1-distill.jinja"]:
        assert nxd_render(lib, render.source(name), conv, think=True) == nxd_render(lib, render.source(name), conv)


def test_named_templates_without_the_source(lib):
    """--chat-template NAME on a model whose file has no template: the families render from nothing but their name."""
    names = {lib.nx_chat_tmpl_name(i).decode(): i for i in range(32) if lib.nx_chat_tmpl_name(i).decode() != "unknown"}
    conv = render.CONVERSATIONS[1]
    so = ctypes.CDLL(None)
    for name, want in [
        ("mistral-v3", "<s>[INST] Hi[/INST] Hello.</s>[INST] You are terse.\n\nBye[/INST]"),
        ("mistral-v7-tekken", "<s>[SYSTEM_PROMPT]You are terse.[/SYSTEM_PROMPT][INST]Hi[/INST]Hello.</s>[INST]Bye[/INST]"),
        ("deepseek-r1", "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜>Hello.<｜end▁of▁sentence｜>"
                        "<｜User｜>Bye<｜Assistant｜><think>\n"),
    ]:
        arr = (_Msg * len(conv))(*[_Msg(m["role"].encode(), m["content"].encode()) for m in conv])
        out, err = ctypes.c_void_p(), _Err()
        assert lib.nx_chat_render(names[name], None, arr, len(conv), True, ctypes.byref(out), ctypes.byref(err)) == 0
        assert ctypes.string_at(out.value).decode() == want
        so.free(out)
