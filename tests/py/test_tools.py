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
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p), ("calls", ctypes.c_char_p),
                ("call_id", ctypes.c_char_p)]


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
                                        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Err)]
    return so


def _b(s):
    return None if s is None else s.encode()


def nxd_render(lib, src, msgs, tools, prefix=None, family=None):
    """(text or None, error) of nxd's rendering; messages in the OpenAI shape the templates take."""
    turns = []
    for m in msgs:
        calls = None
        if m.get("tool_calls"):
            calls = json.dumps([{**({"id": c["id"]} if "id" in c else {}), "name": c["function"]["name"],
                                 "arguments": c["function"]["arguments"]} for c in m["tool_calls"]])
        turns.append(_Turn(_b(m["role"]), _b(m.get("content")), _b(calls), _b(m.get("tool_call_id"))))
    arr = (_Turn * len(turns))(*turns)
    out, err = ctypes.c_void_p(), _Err()
    fam = lib.nx_chat_detect(src.encode()) if family is None else family
    rc = lib.nx_chat_render_turns(fam, _b(src), arr, len(turns), _b(json.dumps(tools) if tools is not None else None),
                                  _b(prefix), None, ctypes.byref(out), ctypes.byref(err))
    if rc != 0:
        return None, err.msg.decode()
    text = ctypes.string_at(out.value).decode()
    ctypes.CDLL(None).free(out)
    return text, ""


def _want(case):
    import re
    want = case["text"]
    for fmt in re.findall(r'strftime_now\("([^"]+)"\)', render.source(case["template"])):  # today, as nxd renders it
        want = want.replace(render.DAY.strftime(fmt), datetime.now().strftime(fmt))
    return want


@pytest.mark.parametrize("case", EXPECTED, ids=[f"{c['template']}-{c['case']}" for c in EXPECTED])
def test_render_with_tools_matches_the_template(lib, case):
    src = render.source(case["template"])
    assert lib.nx_chat_tmpl_name(lib.nx_chat_detect(src.encode())).decode() == case["family"]
    got, err = nxd_render(lib, src, case["messages"], case["tools"])
    if "error" in case:  # the template raises: nxd refuses, saying why
        assert got is None and err, got
        if "Tool call IDs" in case["error"]:
            assert "tool call ids of" in err and case["template"].removesuffix(".jinja") in err
        return
    assert got is not None, err
    assert got == _want(case)


@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="no jinja2 here to render the templates anew")
def test_expected_tool_renderings_are_the_templates_own():
    assert json.loads(json.dumps(render_tools.expected())) == EXPECTED


@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="no jinja2 here to render the templates anew")
def test_json_in_the_prompt_is_written_as_pythons_json_dumps(lib):
    """Seeded random doubles (any bit pattern that is finite), edge values, and strings of any code point but
    surrogates, in a tool's schema: nxd writes them as json.dumps does (repr's shortest digits, its switch to
    exponents, ensure_ascii=False escapes), in Qwen's tojson and in Llama's tojson(indent=4)."""
    import random
    import struct
    rng = random.Random(26)
    reals = [0.1, 1e-7, 1e22, 2.0 ** 53, 5e-324, 1.7976931348623157e308, -0.0, 1e16, 9999999999999998.0, 0.0001,
             123e-20, 1.5, -2.5e-05]
    while len(reals) < 400:
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if x == x and abs(x) != float("inf"):
            reals.append(x)
    reals += [rng.uniform(-1e6, 1e6) for _ in range(100)] + [float(rng.randint(-10**15, 10**15)) for _ in range(50)]
    chars = [c for c in range(0x0, 0x3000) if not 0xd800 <= c < 0xe000] + [0x1f600, 0x10ffff, 0x2028, 0x7f]
    strs = ["".join(chr(rng.choice(chars)) for _ in range(rng.randint(0, 12))) for _ in range(100)]
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "default": {"reals": reals, "ints": [0, -1, 2**63 - 1, -2**63], "strs": strs,
                                      "nested": [[], {}, [None, True, False, {"k": []}]]}}}}
    msgs = [{"role": "user", "content": "q"}]
    for name in ("qwen2.5.jinja", "llama3.1.jinja"):
        src = render.source(name)
        got, err = nxd_render(lib, src, msgs, [tool])
        assert got is not None, err
        want = render_tools.hf_render(src, msgs, [tool], "" if "qwen" in name else "<|begin_of_text|>", "")
        assert got == want


class _Opts(ctypes.Structure):  # struct nx_chat_opts (tok/chat.h)
    _fields_ = [("add_generation_prompt", ctypes.c_bool), ("thinking", ctypes.c_int)]


@pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="no jinja2 here to render the templates anew")
def test_tools_with_thinking_off(lib):
    """Qwen3's enable_thinking=false with tools, and a forced call after it; templates without the switch refuse it."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    turns = (_Turn * 1)(_Turn(b"user", msgs[0]["content"].encode(), None))
    for name, ok in (("qwen3.jinja", True), ("qwen2.5.jinja", False), ("llama3.1.jinja", False)):
        src = render.source(name)
        out, err = ctypes.c_void_p(), _Err()
        opts = _Opts(True, 1)  # NX_CHAT_THINK_OFF
        rc = lib.nx_chat_render_turns(lib.nx_chat_detect(src.encode()), src.encode(), turns, 1,
                                      json.dumps(TOOLS).encode(), b"<tool_call>\n", ctypes.addressof(opts),
                                      ctypes.byref(out), ctypes.byref(err))
        if not ok:
            assert rc != 0 and '"think": false' in err.msg.decode()
            continue
        assert rc == 0, err.msg.decode()
        got = ctypes.string_at(out.value).decode()
        ctypes.CDLL(None).free(out)
        assert got == render_tools.hf_render(src, msgs, TOOLS, "", "<|im_end|>", enable_thinking=False) + "<tool_call>\n"


def test_a_forced_call_start_follows_the_generation_prompt(lib):
    case = EXPECTED[0]
    got, err = nxd_render(lib, render.source(case["template"]), case["messages"], case["tools"],
                          prefix="<tool_call>\n")
    assert got == case["text"] + "<tool_call>\n", err


MISTRAL_SMALL_32_LIKE = render.source("mistral-v7-tekken.jinja").replace(
    "{{- \"[TOOL_CALLS] [\" }}", "{{- \"[TOOL_CALLS]\" + tool_call.function.name + \"[ARGS]\" }}")


@pytest.mark.parametrize("name", ["mistral-v7.jinja", "deepseek-r1-distill.jinja", "small-3.2-like"])
def test_templates_whose_tool_convention_nxd_lacks_refuse_tools(lib, name):
    """Mistral Large 2411's v7 template has no tools, and a tekken one of another call spelling
    ([TOOL_CALLS]name[ARGS]...) is not taken for Small 3.1's: refused by family name."""
    src = MISTRAL_SMALL_32_LIKE if name == "small-3.2-like" else render.source(name)
    fam = lib.nx_chat_tmpl_name(lib.nx_chat_detect(src.encode())).decode()
    got, err = nxd_render(lib, src, [{"role": "user", "content": "hi"}], [render_tools.WEATHER])
    assert got is None and f"({fam}) has no tool-call convention" in err
    got, err = nxd_render(lib, src, [{"role": "user", "content": "hi"}], None)
    assert got is not None, err


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


