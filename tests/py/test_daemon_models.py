"""test_daemon_models.py - what nxd does at start with what a model file says: its chat template, its context.

Tiny models (tests/fixtures/make_tiny.py) with a byte-level vocabulary, served by
the real daemon.
"""
import pytest

import make_tiny
from nxd_helpers import Client, Daemon
from test_memory_limits import memcg  # noqa: F401  (a fixture: a child cgroup with a memory limit)

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


# ---------------------------------------------------------------- the default context

LONG = 131072  # the context a Llama 3.1 / Qwen2.5-style file declares


def ctx_of(d):
    with Client(d.sock) as c:
        return c.request({"op": "hello", "version": 1})["n_ctx"]


def test_default_context_is_the_models_where_it_fits(tmp_path):
    with Daemon(tiny(tmp_path, n_ctx=LONG), tmp_path, workers=1, args=["--slots", "1"]) as d:
        assert ctx_of(d) == LONG
        assert f"1 slots x {LONG} positions, " in d.log() and "capped" not in d.log()


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no MemAvailable in /proc/meminfo")


def test_default_context_is_capped_to_memory_available(tmp_path):
    """256 slots of 131072 positions of a 4 KiB-per-position KV cache are 128 GiB: more than any
    machine here has, so the default context is cut to what a quarter's headroom leaves; asked for
    explicitly, the same is refused naming both options."""
    avail = mem_available()
    model = tiny(tmp_path, n_ctx=LONG, n_layer=4, n_head_kv=4)  # KV: 4 layers x 2 x 256 x f16 per position
    per_pos = 4 * 2 * 256 * 2
    assert 256 * LONG * per_pos > avail
    with Daemon(model, tmp_path, workers=1, args=["--slots", "256"]) as d:
        n_ctx = ctx_of(d)
        assert 256 <= n_ctx < LONG and n_ctx % 256 == 0
        assert 256 * n_ctx * per_pos <= avail * 3 / 4 * 1.1  # MemAvailable moves a little meanwhile
        line = next(ln for ln in d.log().splitlines() if "ready:" in ln)
        assert f"256 slots x {n_ctx} positions (the model's context {LONG} capped: 256 slots of it would not " \
               "fit MemAvailable" in line, line
    d = Daemon(model, tmp_path, name="explicit", workers=1, args=["--slots", "256", "--ctx", str(LONG)])
    d.spawn()
    assert d.proc.wait(30) == 1, d.log()
    assert f"--slots 256 x --ctx {LONG}" in d.log() and "MemAvailable" in d.log(), d.log()


def test_default_context_is_capped_to_the_cgroup(tmp_path, memcg):
    wrap, name = memcg(256 << 20)
    model = tiny(tmp_path, n_ctx=LONG)  # KV: 2 layers x 2 x 128 x f16 = 1 KiB per position
    with Daemon(model, tmp_path, workers=1, wrapper=wrap) as d:
        n_ctx = ctx_of(d)
        assert 256 <= n_ctx < LONG and n_ctx % 256 == 0
        assert 4 * n_ctx * 1024 < 256 << 20
        line = next(ln for ln in d.log().splitlines() if "ready:" in ln)
        assert f"4 slots x {n_ctx} positions (the model's context {LONG} capped" in line and name in line, line
        with Client(d.sock) as c:
            toks, _, ev = c.generate(rid="g", prompt="hi", raw=True, max_tokens=3, temperature=0)
            assert ev["event"] == "done" and len(toks) == 3, ev
    d = Daemon(model, tmp_path, name="explicit", workers=1, args=["--ctx", str(LONG)], wrapper=wrap)
    d.spawn()
    assert d.proc.wait(30) == 1, d.log()
    assert f"--slots 4 x --ctx {LONG}" in d.log() and "lower --ctx or --slots" in d.log(), d.log()
