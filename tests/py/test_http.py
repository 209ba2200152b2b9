"""test_http.py - nxd-http, the HTTP gateway, through the official openai package, curl and raw sockets."""
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

from conftest import build_dir
from http_helpers import Conn, Gateway, raw_request, request, sse_events
from nxd_helpers import Client, Daemon, pid_alive, wait_until

openai = pytest.importorskip("openai", reason="the openai package is not in the venv (tests/requirements.txt)")

PROMPT = "Write a haiku about the sea."


@pytest.fixture(scope="module")
def stack(model_path, tmp_path_factory):
    """One nxd and one nxd-http in front of it, for the tests that change neither."""
    tmp = tmp_path_factory.mktemp("http")
    with Daemon(model_path, tmp, workers=2, args=["--ctx", "2048"]) as d:
        with Gateway(d.sock, tmp, args=["--log-level", "debug"]) as g:
            yield d, g


@pytest.fixture
def client(stack):
    d, g = stack
    return openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def model_id(stack):
    d, g = stack
    st, _, body = request(g, "GET", "/v1/models")
    assert st == 200, body
    return body["data"][0]["id"]


def chat(client, model_id, **kw):
    args = dict(model=model_id, messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=32)
    args.update(kw)
    return client.chat.completions.create(**args)


def stream_text(stream):
    text, chunks, usage, finish = "", [], None, None
    for ch in stream:
        chunks.append(ch)
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            text += (c.delta.content if hasattr(c, "delta") else c.text) or ""
            finish = c.finish_reason or finish
    return text, chunks, usage, finish


# --- the protocol additions the gateway uses

def test_protocol_hello_max_tokens_and_drawn_token_logprob(model_path, tmp_path):
    with Daemon(model_path, tmp_path, workers=1, args=["--ctx", "512", "--max-tokens", "100"]) as d:
        with Client(d.sock) as c:
            h = c.request({"op": "hello", "version": 1})
            assert h["max_tokens"] == 100
            c.send({"op": "generate", "id": 1, "prompt": "Hi", "max_tokens": 6, "temperature": 1.0, "seed": 3,
                    "top_k": 0, "min_p": 0, "logprobs": 1})
            toks = [e for e in c.events(1) if e["event"] == "token"]
            assert toks
            for e in toks:
                assert "piece" in e and isinstance(e["logprob"], float) and e["logprob"] <= 0
                if e["logprobs"][0]["token"] == e["token"]:
                    assert e["logprob"] == e["logprobs"][0]["logprob"]
                    assert e["piece"] == e["logprobs"][0]["text"]
            c.send({"op": "generate", "id": 2, "prompt": "Hi", "max_tokens": 3})
            assert all("piece" not in e for e in c.events(2))


# --- the OpenAI API through the openai package

def test_chat_non_streamed(client, model_id):
    r = chat(client, model_id)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == model_id
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 5 and 0 < u.completion_tokens <= 32
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_chat_streamed_matches_non_streamed(client, model_id):
    full = chat(client, model_id, max_tokens=40)
    s = chat(client, model_id, max_tokens=40, stream=True, stream_options={"include_usage": True})
    text, chunks, usage, finish = stream_text(s)
    assert text == full.choices[0].message.content
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.id == chunks[0].id for ch in chunks)
    assert finish == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and usage.completion_tokens == full.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # without include_usage: no usage chunk
    text2, chunks2, usage2, _ = stream_text(chat(client, model_id, max_tokens=40, stream=True))
    assert text2 == text and usage2 is None and all(ch.choices for ch in chunks2)