# --- a scripted model: the answers are the model's own greedy decoding, by construction
#
# No small model with a tool-calling template is at hand (SmolLM2's ChatML
# template has no tool convention: nxd refuses tools for it, tested below).
# So the model is built to answer as scripted: its attention and MLP write
# nothing (zero output projections), so the next token depends only on the
# current one, and the embeddings and output head form a table "after token
# a comes b". The prompt's last token (which the generation prompt and
# tool_choice's forced call start decide) picks the script. What runs is the
# real path - template, tokenizer, forward pass, sampler, call reader,
# protocol, gateway - with a model that is a lookup table instead of a
# trained one: it shows the plumbing, not that any model calls tools well.

import numpy as np  # noqa: E402

import make_tiny  # noqa: E402
from nxd_helpers import Client, Daemon  # noqa: E402

NL, QUOTE, SPACE_END = 3 + 0x0A, 3 + 0x22, 3 + 0x81  # byte tokens <0x0A>, <0x22>, the last byte of "▁"


def scripted(path, template, scripts, control=()):
    """A llama model with a byte-fallback vocabulary plus the scripts' pieces; scripts: {source token id:
    [piece, ...]}: after the source, greedy decoding writes the pieces one token each, then </s>. control: control
    tokens' texts, ids from CONTROL on (a script's piece may be one)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"\u2581w{i}" for i in range(16)]
    types = [2, 3, 3] + [6] * 256 + [1] * 16
    toks += list(control)
    types += [3] * len(control)
    after = {}
    for src, pieces in scripts.items():
        ids = []
        for p in pieces:
            sp = p.replace(" ", "\u2581")
            if sp not in toks:
                toks.append(sp)
                types.append(1)
            ids.append(toks.index(sp))
        seq = [src] + ids + [2]
        for a, b in zip(seq, seq[1:]):
            assert after.setdefault(a, b) == b, "two scripts continue one token differently"
    n_vocab, dim = len(toks), 64
    rng = np.random.default_rng(7)
    emb = (rng.standard_normal((n_vocab, dim)) * 0.1).astype(np.float32)
    head = np.zeros((n_vocab, dim), np.float32)
    for k, a in enumerate(sorted(after)):
        emb[a] = 0
        emb[a, k] = 1
        head[after[a], k] = 50

    def mutate(meta, t):
        meta.update({"tokenizer.ggml.model": ("str", "llama"), "tokenizer.ggml.tokens": ("arr", toks),
                     "tokenizer.ggml.scores": ("arr", [0.0] * n_vocab),
                     "tokenizer.ggml.token_type": ("arr", types),
                     "tokenizer.ggml.bos_token_id": ("u32", 1), "tokenizer.ggml.eos_token_id": ("u32", 2)})
        t["token_embd.weight"] = (emb, None)
        t["output.weight"] = (head, None)
        t["output_norm.weight"] = (np.ones(dim, np.float32), None)
        for name in list(t):
            if name.endswith("attn_output.weight") or name.endswith("ffn_down.weight"):
                t[name] = (np.zeros_like(t[name][0]), None)

    return make_tiny.build(path, arch="llama", wtype="F32", dim=dim, n_layer=1, n_head=4, n_head_kv=2, n_ff=128,
                           n_vocab=n_vocab, n_ctx=8192, chat_template=template, mutate=mutate)


QWEN25 = render.source("qwen2.5.jinja")
LLAMA31 = render.source("llama3.1.jinja")
TOOLS = [render_tools.WEATHER, render_tools.CLOCK]
# CLOCK's offset has bounds the grammar compiler refuses (-12.5, 1e20): a call that must be made, of any tool,
# is held to each tool's schema as it is sampled, so "required" is offered tools whose schemas compile.
CLOCK_HELD = {"type": "function", "function": {"name": "local_time", "parameters": {
    "type": "object", "properties": {"offset": {"type": "number", "minimum": -12, "maximum": 14}}}}}
HELD = [render_tools.WEATHER, CLOCK_HELD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER = "It is 21 C and clear in Paris."
# After the generation prompt ("...assistant\n"): a final answer, or (another model) a call of its own.
FINAL = {NL: [ANSWER]}
AUTO_CALL = {NL: ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']}
# After tool_choice's forced start: the named call's arguments, or a whole call ("required").
NAMED = {SPACE_END: ['{"city": "Paris", "unit": "celsius"}', '}\n</tool_call>']}
REQUIRED = {QUOTE: ['local_time", "arguments": {"offset": 1.5}}', '\n</tool_call>']}


def serve(path, template, scripts, tmp_path, name, control=()):
    return Daemon(scripted(tmp_path / f"{name}.gguf", template, scripts, control), tmp_path, workers=1, name=name,
                  args=["--ctx", "8192", "--slots", "2"])


CONTROL = 3 + 256 + 16  # the first control token's id in scripted()
# Mistral's markers are control tokens of its vocabulary, as in Mistral 7B v0.3's, Nemo's and Small 3.1's
MISTRAL_CONTROL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                   "[/TOOL_RESULTS]"]
INST_END, RESULTS_END = CONTROL + 1, CONTROL + 6
# After the question: a call of its own; after the tool's result: the answer; after a named call's forced start
# ('..."arguments": '): its arguments.
MISTRAL_SCRIPT = {INST_END: ["[TOOL_CALLS]", ' [{"name": "get_weather", "arguments": {"city": "Paris"}}]'],
                  RESULTS_END: [ANSWER],
                  SPACE_END: ['{"city": "Paris", "unit": "celsius"}', '}]']}


def test_the_scripted_model_answers_as_scripted(tmp_path):
    with serve(None, QWEN25, {**FINAL, **NAMED, **REQUIRED}, tmp_path, "s") as d, Client(d.sock) as c:
        toks, text, done = c.generate(messages=ASK, temperature=0, stream=False)
        assert text == ANSWER and done["reason"] == "eos"


def named(name):
    return {"type": "function", "function": {"name": name}}


def test_protocol_tool_choice_named_and_required(tmp_path):
    with serve(None, QWEN25, {**FINAL, **NAMED, **REQUIRED}, tmp_path, "s") as d, Client(d.sock) as c:
        # the forced start of a named call ends on "▁" (its last byte token), which the script continues
        _, text, done = c.generate(messages=ASK, tools=TOOLS, tool_choice=named("get_weather"), temperature=0,
                                   stream=False)
        assert done["reason"] == "tool_calls", done
        assert text == ""
        [call] = done["tool_calls"]
        assert call["name"] == "get_weather" and call["id"].startswith("call_")
        assert json.loads(call["arguments"]) == {"city": "Paris", "unit": "celsius"}
        _, text, done = c.generate(messages=ASK, tools=HELD, tool_choice="required", temperature=0, stream=False)
        assert [(t["name"], json.loads(t["arguments"])) for t in done["tool_calls"]] == [("local_time", {"offset": 1.5})]
        assert done["incomplete"] is False
        # a stop string inside the call cuts it as max_tokens would: done, incomplete, no call and no text
        _, text, cut = c.generate(messages=ASK, tools=HELD, tool_choice="required", temperature=0, stream=False,
                                  stop=["offset"])
        assert cut["event"] == "done" and cut["reason"] == "stop" and cut["incomplete"] is True, cut
        assert text == "" and "tool_calls" not in cut, cut
        # the call whole on the last token max_tokens allows: the answer ended for the call, not the length
        _, _, at = c.generate(messages=ASK, tools=HELD, tool_choice="required", temperature=0, stream=False,
                              max_tokens=2)
        assert at["reason"] == "tool_calls" and at["usage"]["completion_tokens"] == 2, at
        assert [(t["name"], t["arguments"]) for t in at["tool_calls"]] == \
            [(t["name"], t["arguments"]) for t in done["tool_calls"]], at
        # auto: the model answers in text, no call
        _, text, done = c.generate(messages=ASK, tools=TOOLS, temperature=0, stream=False)
        assert text == ANSWER and done["reason"] == "eos" and "tool_calls" not in done
        # none: no tools in the prompt, nothing read as a call
        _, text, none = c.generate(messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, stream=False)
        assert text == ANSWER and none["usage"]["prompt_tokens"] < done["usage"]["prompt_tokens"]


def test_protocol_round_trip_with_the_tool_result(tmp_path):
    with serve(None, QWEN25, {**FINAL, **NAMED}, tmp_path, "s") as d, Client(d.sock) as c:
        _, _, done = c.generate(messages=ASK, tools=TOOLS, tool_choice=named("get_weather"), temperature=0,
                                stream=False)
        [call] = done["tool_calls"]
        msgs = ASK + [{"role": "assistant", "tool_calls": [{"id": call["id"], "type": "function", "function": {
            "name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21, "sky": "clear"}'}]
        toks, text, done = c.generate(messages=msgs, tools=TOOLS, temperature=0, stream=False)
        assert text == ANSWER and done["reason"] == "eos"
        # the prompt is the one the template renders for that conversation
        rendered, err = nxd_render(lib_handle(), QWEN25, [
            ASK[0], {"role": "assistant", "content": None, "tool_calls": [{"function": {
                "name": "get_weather", "arguments": json.loads(call["arguments"])}}]},
            msgs[2]], TOOLS)
        assert rendered == render_tools.hf_render(QWEN25, [
            ASK[0], {"role": "assistant", "content": None, "tool_calls": [{"function": {
                "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}, msgs[2]],
            TOOLS, "", "<|im_end|>") if importlib.util.find_spec("jinja2") else rendered, err
        assert c.request({"op": "tokenize", "id": 9, "text": rendered, "special": True})["tokens"] == \
            c.request({"op": "tokenize", "id": 9, "text": rendered, "special": True})["tokens"]
        n_prompt = len(c.request({"op": "tokenize", "id": 9, "text": rendered, "special": True})["tokens"])
        assert done["usage"]["prompt_tokens"] == n_prompt


def lib_handle():
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_chat_detect.restype = ctypes.c_int
    so.nx_chat_detect.argtypes = [ctypes.c_char_p]
    so.nx_chat_render_turns.restype = ctypes.c_int
    so.nx_chat_render_turns.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Turn), ctypes.c_int,
                                        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Err)]
    return so


def test_calls_are_the_same_with_speculation(tmp_path):
    with serve(None, QWEN25, {**AUTO_CALL, **NAMED}, tmp_path, "s") as d, Client(d.sock) as c:
        for choice in ("auto", named("get_weather")):
            outs = []
            for mode in ("off", "prompt"):
                _, text, done = c.generate(messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, stream=False,
                                           speculate={"mode": mode})
                outs.append((text, done["reason"], [(t["name"], t["arguments"]) for t in done["tool_calls"]]))
            assert outs[0] == outs[1] and outs[0][1] == "tool_calls", outs


def test_protocol_streams_a_call_the_model_makes_on_its_own(tmp_path):
    with serve(None, QWEN25, AUTO_CALL, tmp_path, "s") as d, Client(d.sock) as c:
        c.send({"op": "generate", "id": 1, "messages": ASK, "tools": TOOLS, "temperature": 0})
        evs = list(c.events(1))
        kinds = [e["event"] for e in evs]
        assert kinds == ["token", "token", "tool_call", "done"], evs
        assert all(e["text"] == "" for e in evs if e["event"] == "token")  # a call is not content
        assert evs[2]["index"] == 0 and evs[2]["tool_call"]["name"] == "get_weather"
        assert json.loads(evs[2]["tool_call"]["arguments"]) == {"city": "Paris"}
        assert evs[3]["reason"] == "tool_calls" and "tool_calls" not in evs[3]


BAD_CALLS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "send_mail", "arguments": {"to": "x"}}\n</tool_call>',   # a tool not offered
    '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>',     # arguments not an object
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',           # never closed, never whole
]


@pytest.mark.parametrize("bad", range(len(BAD_CALLS)))
def test_a_malformed_call_is_plain_text_never_a_call(tmp_path, bad):
    text = BAD_CALLS[bad]
    if bad == 3:
        text = text[:-2]  # cut inside the JSON
    with serve(None, QWEN25, {NL: [text]}, tmp_path, "s") as d, Client(d.sock) as c:
        _, got, done = c.generate(messages=ASK, tools=TOOLS, temperature=0, stream=False)
        assert got == text and done["reason"] == "eos" and "tool_calls" not in done
        # streamed, the same text comes in token events
        _, got, done = c.generate(messages=ASK, tools=TOOLS, temperature=0)
        assert got == text and done["reason"] == "eos"
        # when a call is required the grammar keeps the answer a call: cut by max_tokens before it is whole, it
        # ends for the length, incomplete, with neither a call nor the call's text (streamed or not)
        for stream in (False, True):
            toks, got, done = c.generate(messages=ASK, tools=HELD, tool_choice="required", temperature=0,
                                         max_tokens=8, stream=stream)
            assert done["event"] == "done" and done["reason"] == "length" and done["incomplete"] is True, done
            assert got == "" and "tool_calls" not in done and len(toks) == 8, (got, done)


STORE = {"type": "function", "function": {"name": "store", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
# A call the grammar lets through and the reader cannot take: an integer past 64 bits, in two tokens.
BIG = {QUOTE: ['store", "arguments": {"n": 18446744073709551616}}', '\n</tool_call>']}


def test_a_required_call_the_reader_cannot_take_is_an_error_and_no_text(tmp_path):
    """A whole call that cannot be taken ends the request with invalid_tool_call saying why, and none of
    it is ever text: not in the token events, not at max_tokens (the call whole on the last token allowed)."""
    with serve(None, QWEN25, BIG, tmp_path, "s") as d, Client(d.sock) as c:
        for max_tokens in (40, 2):
            req = dict(op="generate", messages=ASK, tools=[STORE], tool_choice="required", temperature=0,
                       max_tokens=max_tokens)
            c.send(dict(req, id=f"s{max_tokens}"))
            evs = list(c.events(f"s{max_tokens}"))
            assert all(e["text"] == "" for e in evs if e["event"] == "token"), evs
            err = evs[-1]
            assert err["event"] == "error" and err["code"] == "invalid_tool_call", err
            assert "could not be read" in err["message"], err
            _, text, err = c.generate(**{k: v for k, v in req.items() if k != "op"}, stream=False)
            assert err["event"] == "error" and err["code"] == "invalid_tool_call", err
        # a tool whose arguments could never be an object cannot be the call tool_choice asks for
        odd = {"type": "function", "function": {"name": "say", "parameters": {"type": "string"}}}
        _, _, err = c.generate(messages=ASK, tools=[odd], tool_choice="required", temperature=0)
        assert err["code"] == "bad_request" and "tool 'say'" in err["message"] and "'string'" in err["message"], err


# --- a call tool_choice asks for is held to its tool's schema as it is sampled (tok/tool_grammar.c)
#
# Tools whose schemas bound every string, number and array, so that even a model that writes anything the
# grammar allows (the scripted model where its script is masked out: every allowed token equally likely)
# finishes its call well within max_tokens.
HELD_WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}}}
HELD_CLOCK = {"type": "function", "function": {"name": "local_time", "parameters": {
    "type": "object", "properties": {"offset": {"type": "integer", "minimum": -12, "maximum": 14},
                                     "dst": {"type": "boolean"}},
    "required": ["offset"], "additionalProperties": False}}}
HELD_ALARM = {"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object", "properties": {
        "times": {"type": "array", "items": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                  "minItems": 1, "maxItems": 3},
        "label": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]},
        "repeat": {"type": "string", "const": "daily"}},
    "required": ["times", "label"]}}}
HELD_TOOLS = [HELD_WEATHER, HELD_CLOCK, HELD_ALARM]
# What the model would write after the forced starts: arguments that break the schemas (a unit not in the
# enum, a missing required city, an offset out of range), in pieces the grammar takes while they fit.
WRONG = {SPACE_END: ['{"city": ', '"Paris", ', '"unit": ', '"kelvin"', '}', '}\n</tool_call>'],
         QUOTE: ['local_time", "arguments": {', '"offset": 99', '}}\n</tool_call>']}


def test_a_forced_call_is_held_to_its_schema_over_many_seeds(tmp_path):
    """Property: at temperature 1 over many seeds (and greedy), with a model that wants to break the schema,
    every call tool_choice asks for is complete, names the right tool, and its arguments validate against the
    tool's parameters (the jsonschema package, not nxd's checker)."""
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in HELD_TOOLS}
    # "required" of the three (the script's local_time fits), of two the script names neither of (each
    # draws its tool), and each tool named
    choices = [("required", HELD_TOOLS), ("required", [HELD_WEATHER, HELD_ALARM])] + \
        [(named(t["function"]["name"]), HELD_TOOLS) for t in HELD_TOOLS]
    seen = {}
    with serve(None, QWEN25, WRONG, tmp_path, "s") as d, Client(d.sock) as c:
        for seed in range(100):
            for k, (choice, tools) in enumerate(choices):
                kw = {"temperature": 0} if seed == 0 else {"temperature": 1.0, "seed": seed}
                _, text, done = c.generate(rid=k + 1, messages=ASK, tools=tools, tool_choice=choice,
                                           stream=False, max_tokens=400, **kw)
                assert done["event"] == "done", (choice, seed, done)
                assert done["reason"] == "tool_calls" and text == "", (choice, seed, done)
                assert done["incomplete"] is False, done
                [call] = done["tool_calls"]
                if choice == "required":
                    assert call["name"] in [t["function"]["name"] for t in tools]
                else:
                    assert call["name"] == choice["function"]["name"]
                args = json.loads(call["arguments"])
                jsonschema.validate(args, schemas[call["name"]])
                seen.setdefault((k, call["name"]), set()).add(json.dumps(args, sort_keys=True))
    # the draws are the model's: where the script fits it is followed (local_time for the first "required",
    # Paris), where it does not every allowed continuation may come
    assert {name for k, name in seen if k == 0} == {"local_time"}
    assert {name for k, name in seen if k == 1} == {"get_weather", "set_alarm"}, seen.keys()
    assert {json.loads(a)["unit"] for a in seen[(2, "get_weather")]} == {"celsius", "fahrenheit"}
    assert all(json.loads(a)["city"] == "Paris" for a in seen[(2, "get_weather")])
    assert len(seen[(3, "local_time")]) > 10 and len(seen[(4, "set_alarm")]) > 50, {k: len(v) for k, v in seen.items()}


@pytest.mark.parametrize("template", ["llama3.1.jinja", "mistral-v3.jinja", "mistral-v7-tekken.jinja"])
def test_a_forced_call_of_each_convention_is_held_to_its_schema(tmp_path, template):
    """Llama 3.1's convention (the whole answer is {"name": ..., "parameters": ...}) and Mistral's
    ("[TOOL_CALLS] [" or Tekken's "[TOOL_CALLS][" list), held to the schema too."""
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in HELD_TOOLS}
    names = set()
    control = MISTRAL_CONTROL if "mistral" in template else ()
    with serve(None, render.source(template), WRONG, tmp_path, "s", control) as d, Client(d.sock) as c:
        for seed in range(40):
            for choice in ("required", named("set_alarm")):
                _, text, done = c.generate(messages=ASK, tools=HELD_TOOLS, tool_choice=choice, stream=False,
                                           max_tokens=400, temperature=1.0, seed=seed)
                assert done["event"] == "done" and done["reason"] == "tool_calls" and text == "", done
                [call] = done["tool_calls"]
                assert choice == "required" or call["name"] == "set_alarm"
                jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
                names.add(call["name"])
    # Mistral writes "arguments", so the script's local_time call fits and "required" follows it; Llama's
    # "parameters" does not, and "required" draws any tool
    assert names == ({"local_time", "set_alarm"} if control else {"get_weather", "local_time", "set_alarm"})


