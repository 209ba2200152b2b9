"""test_tools.py - tool calling: conversations with tools rendered as the real templates render them (tok/chat_tools.c through libnx.so, against jinja2), the model's calls read back (tok/tools.c), arguments checked against schemas (tok/tool_schema.c), the protocol's tools / tool_choice on a real daemon, and the OpenAI and ollama shapes of nxd-http with the official openai client.
"""
import ctypes
import importlib.util
import json
import sys
from datetime import datetime
from pathlib import Path

import pytest

from conftest import build_dir

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
sys.path.insert(0, str(TEMPLATES))
import render  # noqa: E402
import render_tools  # noqa: E402

EXPECTED = json.loads((TEMPLATES / "expected_tools.json").read_text())


class _Turn(ctypes.Structure):  # struct nx_chat_turn (tok/tools.h)
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p), ("calls", ctypes.c_char_p)]


class _Err(ctypes.Structure):  # struct nx_err (common/err.h)
    _fields_ = [("msg", ctypes.c_char * 512)]


@pytest.fixture(scope="module")
def lib():
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_chat_detect.restype = ctypes.c_int
    so.nx_chat_detect.argtypes = [ctypes.c_char_p]
    so.nx_chat_tmpl_name.restype = ctypes.c_char_p
    so.nx_chat_tmpl_name.argtypes = [ctypes.c_int]
    so.nx_chat_render_turns.restype = ctypes.c_int
    so.nx_chat_render_turns.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Turn), ctypes.c_int,
                                        ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.POINTER(_Err)]
    return so


def _b(s):
    return None if s is None else s.encode()


def nxd_render(lib, src, msgs, tools, prefix=None, family=None):
    """(text or None, error) of nxd's rendering; messages in the OpenAI shape the templates take."""
    turns = []
    for m in msgs:
        calls = None
        if m.get("tool_calls"):
            calls = json.dumps([{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                for c in m["tool_calls"]])
        turns.append(_Turn(_b(m["role"]), _b(m.get("content")), _b(calls)))
    arr = (_Turn * len(turns))(*turns)
    out, err = ctypes.c_void_p(), _Err()
    fam = lib.nx_chat_detect(src.encode()) if family is None else family
    rc = lib.nx_chat_render_turns(fam, _b(src), arr, len(turns), _b(json.dumps(tools) if tools is not None else None),
                                  _b(prefix), ctypes.byref(out), ctypes.byref(err))
    if rc != 0:
        return None, err.msg.decode()
    text = ctypes.string_at(out.value).decode()
    ctypes.CDLL(None).free(out)
    return text, ""


def _want(case):
    want = case["text"]
    if "strftime_now" in render.source(case["template"]):
        want = want.replace(f"Today Date: {render.DATE}", "Today Date: " + datetime.now().strftime("%d %b %Y"))
    return want


@pytest.mark.parametrize("case", EXPECTED, ids=[f"{c['template']}-{c['case']}" for c in EXPECTED])
def test_render_with_tools_matches_the_template(lib, case):
    src = render.source(case["template"])
    assert lib.nx_chat_tmpl_name(lib.nx_chat_detect(src.encode())).decode() == case["family"]
    got, err = nxd_render(lib, src, case["messages"], case["tools"])
    assert got is not None, err
    assert got == _want(case)


@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="no jinja2 here to render the templates anew")
def test_expected_tool_renderings_are_the_templates_own():
    assert json.loads(json.dumps(render_tools.expected())) == EXPECTED


def test_a_forced_call_start_follows_the_generation_prompt(lib):
    case = EXPECTED[0]
    got, err = nxd_render(lib, render.source(case["template"]), case["messages"], case["tools"],
                          prefix="<tool_call>\n")
    assert got == case["text"] + "<tool_call>\n", err


def test_llama_takes_one_call_per_turn(lib):
    msgs = [c for c in EXPECTED if c["template"] == "qwen2.5.jinja" and c["case"] == 4][0]["messages"]
    got, err = nxd_render(lib, render.source("llama3.1.jinja"), msgs, [render_tools.WEATHER])
    assert got is None and "one call per assistant message" in err


@pytest.mark.parametrize("family", ["chatml", "llama3", "llama2", "raw"])
def test_families_without_a_tool_convention_refuse_tools(lib, family):
    # SmolLM2's ChatML template (no <tools> in it), Llama 3.0, Llama 2, no template
    src = {"chatml": "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}",
           "llama3": "<|start_header_id|>", "llama2": "[INST] <<SYS>>", "raw": ""}[family]
    lib_fam = lib.nx_chat_detect(src.encode())
    assert lib.nx_chat_tmpl_name(lib_fam).decode() == family
    for tools, msgs in [([render_tools.WEATHER], [{"role": "user", "content": "hi"}]),
                        (None, [{"role": "user", "content": "hi"}, {"role": "tool", "content": "21"}])]:
        got, err = nxd_render(lib, src, msgs, tools)
        assert got is None
        assert f"({family}) has no tool-call convention" in err
    # without tools the conversation renders as before
    got, err = nxd_render(lib, src, [{"role": "user", "content": "hi"}], None)
    assert got is not None, err
