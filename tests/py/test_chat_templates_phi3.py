"""test_chat_templates_phi3.py - the Phi-3 family of chat templates (tok/chat.c) against jinja2 renderings, and the Phi / SmolLM3 templates nxd refuses.

Phi-3's templates are told by their whole text (tok/chat.c: phi3_variant), so
a respelling of the same template (escapes for newlines, literals joined by
'+', other spaces in tags) is still Phi-3's, while any change that could
render differently is "unknown". The renderings nxd must give are jinja2's
(tests/fixtures/chat_templates/render.py: hf_render), as test_chat_templates.py
checks for every family; here also the cases where Phi-3 and Phi-3.5 differ.
"""
import importlib.util

import pytest

from test_chat_templates import detect, lib, nxd_render  # noqa: F401  (lib: the fixture; puts render on the path)
import render  # noqa: E402  (tests/fixtures/chat_templates/render.py)

needs_jinja2 = pytest.mark.skipif(importlib.util.find_spec("jinja2") is None, reason="no jinja2 to render with")

PHI3 = render.source("phi3.jinja")
PHI35 = render.source("phi3.5.jinja")

CONVERSATIONS = render.CONVERSATIONS + [
    render.conv(("system", ""), ("user", "Hi")),  # Phi-3.5 leaves the empty system turn out, Phi-3 does not
    render.conv(("user", "a\n"), ("assistant", " b "), ("user", "\tc")),
]


@needs_jinja2
@pytest.mark.parametrize("src", [PHI3, PHI35], ids=["phi3", "phi3.5"])
@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_phi3_renders_as_jinja2(lib, src, i):  # noqa: F811
    msgs = CONVERSATIONS[i]
    assert detect(lib, src) == "phi3"
    got, err = nxd_render(lib, src, msgs)
    assert got is not None, err
    assert got == render.hf_render(src, msgs, "<s>", "<|endoftext|>")


@pytest.mark.parametrize("respell", [
    lambda s: s.replace("\n", "\\n"),                          # newlines as escapes inside the literals
    lambda s: s.replace("'<|user|>\n'", "'<|user|>' + '\n'"),  # literals joined by '+'
    lambda s: s.replace("{{ eos_token }}", "{{eos_token}}").replace("'", '"'),
    lambda s: s + "\n",
])
def test_a_respelled_phi3_template_is_phi3(lib, respell):  # noqa: F811
    assert detect(lib, respell(PHI3)) == "phi3"
    assert detect(lib, respell(PHI35)) == "phi3"


@pytest.mark.parametrize("change", [
    lambda s: s.replace("'<|end|>\n'}}{% elif message['role'] == 'user'", "'<|end|>'}}{% elif message['role'] == 'user'"),
    lambda s: "{{ bos_token }}" + s,
    lambda s: s.replace("{% else %}{{ eos_token }}", ""),
    lambda s: s.replace("message['content']", "message['content'] | trim"),
    lambda s: s.replace("<|assistant|>\n' }}", "<|assistant|>' }}"),
])
def test_any_other_phi_like_template_is_unknown(lib, change):  # noqa: F811
    assert detect(lib, change(PHI3)) == "unknown"


def test_phi4_and_smollm3_templates_are_refused(lib):  # noqa: F811
    phi4 = render.source("phi4.jinja")
    assert detect(lib, phi4) == "unknown"  # ChatML's markers, not its newlines
    got, err = nxd_render(lib, phi4, render.CONVERSATIONS[0])
    assert got is None and "--chat-template NAME" in err
    # SmolLM3's shape: a system turn of metadata with a /think or /no_think switch (nxd cannot render it)
    smollm3 = ("{%- if enable_thinking is not defined -%}{%- set enable_thinking = true -%}{%- endif -%}"
               "{{- '<|im_start|>system\\n' -}}{{- '## Metadata\\n\\n' -}}{%- if '/no_think' in messages[0].content -%}"
               "{%- set reasoning_mode = '/no_think' -%}{%- endif -%}{{- 'Reasoning Mode: ' + reasoning_mode -}}"
               "{%- for message in messages -%}{{ '<|im_start|>' + message.role + '\\n' + message.content + "
               "'<|im_end|>\\n' }}{%- endfor -%}{{ '<|im_start|>assistant\\n' + '<think>\\n\\n</think>\\n' }}")
    assert detect(lib, smollm3) == "unknown"


@needs_jinja2
def test_phi3_without_generation_prompt_ends_on_eos(lib):  # noqa: F811
    import ctypes
    from test_chat_templates import _Err, _Msg
    msgs = render.CONVERSATIONS[1]
    arr = (_Msg * len(msgs))(*[_Msg(m["role"].encode(), m["content"].encode()) for m in msgs])
    out, err = ctypes.c_void_p(), _Err()
    assert lib.nx_chat_render(lib.nx_chat_detect(PHI3.encode()), PHI3.encode(), arr, len(msgs), False,
                              ctypes.byref(out), ctypes.byref(err)) == 0, err.msg
    got = ctypes.string_at(out.value).decode()
    import jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    want = env.from_string(PHI3).render(messages=msgs, add_generation_prompt=False, bos_token="<s>",
                                        eos_token="<|endoftext|>")
    assert got == want