def test_forced_call_streamed_with_logprobs_and_speculation(tmp_path):
    """The call's grammar is the request's sampling grammar: streamed, with logprobs and with speculation,
    the call validates (and greedy gives the same call either way)."""
    jsonschema = pytest.importorskip("jsonschema")
    with serve(None, QWEN25, WRONG, tmp_path, "s") as d, Client(d.sock) as c:
        outs = []
        for mode in ("off", "prompt"):
            c.send({"op": "generate", "id": 1, "messages": ASK, "tools": HELD_TOOLS, "temperature": 0,
                    "tool_choice": named("get_weather"), "logprobs": 3, "speculate": {"mode": mode}})
            evs = list(c.events(1))
            calls = [e["tool_call"] for e in evs if e["event"] == "tool_call"]
            assert evs[-1]["event"] == "done" and evs[-1]["reason"] == "tool_calls", evs[-1]
            [call] = calls
            jsonschema.validate(json.loads(call["arguments"]), HELD_WEATHER["function"]["parameters"])
            outs.append(call["arguments"])
        assert outs[0] == outs[1]


def test_forced_call_batched_with_an_unconstrained_request(tmp_path):
    """Two requests in the same steps, one under the call's grammar, one free: each gets its own answer."""
    jsonschema = pytest.importorskip("jsonschema")
    with serve(None, QWEN25, {**WRONG, **FINAL}, tmp_path, "s") as d, Client(d.sock) as c1, Client(d.sock) as c2:
        for seed in range(10):
            c1.send({"op": "generate", "id": 1, "messages": ASK, "tools": HELD_TOOLS, "tool_choice": "required",
                     "temperature": 1.0, "seed": seed, "stream": False, "max_tokens": 400})
            c2.send({"op": "generate", "id": 1, "messages": ASK, "temperature": 1.0, "seed": seed, "stream": False})
            [tool_done] = list(c1.events(1))
            [plain_done] = list(c2.events(1))
            assert plain_done["text"] == ANSWER and "incomplete" not in plain_done, plain_done
            [call] = tool_done["tool_calls"]
            jsonschema.validate(json.loads(call["arguments"]),
                                {t["function"]["name"]: t["function"]["parameters"] for t in HELD_TOOLS}[call["name"]])