def test_chat_content_parts_and_roles(client, model_id):
    a = chat(client, model_id, messages=[{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": PROMPT}])
    b = chat(client, model_id, messages=[{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                         {"role": "user", "content": [{"type": "text", "text": PROMPT}]}])
    assert a.choices[0].message.content == b.choices[0].message.content
    c = chat(client, model_id, messages=[{"role": "user", "content": "Say hi."},
                                         {"role": "assistant", "content": "Hi!"},
                                         {"role": "user", "content": "Again."}])
    assert c.choices[0].message.content


def test_length_and_max_completion_tokens(client, model_id):
    r = chat(client, model_id, max_tokens=None, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_stop(client, model_id):
    full = chat(client, model_id, max_tokens=40).choices[0].message.content
    word = full.split()[3]
    for stop in (word, [word, "zzzz"]):
        r = chat(client, model_id, max_tokens=40, stop=stop)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"
        assert word not in text and full.startswith(text)
        st, _, _, finish = stream_text(chat(client, model_id, max_tokens=40, stop=stop, stream=True))
        assert st == text and finish == "stop"


def test_seed_reproducible(client, model_id):
    kw = dict(temperature=1.0, max_tokens=24)
    a = chat(client, model_id, seed=1234, **kw).choices[0].message.content
    b = chat(client, model_id, seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {chat(client, model_id, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # sampling at temperature 1 does vary with the seed


def test_logprobs(client, model_id):
    r = chat(client, model_id, max_tokens=12, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 3
        assert e.token == e.top_logprobs[0].token and e.logprob == e.top_logprobs[0].logprob  # greedy
        assert bytes(e.bytes) == e.token.encode()
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1.0001
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    # logprobs without alternatives, and streamed
    r0 = chat(client, model_id, max_tokens=12, logprobs=True)
    assert [e.logprob for e in r0.choices[0].logprobs.content] == [e.logprob for e in content]
    assert all(e.top_logprobs == [] for e in r0.choices[0].logprobs.content)
    lps = []
    for ch in chat(client, model_id, max_tokens=12, logprobs=True, top_logprobs=3, stream=True):
        for c in ch.choices:
            if c.logprobs and c.logprobs.content:
                lps += c.logprobs.content
    assert [e.token for e in lps] == [e.token for e in content]
    assert chat(client, model_id, max_tokens=4).choices[0].logprobs is None


def test_completions(client, model_id, stack):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"
    # default max_tokens is OpenAI's 16
    assert client.completions.create(model=model_id, prompt="Once upon a time", temperature=0).usage.completion_tokens == 16
    text, chunks, usage, finish = stream_text(client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert text == r.choices[0].text and finish == "length" and usage.completion_tokens == 8
    # a token-array prompt is the same prompt
    st, _, toks = request(stack[1], "POST", "/tokenize", {"prompt": "The capital of France is", "model": model_id})
    assert st == 200 and toks["count"] == len(toks["tokens"])
    r2 = client.completions.create(model=model_id, prompt=toks["tokens"], max_tokens=8, temperature=0)
    assert r2.choices[0].text == r.choices[0].text
    lp = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=4, temperature=0,
                                   logprobs=2).choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.top_logprobs[0]) == 2 and lp.text_offset[0] == 0
    assert lp.token_logprobs[0] == max(lp.top_logprobs[0].values())


def test_tokenize_detokenize_models(stack, model_id):
    d, g = stack
    st, _, t = request(g, "POST", "/tokenize", {"prompt": "Hello world", "add_special_tokens": False})
    with Client(d.sock) as c:
        assert t["tokens"] == c.request({"op": "tokenize", "id": 1, "text": "Hello world"})["tokens"]
    st, _, t2 = request(g, "POST", "/detokenize", {"tokens": t["tokens"]})
    assert st == 200 and t2["prompt"] == "Hello world"
    st, _, e = request(g, "POST", "/detokenize", {"tokens": [10 ** 9]})
    assert st == 400 and "tokens[0]" in e["error"]["message"]
    st, _, m = request(g, "GET", "/v1/models/" + urllib.parse.quote(model_id))
    assert st == 200 and m["id"] == model_id and m["object"] == "model"
    st, _, m = request(g, "GET", "/v1/models/nope")
    assert st == 404 and m["error"]["code"] == "model_not_found"


def test_errors_are_openai_errors(client, model_id, stack):
    d, g = stack
    cases = [
        (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (dict(n=2), "n"),
        (dict(temperature=3), "temperature"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(stream_options={"include_usage": True}), "stream_options"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(stop=["x"] * 9), "stop"),
        (dict(messages=[{"role": "tool", "content": "x"}]), "messages"),
        (dict(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages[0].name"),
        (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages[0].content"),
        (dict(messages=[]), "messages"),
        (dict(seed=-1), "seed"),
        (dict(logit_bias={"1": 5}), "logit_bias"),
        (dict(response_format={"type": "json_object"}), "response_format"),
        (dict(user="bob"), "user"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as ei:
            chat(client, model_id, **kw)
        e = ei.value
        assert e.status_code == 400 and e.body["param"] == param, (kw, e.body)
        assert param.split("[")[0].split(".")[0] in e.body["message"], (kw, e.body)
        assert e.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as ei:
        chat(client, "no-such-model")
    assert ei.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=["a", "b"])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt="x", echo=True)
    # a prompt longer than the context (2048 tokens)
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=model_id, prompt=list(range(100, 2200)))
    assert "context" in ei.value.body["message"]
    # HTTP-level errors
    st, _, e = request(g, "POST", "/v1/chat/completions", b"{not json")
    assert st == 400 and "not valid JSON" in e["error"]["message"]
    st, _, e = request(g, "POST", "/v1/chat/completions", b'{"model":"a","model":"b"}')
    assert st == 400
    st, _, e = request(g, "POST", "/v1/nothing", {})
    assert st == 404 and e["error"]["type"] == "invalid_request_error"
    st, hd, e = request(g, "GET", "/v1/chat/completions")
    assert st == 405
    st, _, e = request(g, "POST", "/v1/chat/completions", b"x" * ((1 << 20) + 1))
    assert st == 413 and e["error"]["code"] == "body_too_large"
    with pytest.raises(openai.APIStatusError) as ei:
        chat(client, model_id, messages=[{"role": "user", "content": "x" * (1 << 20)}])
    assert ei.value.status_code == 413


def test_greedy_equals_nxctl(stack, client, model_id):
    d, g = stack
    env = dict(os.environ, NXD_SOCKET=d.sock)
    for prompt, n in ((PROMPT, 48), ("List three colors.", 24)):
        out = subprocess.run([str(build_dir() / "nxctl"), "generate", "--temp", "0", "--max-tokens", str(n),
                              "--raw-output", prompt], capture_output=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        want = out.stdout.decode().rstrip("\n")
        r = chat(client, model_id, messages=[{"role": "user", "content": prompt}], max_tokens=n)
        assert r.choices[0].message.content == want
        text, _, _, _ = stream_text(chat(client, model_id, messages=[{"role": "user", "content": prompt}],
                                         max_tokens=n, stream=True))
        assert text == want
    # token for token: the pieces of the HTTP answer are nxd's own tokens
    r = chat(client, model_id, max_tokens=24, logprobs=True)
    with Client(d.sock) as c:
        toks, text, done = c.generate(rid=1, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=1)
    assert r.choices[0].message.content == text
    with Client(d.sock) as c:
        pieces = c.request({"op": "detokenize", "id": 2, "tokens": toks})["text"]
    assert "".join(e.token for e in r.choices[0].logprobs.content) == pieces
    assert r.usage.completion_tokens == len(toks)