def test_a_schema_the_grammar_cannot_hold_is_refused_when_a_call_is_required(tmp_path):
    """The tool's name and the construct are in the bad_request; offered under auto (or not the named tool),
    the same schema is served as before: its arguments are then the model's, checked only once made."""
    odd = {"type": "function", "function": {"name": "even_only", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}}}
    with serve(None, QWEN25, {**FINAL, **NAMED}, tmp_path, "s") as d, Client(d.sock) as c:
        for tools, choice in (([render_tools.WEATHER, odd], "required"), ([odd], named("even_only")),
                              (TOOLS, "required")):
            _, _, err = c.generate(messages=ASK, tools=tools, tool_choice=choice)
            assert err["event"] == "error" and err["code"] == "bad_request", err
            bad = "even_only" if tools[-1] is odd else "local_time"
            assert f"tool '{bad}'" in err["message"], err
            assert ("'multipleOf'" if bad == "even_only" else "'maximum' 1e+20") in err["message"], err
        _, text, done = c.generate(messages=ASK, tools=[odd], temperature=0, stream=False)
        assert text == ANSWER and done["reason"] == "eos"
        _, _, done = c.generate(messages=ASK, tools=[render_tools.WEATHER, odd], tool_choice=named("get_weather"),
                                temperature=0, stream=False)
        assert [t["name"] for t in done["tool_calls"]] == ["get_weather"]
        # strict: the call tool_choice asks for is held to its schema, so strict is what it gets
        strict = [{"type": "function", "function": {**t["function"], "strict": True}} for t in HELD]
        _, _, done = c.generate(messages=ASK, tools=strict, tool_choice=named("get_weather"), temperature=0,
                                stream=False)
        assert [json.loads(t["arguments"]) for t in done["tool_calls"]] == [{"city": "Paris", "unit": "celsius"}]
        _, _, err = c.generate(messages=ASK, tools=HELD, tool_choice="required", ignore_eos=True)
        assert err["code"] == "bad_request" and "ignore_eos" in err["message"]
        assert c.request({"op": "status", "id": 2})["event"] == "status"  # the daemon lives on


def test_parallel_tool_calls_false_stops_at_the_first_call(tmp_path):
    two = {NL: ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>']}
    with serve(None, QWEN25, two, tmp_path, "s") as d, Client(d.sock) as c:
        _, _, done = c.generate(messages=ASK, tools=TOOLS, temperature=0, stream=False)
        assert [json.loads(t["arguments"])["city"] for t in done["tool_calls"]] == ["Paris", "Rome"]
        assert len({t["id"] for t in done["tool_calls"]}) == 2
        _, _, done = c.generate(messages=ASK, tools=TOOLS, temperature=0, stream=False, parallel_tool_calls=False)
        assert [json.loads(t["arguments"])["city"] for t in done["tool_calls"]] == ["Paris"]
        assert done["reason"] == "tool_calls" and done["usage"]["completion_tokens"] == 1
    # over HTTP the newline between the two calls is no content: OpenAI's content is null beside calls
    with serve(None, QWEN25, two, tmp_path, "h") as d, Gateway(d.sock, tmp_path) as g:
        r = gateway_client(g).chat.completions.create(model=model_of(g), messages=ASK, tools=TOOLS, temperature=0)
        m = r.choices[0].message
        assert [json.loads(t.function.arguments)["city"] for t in m.tool_calls] == ["Paris", "Rome"]
        assert m.content is None, m


def test_llama_call_is_the_whole_answer(tmp_path):
    script = {NL: ['{"name": "get_weather", "parameters": {"city": "Paris"}}']}
    with serve(None, LLAMA31, script, tmp_path, "s") as d, Client(d.sock) as c:
        _, text, done = c.generate(messages=ASK, tools=TOOLS, temperature=0, stream=False)
        assert text == "" and done["reason"] == "tool_calls"
        assert [(t["name"], json.loads(t["arguments"])) for t in done["tool_calls"]] == [("get_weather", {"city": "Paris"})]
        # without tools offered the same answer is text
        _, text, done = c.generate(messages=ASK, temperature=0, stream=False)
        assert text == script[NL][0] and "tool_calls" not in done


def test_refusals_name_the_field_or_the_family(tmp_path):
    smollm2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
               "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    with serve(None, smollm2, FINAL, tmp_path, "s") as d, Client(d.sock) as c:
        _, _, err = c.generate(messages=ASK, tools=TOOLS)
        assert err["code"] == "bad_request" and "(chatml) has no tool-call convention" in err["message"]
        _, _, err = c.generate(messages=ASK + [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "1"}])
        assert err["code"] == "bad_request" and "(chatml) has no tool-call convention" in err["message"]
        _, text, done = c.generate(messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, stream=False)
        assert text == ANSWER  # "none": the tools are not offered, so any template serves
        for req, want in [
            ({"tools": [{"type": "retrieval"}]}, "field 'tools[0].type' must be \"function\""),
            ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "field 'tools[0].function.name'"),
            ({"tools": [render_tools.WEATHER, render_tools.WEATHER]}, "repeats tool 'get_weather'"),
            ({"tools": TOOLS, "tool_choice": named("nope")}, "not one of the tools offered"),
            ({"tool_choice": "required"}, "no tools are offered"),
            ({"tools": TOOLS, "tool_choice": "sometimes"}, "field 'tool_choice' must be"),
            ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]},
             "'tools[0].function.strict' is true and tool_choice is \"auto\""),
            ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}], "tool_choice": "auto"},
             "only in a call tool_choice asks for"),
            ({"messages": [{"role": "user", "content": "q", "tool_calls": []}]}, "belongs to an assistant"),
            ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
             "arguments' must be a JSON object"),
        ]:
            r = {"messages": ASK, **req}
            _, _, err = c.generate(**r)
            assert err["event"] == "error" and want in err["message"], (req, err)
    with serve(None, QWEN25, FINAL, tmp_path, "q") as d, Client(d.sock) as c:
        odd = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$ref": "#/x"}}}
        _, _, err = c.generate(messages=ASK, tools=[odd], tool_choice="required")
        assert err["code"] == "bad_request" and "'$ref'" in err["message"]
        _, text, done = c.generate(messages=ASK, tools=[odd], temperature=0, stream=False)
        assert text == ANSWER  # auto checks no arguments, so any schema is offered as it is
        _, _, err = c.generate(prompt="hi", raw=True, tools=TOOLS)
        assert err["code"] == "bad_request" and "chat template" in err["message"]


# --- nxd-http: the OpenAI and ollama shapes, with the official openai client

openai = pytest.importorskip("openai", reason="the openai package is not in the venv (tests/requirements.txt)")
from http_helpers import Gateway, request  # noqa: E402


def gateway_client(g):
    return openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def model_of(g):
    st, _, body = request(g, "GET", "/v1/models")
    assert st == 200, body
    return body["data"][0]["id"]


def test_openai_round_trip_call_result_answer(tmp_path):
    """A tool call, the tool's answer, the final message - through the official openai client."""
    with serve(None, QWEN25, {**FINAL, **NAMED}, tmp_path, "s") as d, Gateway(d.sock, tmp_path) as g:
        client, model = gateway_client(g), model_of(g)
        msgs = list(ASK)
        r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        [tc] = ch.message.tool_calls
        assert tc.type == "function" and tc.id.startswith("call_") and tc.function.name == "get_weather"
        assert json.loads(tc.function.arguments) == {"city": "Paris", "unit": "celsius"}
        msgs.append(ch.message.model_dump(exclude_none=True))  # the assistant's call, as clients send it back
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"temperature": 21})})
        r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0)
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == ANSWER
        assert r.choices[0].message.tool_calls is None
        # and streamed: the same call in OpenAI's pieces
        s = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, temperature=0, stream=True,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls, finish, content = {}, None, ""
        for chunk in s:
            for c in chunk.choices:
                content += c.delta.content or ""
                finish = c.finish_reason or finish
                for t in c.delta.tool_calls or []:
                    acc = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
                    if t.id:
                        assert acc["id"] is None and acc["arguments"] == ""  # id and name come first
                        acc["id"], acc["name"] = t.id, t.function.name
                    acc["arguments"] += (t.function.arguments or "") if t.function else ""
        assert finish == "tool_calls" and content == ""
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
            [("get_weather", {"city": "Paris", "unit": "celsius"})]
        assert calls[0]["id"].startswith("call_")


def test_openai_stream_of_a_call_the_model_makes_and_errors(tmp_path):
    with serve(None, QWEN25, AUTO_CALL, tmp_path, "s") as d, Gateway(d.sock, tmp_path) as g:
        client, model = gateway_client(g), model_of(g)
        s = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, temperature=0, stream=True)
        chunks = list(s)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        tool_deltas = [t for dl in deltas for t in (dl.tool_calls or [])]
        assert [t.index for t in tool_deltas] == [0, 0]
        assert tool_deltas[0].id and tool_deltas[0].function.name == "get_weather" and tool_deltas[0].function.arguments == ""
        assert json.loads(tool_deltas[1].function.arguments) == {"city": "Paris"} and tool_deltas[1].id is None
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert "".join(dl.content or "" for dl in deltas) == ""
        # a call that must be made and is cut off before it is whole: finish_reason length, no call, and none of
        # the call's text as content (a 500 would have the client retry what fails the same way)
        r = client.chat.completions.create(model=model, messages=ASK, tools=HELD, tool_choice="required",
                                           temperature=0, max_tokens=8)
        assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls
        assert not r.choices[0].message.content and r.usage.completion_tokens == 8
        chunks = list(client.chat.completions.create(model=model, messages=ASK, tools=HELD, tool_choice="required",
                                                     temperature=0, max_tokens=8, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(dl.content or "" for dl in deltas) == "" and not any(dl.tool_calls for dl in deltas)
        assert chunks[-1].choices[0].finish_reason == "length"
        # a schema the grammar cannot hold the call to: a 400 naming the tool
        st, _, body = request(g, "POST", "/v1/chat/completions", {"model": model, "messages": ASK, "tools": TOOLS,
                                                                  "tool_choice": "required"})
        assert st == 400 and "tool 'local_time'" in body["error"]["message"], body
        st, _, body = request(g, "POST", "/v1/chat/completions", {"model": model, "messages": ASK,
                                                                  "tools": [{"type": "web_search"}]})
        assert st == 400 and "tools[0].type" in body["error"]["message"]
        st, _, body = request(g, "POST", "/v1/chat/completions", {"model": model, "messages": [
            {"role": "user", "content": "q", "name": "alice"}]})
        assert st == 400 and "messages[0].name" in body["error"]["message"]


def test_openai_tools_refused_for_a_template_without_a_convention(tmp_path):
    with serve(None, "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
               FINAL, tmp_path, "s") as d, Gateway(d.sock, tmp_path) as g:
        client, model = gateway_client(g), model_of(g)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=ASK, tools=TOOLS)
        assert "(chatml) has no tool-call convention" in str(e.value) and e.value.body["param"] == "tools"


def test_smollm2_has_no_tool_convention(model_path, tmp_path):
    """The real SmolLM2: its ChatML template has no tools, so they are refused by name; without them it serves."""
    with Daemon(model_path, tmp_path, workers=1, args=["--ctx", "1024"]) as d, Gateway(d.sock, tmp_path) as g:
        client, model = gateway_client(g), model_of(g)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=4)
        assert "(chatml) has no tool-call convention" in str(e.value)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, max_tokens=4, messages=ASK + [
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "21"}])
        assert "(chatml) has no tool-call convention" in str(e.value)
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4,
                                           temperature=0)
        assert r.choices[0].message.content and r.choices[0].message.tool_calls is None


def test_ollama_chat_tools(tmp_path):
    with serve(None, QWEN25, AUTO_CALL, tmp_path, "s") as d, \
            Gateway(d.sock, tmp_path) as g:
        model = model_of(g)
        opts = {"temperature": 0}
        st, _, one = request(g, "POST", "/api/chat", {"model": model, "messages": ASK, "tools": TOOLS, "options": opts,
                                                      "stream": False})
        assert st == 200, one
        [tc] = one["message"]["tool_calls"]
        assert tc["function"]["name"] == "get_weather" and tc["function"]["arguments"] == {"city": "Paris"}
        assert one["message"]["content"] == "" and one["done"]
        st, _, body = request(g, "POST", "/api/chat", {"model": model, "messages": ASK, "tools": TOOLS, "options": opts})
        lines = [json.loads(ln) for ln in body.decode().splitlines()]
        calls = [c for ln in lines for c in ln["message"].get("tool_calls", [])]
        assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}] and lines[-1]["done"]
        # the result goes back as ollama clients send it: arguments as an object, a tool message with tool_name
        msgs = ASK + [{"role": "assistant", "content": "", "tool_calls": [tc]},
                      {"role": "tool", "content": "21", "tool_name": "get_weather"}]
        st, _, one = request(g, "POST", "/api/chat", {"model": model, "messages": msgs, "tools": TOOLS, "options": opts,
                                                      "stream": False})
        assert st == 200 and one["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_nxctl_generate_prints_each_call_as_a_json_line(tmp_path):
    import subprocess
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    with serve(None, QWEN25, {**FINAL, **NAMED}, tmp_path, "s") as d:
        def nxctl(*args):
            return subprocess.run([str(build_dir() / "nxctl"), "--socket", d.sock, "generate", "--temp", "0", *args],
                                  capture_output=True, text=True, timeout=60)
        r = nxctl("--tools", str(tools), "--tool-choice", "get_weather", "What is the weather in Paris?")
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.splitlines()) == 1, repr(r.stdout)
        [line] = r.stdout.splitlines()
        call = json.loads(line)
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris", "unit": "celsius"}
        r = nxctl("--tools", str(tools), "What is the weather in Paris?")
        assert r.returncode == 0 and r.stdout == ANSWER + "\n", r.stderr
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        r = nxctl("--tools", str(bad), "hi")
        assert r.returncode == 2 and "--tools" in r.stderr


# --- Mistral: [TOOL_CALLS] a control token, ids of 9 characters

def _alnum9(cid):
    return len(cid) == 9 and cid.isascii() and cid.isalnum()


def test_mistral_protocol_call_result_answer(tmp_path):
    with serve(None, render.source("mistral-v3.jinja"), MISTRAL_SCRIPT, tmp_path, "m", MISTRAL_CONTROL) as d, \
            Client(d.sock) as c:
        c.send({"op": "generate", "id": 1, "messages": ASK, "tools": TOOLS, "temperature": 0})
        evs = list(c.events(1))
        assert [e["event"] for e in evs] == ["token", "token", "tool_call", "done"], evs
        assert all(e["text"] == "" for e in evs if e["event"] == "token")  # [TOOL_CALLS] is not content
        call = evs[2]["tool_call"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        assert _alnum9(call["id"]) and evs[3]["reason"] == "tool_calls"
        msgs = ASK + [{"role": "assistant", "tool_calls": [{"id": call["id"], "type": "function", "function": {
            "name": call["name"], "arguments": call["arguments"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21}'}]
        _, text, done = c.generate(messages=msgs, tools=TOOLS, temperature=0, stream=False)
        assert text == ANSWER and done["reason"] == "eos" and "tool_calls" not in done
        # the prompt is the template's own rendering of that conversation
        want = render_tools.hf_render(render.source("mistral-v3.jinja"), [ASK[0], {
            "role": "assistant", "content": None, "tool_calls": [{"id": call["id"], "function": {
                "name": "get_weather", "arguments": {"city": "Paris"}}}]}, msgs[2]], TOOLS, "<s>", "</s>")
        n_prompt = len(c.request({"op": "tokenize", "id": 9, "text": want, "special": True})["tokens"])
        assert done["usage"]["prompt_tokens"] == n_prompt
        # without tools the same answer is text: the marker's control token gives none
        _, text, done = c.generate(messages=ASK, temperature=0, stream=False)
        assert text.strip() == '[{"name": "get_weather", "arguments": {"city": "Paris"}}]' and "tool_calls" not in done
        # an id v3's template does not take is refused, as the template refuses it
        bad = json.loads(json.dumps(msgs))
        bad[1]["tool_calls"][0]["id"] = bad[2]["tool_call_id"] = "call_3f2a9c0d51e8b7a4c6d2e910"
        _, _, err = c.generate(messages=bad, tools=TOOLS)
        assert err["code"] == "bad_request" and "tool call ids of 9 characters" in err["message"]


@pytest.mark.parametrize("name", ["mistral-v3.jinja", "mistral-v3-tekken.jinja", "mistral-v7-tekken.jinja"])
def test_mistral_openai_round_trip_call_result_answer(tmp_path, name):
    """A tool call, the tool's answer, the final message - through the official openai client, with each
    Mistral template nxd renders tools for."""
    with serve(None, render.source(name), MISTRAL_SCRIPT, tmp_path, "m", MISTRAL_CONTROL) as d, \
            Gateway(d.sock, tmp_path) as g:
        client, model = gateway_client(g), model_of(g)
        for choice, args in (("auto", {"city": "Paris"}),
                             ({"type": "function", "function": {"name": "get_weather"}},
                              {"city": "Paris", "unit": "celsius"})):
            msgs = list(ASK)
            r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0,
                                               tool_choice=choice)
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls" and not ch.message.content, ch
            [tc] = ch.message.tool_calls
            assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == args
            assert _alnum9(tc.id)
            msgs.append(ch.message.model_dump(exclude_none=True))
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"temperature": 21})})
            r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0)
            assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == ANSWER
            assert r.choices[0].message.tool_calls is None
        # streamed, the call comes in OpenAI's pieces and no content
        s = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, temperature=0, stream=True)
        chunks = list(s)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(dl.content or "" for dl in deltas) == ""
        tool_deltas = [t for dl in deltas for t in (dl.tool_calls or [])]
        assert tool_deltas[0].function.name == "get_weather" and _alnum9(tool_deltas[0].id)
        assert json.loads("".join(t.function.arguments or "" for t in tool_deltas)) == {"city": "Paris"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        if name != "mistral-v7-tekken.jinja":  # v3's templates take ids of 9 characters only
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model=model, tools=TOOLS, messages=ASK + [
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                           "function": {"name": "get_weather",
                                                                                        "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "21"}])
            assert "tool call ids of 9 characters" in str(e.value)


def test_mistral_calls_are_the_same_with_speculation(tmp_path):
    with serve(None, render.source("mistral-v3-tekken.jinja"), MISTRAL_SCRIPT, tmp_path, "m", MISTRAL_CONTROL) as d, \
            Client(d.sock) as c:
        for choice in ("auto", named("get_weather")):
            outs = []
            for mode in ("off", "prompt"):
                _, text, done = c.generate(messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, stream=False,
                                           speculate={"mode": mode})
                outs.append((text, done["reason"], [(t["name"], t["arguments"]) for t in done["tool_calls"]]))
            assert outs[0] == outs[1] and outs[0][1] == "tool_calls", outs
