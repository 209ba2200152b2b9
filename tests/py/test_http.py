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
from http_helpers import Conn, Gateway, nxd_behind_gateway, raw_request, request, sse_events
from nxd_helpers import Client, Daemon, pid_alive, wait_until

openai = pytest.importorskip("openai", reason="the openai package is not in the venv (tests/requirements.txt)")

PROMPT = "Write a haiku about the sea."


@pytest.fixture(scope="module")
def stack(model_path, tmp_path_factory):
    """One nxd and one nxd-http in front of it, for the tests that change neither."""
    tmp = tmp_path_factory.mktemp("http")
    with nxd_behind_gateway(model_path, tmp, 2048, ["--log-level", "debug"]) as stack:
        yield stack


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


def test_ignore_eos(client, model_id):
    """vLLM's and llama-server's ignore_eos: exactly max_tokens, past the end-of-sequence token (benchmarks
    and load tests need answers of one length)."""
    msgs = [{"role": "user", "content": "Say hi."}]
    short = chat(client, model_id, messages=msgs, max_tokens=64)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 64
    r = chat(client, model_id, messages=msgs, max_tokens=64, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 64 and r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content.startswith(short.choices[0].message.content)
    s = client.completions.create(model=model_id, prompt="Hi", max_tokens=40, temperature=0, stream=True,
                                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    assert stream_text(s)[2].completion_tokens == 40
    with pytest.raises(openai.BadRequestError) as ei:
        chat(client, model_id, messages=msgs, extra_body={"ignore_eos": "yes"})
    assert ei.value.body["param"] == "ignore_eos"


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


LOGPROB_LITERAL = re.compile(rb'"logprob":(-?[0-9][0-9.eE+-]*)')


def test_logprobs_are_written_as_nxd_wrote_them(stack, model_id):
    """The logprobs of an answer, streamed or not, are the literals nxd wrote (9 digits of a float),
    not the double they parse to printed with 17 digits."""
    d, g = stack
    with Client(d.sock) as c:
        c.send({"op": "generate", "id": 1, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 2})
        want, line = [], c.recv_line()
        while b'"event":"done"' not in line:
            want += LOGPROB_LITERAL.findall(line)
            line = c.recv_line()
    assert len(want) == 12 * 3
    assert any(len(v.lstrip(b"-").replace(b".", b"").lstrip(b"0")) > 3 for v in want)  # not all short numbers
    body = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 12,
            "logprobs": True, "top_logprobs": 2}
    with Conn(g, 60) as conn:
        conn.send(raw_request("POST", "/v1/chat/completions", body, {"Connection": "close"}))
        st, _, raw = conn.read_response(60)
    assert st == 200, raw
    assert LOGPROB_LITERAL.findall(raw) == want
    with Conn(g, 60) as conn:
        conn.send(raw_request("POST", "/v1/chat/completions", dict(body, stream=True), {"Connection": "close"}))
        st, _, raw = conn.read_response(60)
    assert st == 200, raw
    assert LOGPROB_LITERAL.findall(raw) == want


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
    # text_offset counts characters, as OpenAI's offsets into the text do: each token's text is found there
    r = client.completions.create(model=model_id, prompt='The French word for coffee is "caf', max_tokens=8,
                                  temperature=0, logprobs=1)
    text, lp = r.choices[0].text, r.choices[0].logprobs
    assert "".join(lp.tokens) == text and any(ord(ch) > 127 for ch in text), text
    assert [text[o:o + len(t)] for o, t in zip(lp.text_offset, lp.tokens)] == lp.tokens, (text, lp.text_offset)


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
        (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),  # SmolLM2's template has none
        (dict(n=2), "n"),
        (dict(temperature=3), "temperature"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(stream_options={"include_usage": True}), "stream_options"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(stop=["x"] * 9), "stop"),
        (dict(messages=[{"role": "function", "content": "x"}]), "messages"),
        (dict(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages[0].name"),
        (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages[0].content"),
        (dict(messages=[]), "messages"),
        (dict(seed=-1), "seed"),
        (dict(logit_bias={"1": 5}), "logit_bias"),
        (dict(response_format={"type": "xml"}), "response_format"),
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
    for name in ("", "m" * 200):  # no adapter can have such a name: still the model that is not there
        with pytest.raises(openai.NotFoundError) as ei:
            chat(client, name)
        assert ei.value.body["code"] == "model_not_found" and ei.value.body["param"] == "model", ei.value.body
        st, _, e = request(g, "POST", "/api/chat", {"model": name, "messages": [{"role": "user", "content": "x"}]})
        assert st == 404 and e == {"error": f"model '{name}' not found"}, e
    # a client's value quoted in the message and cut inside a UTF-8 character is still a 400 naming the field
    for body, param in (({"response_format": {"type": "a" + "é" * 40}}, "response_format"),
                        ({"ab" + "é" * 200: 1}, "ab")):
        st, _, e = request(g, "POST", "/v1/chat/completions",
                           dict({"model": model_id, "messages": [{"role": "user", "content": "x"}]}, **body))
        assert st == 400 and e["error"]["param"].startswith(param), e
    st, _, e = request(g, "POST", "/api/chat", {"model": model_id, "messages": [{"role": "user", "content": "x"}],
                                                "format": "日本語のフォーマット形式です" * 2})
    assert st == 400 and "format" in e["error"], e
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=["a", "b"])
    st, _, e = request(g, "POST", "/v1/completions", {"model": model_id, "prompt": [1.5, 2.0]})
    assert st == 400 and "token ids (integers)" in e["error"]["message"], e
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt="x", echo=True)
    # a prompt longer than the context (2048 tokens)
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=model_id, prompt=list(range(100, 2200)))
    assert "context" in ei.value.body["message"]
    assert ei.value.body["code"] == "context_length_exceeded" and ei.value.body["param"] == "prompt", ei.value.body
    with pytest.raises(openai.BadRequestError) as ei:  # OpenAI's code: clients that trim a chat's history look for it
        chat(client, model_id, messages=[{"role": "user", "content": "sea " * 3000}])
    assert ei.value.body["code"] == "context_length_exceeded" and ei.value.body["param"] == "messages", ei.value.body
    # HTTP-level errors
    st, _, e = request(g, "POST", "/v1/chat/completions", b"{not json")
    assert st == 400 and "not valid JSON" in e["error"]["message"]
    st, _, e = request(g, "POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"a\\u0000b"}]}')
    assert st == 400 and "\\u0000 (NUL)" in e["error"]["message"] and "JSON_" not in e["error"]["message"], e
    st, _, e = request(g, "POST", "/v1/chat/completions", b'{"model":"a","model":"b"}')
    assert st == 400
    st, _, e = request(g, "POST", "/v1/nothing", {})
    assert st == 404 and e["error"]["type"] == "invalid_request_error"
    st, hd, e = request(g, "GET", "/v1/chat/completions")
    assert st == 405 and hd.get("allow") == "POST", hd
    st, hd, e = request(g, "POST", "/health", {})
    assert st == 405 and hd.get("allow") == "GET, HEAD", hd
    st, _, e = request(g, "POST", "/api/pull", {"model": model_id})  # ollama's clients read {"error": "..."}
    assert st == 404 and isinstance(e["error"], str) and "/api/pull" in e["error"], e
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


# --- curl

def test_curl(stack, model_id):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    d, g = stack
    body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                       "max_tokens": 16})
    out = subprocess.run(["curl", "-sS", "--fail-with-body", g.url + "/v1/chat/completions",
                          "-H", "Content-Type: application/json", "-d", body], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    full = json.loads(out.stdout)["choices"][0]["message"]["content"]
    sbody = json.loads(body)
    sbody["stream"] = True
    out = subprocess.run(["curl", "-sSN", g.url + "/v1/chat/completions", "-d", json.dumps(sbody)],
                         capture_output=True, timeout=60)
    ev = sse_events(out.stdout)
    assert ev[-1] == "[DONE]" and ev[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in ev[:-1]) == full
    # keep-alive: two requests, one connection
    out = subprocess.run(["curl", "-sSv", g.url + "/health", g.url + "/v1/models"], capture_output=True, timeout=60)
    assert out.returncode == 0 and b"Re-using existing connection" in out.stderr, out.stderr
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", g.url + "/v1/chat/completions",
                          "-d", "{"], capture_output=True, timeout=60)
    assert out.stdout == b"400"


# --- malformed HTTP on raw sockets

def greedy_ref(d):
    with Client(d.sock) as c:
        return c.generate(rid=1, prompt=PROMPT, max_tokens=24, temperature=0)[1]


def test_malformed_http(stack, model_id):
    d, g = stack
    ref = greedy_ref(d)
    cases = [
        (b"GET /health HTTP/1.1\r\n\r\n", 400),                         # no Host
        (b"GET /health\r\n\r\n", 400),                                  # no version
        (b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 505),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
        (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
        (b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 40000 + b"\r\n\r\n", 431),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1234567890\r\n" % i for i in range(2000)) + b"\r\n",
         431),
        # --max-header (16 KiB) is the limit, not the larger pool libmicrohttpd reads them into
        (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", 400),
        (raw_request("POST", "/tokenize", b"x" * 2000000), 413),
        (raw_request("POST", "/tokenize", b"[1]"), 400),
    ]
    for data, want in cases:
        with Conn(g) as c:
            c.send(data)
            st, hd, body = c.read_response()
            assert st == want, (data[:60], st, body[:200])
    # Content-Length headers that differ: where the body ends is not known, so the connection closes
    with Conn(g) as c:
        c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x")
        st, hd, _ = c.read_response()
        assert st == 400 and hd.get("connection") == "close" and c.closed_by_peer(5), hd
    # A request line libmicrohttpd cannot split into method, target and version closes the connection.
    for data in (b"GARBAGE\r\n\r\n", b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n"):
        with Conn(g) as c:
            c.send(data)
            assert c.closed_by_peer(5)
    # A chunked body
    with Conn(g) as c:
        body = json.dumps({"prompt": "Hello world"}).encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 5]), body[i:i + 5]) for i in range(0, len(body), 5))
        c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
        st, _, b = c.read_response()
        assert st == 200 and json.loads(b)["count"] >= 2
        # and a chunked body over the limit: 413 (no Content-Length to refuse it by)
        c2 = Conn(g)
        c2.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(17):
            c2.send(b"10000\r\n" + b"x" * 65536 + b"\r\n")
        c2.send(b"0\r\n\r\n")
        st, _, _ = c2.read_response()
        assert st == 413
        c2.close()
    # Pipelining: three requests in one write, three answers in order.
    with Conn(g) as c:
        c.send(raw_request("POST", "/tokenize", {"prompt": "a"}) + raw_request("GET", "/v1/models") +
               raw_request("POST", "/detokenize", {"tokens": [19556]}))
        st1, _, b1 = c.read_response()
        st2, _, b2 = c.read_response()
        st3, _, b3 = c.read_response()
        assert (st1, st2, st3) == (200, 200, 200)
        assert "tokens" in json.loads(b1) and json.loads(b2)["object"] == "list" and "prompt" in json.loads(b3)
    assert g.alive() and pid_alive(d.pid)
    assert greedy_ref(d) == ref


def test_slowloris_and_many_connections(model_path, tmp_path):
    with Daemon(model_path, tmp_path, workers=2, args=["--ctx", "1024"]) as d, \
            Gateway(d.sock, tmp_path, args=["--header-timeout", "2", "--body-timeout", "2",
                                            "--max-connections", "300"]) as g:
        ref = greedy_ref(d)
        # 300 connections open and idle: a normal client is still served at once...
        idle = [Conn(g) for _ in range(299)]
        t0 = time.time()
        st, _, body = request(g, "GET", "/health")
        assert st == 200 and time.time() - t0 < 1
        # ...and past --max-connections a new one gets a clear 503, then is closed.
        with Conn(g) as extra, Conn(g) as c:
            c.send(raw_request("GET", "/health"))
            st, hd, body = c.read_response()
            assert st == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
            assert hd.get("connection") == "close"
        for c in idle:
            c.close()
        # 20 clients dripping a header byte every half second (slowloris)
        drip = [Conn(g) for _ in range(20)]
        for c in drip:
            c.send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        for _ in range(3):
            assert request(g, "GET", "/health")[0] == 200
            for c in drip:
                try:
                    c.send(b"a")
                except OSError:
                    pass
            time.sleep(0.5)
        # past the header deadline: a 408 for each, then the connection is closed
        for c in drip:
            st, hd, _ = c.read_response(timeout=10)
            assert st == 408 and hd.get("connection") == "close"
            assert c.closed_by_peer(5)
            c.close()
        # A slow body gets a 408 too.
        with Conn(g) as c:
            c.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            st, _, _ = c.read_response(timeout=10)
            assert st == 408
        wait_until(lambda: request(g, "GET", "/health")[0] == 200, timeout=10, what="served again")
        assert greedy_ref(d) == ref and g.alive()


# --- cancels, faults, the sandbox

def slots_used(d):
    return d.status()["slots"]["used"]


def test_disconnect_mid_stream_cancels(stack, model_id):
    d, g = stack
    c = Conn(g)
    c.send(raw_request("POST", "/v1/chat/completions",
                       {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
                        "max_tokens": 1500, "temperature": 1.0, "seed": 1, "top_k": 0}))
    c.s.settimeout(30)
    got = b""
    while got.count(b"data: ") < 5:
        got += c.s.recv(4096)
    assert slots_used(d) == 1
    c.close()
    wait_until(lambda: slots_used(d) == 0, timeout=2, what="the slot freed after the client left")
    # and a client that hangs up while its prompt waits or computes (connection suspended)
    c = Conn(g)
    c.send(raw_request("POST", "/v1/completions", {"model": model_id, "prompt": "word " * 1000, "max_tokens": 1000,
                                                    "temperature": 1.0, "seed": 1, "top_k": 0}))
    time.sleep(0.05)
    c.close()
    wait_until(lambda: slots_used(d) == 0 and d.status()["slots"]["queued"] == 0, timeout=3,
               what="the slot freed after a non-streamed client left")


def test_worker_killed_mid_sse_stream(stack, client, model_id):
    d, g = stack
    kw = dict(max_tokens=120, messages=[{"role": "user", "content": "Tell me a long story about a dragon."}])
    want = chat(client, model_id, **kw).choices[0].message.content
    victim = d.worker_pids()[1]
    text, n = "", 0
    for ch in chat(client, model_id, stream=True, **kw):
        for c in ch.choices:
            text += c.delta.content or ""
        n += 1
        if n == 10:
            os.kill(victim, signal.SIGKILL)
    assert text == want
    wait_until(lambda: victim not in d.worker_pids(), timeout=10, what="the worker respawned")
    assert d.status()["steps_retried"] >= 1


def proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(ln.split(":\t", 1) for ln in f.read().splitlines() if ":\t" in ln)


def test_sandbox_is_applied(stack):
    d, g = stack
    st = proc_status(g.pid)
    assert st["Seccomp"].strip() == "2" and st["NoNewPrivs"].strip() == "1"
    assert "sandbox: seccomp filter on" in g.log()


def test_gateway_syscalls(model_path, tmp_path):
    """The allowlist (http/sandbox.c) holds every syscall the gateway makes after start-up."""
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    src = (build_dir().parent / "http" / "sandbox.c").read_text() if (build_dir().parent / "http").is_dir() else \
        open(os.path.join(os.path.dirname(__file__), "..", "..", "http", "sandbox.c")).read()
    allowed = set(re.findall(r"SCMP_SYS\((\w+)\)", src))
    with Daemon(model_path, tmp_path, workers=1, args=["--ctx", "512"]) as d:
        trace = tmp_path / "strace.txt"
        gw = Gateway(d.sock, tmp_path, args=["--no-sandbox"],
                     wrapper=["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=all"])
        with gw as g:
            c = openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0)
            mid = c.models.list().data[0].id
            c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
            list(c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                           stream=True))
            request(g, "GET", "/metrics")
            request(g, "GET", "/health")
            with Conn(g) as cc:  # a client that leaves mid-stream
                cc.send(raw_request("POST", "/v1/completions", {"model": mid, "prompt": "a", "max_tokens": 200,
                                                                "stream": True}))
                cc.s.recv(100)
            # SIGTERM to the gateway itself (strace would only detach)
            gpid = int(trace.read_text().split(None, 1)[0])
            os.kill(gpid, signal.SIGTERM)
            g.proc.wait(20)
        lines = trace.read_text().splitlines()
        start = next(i for i, ln in enumerate(lines) if 'write(2, "nxd-http: info: listening on' in ln)
        used = set()
        for ln in lines[start + 1:]:
            m = re.match(r"\d+\s+(\w+)\(", ln)
            if m:
                used.add(m.group(1))
        used -= {"exit_group", "rt_sigreturn"}
        used.discard("epoll_pwait") if "epoll_pwait" in allowed else None
        assert used <= allowed | {"socket", "mmap", "mprotect"}, used - allowed


def test_gateway_crash_leaves_nxd_and_its_clients_untouched(stack, client, model_id):
    """docs/reliability.md 32: HTTP runs in its own process; killing it mid-stream touches nothing else."""
    d, g0 = stack
    ref = greedy_ref(d)
    with Gateway(d.sock, g0.dir, name="nxd-http-victim") as g:
        c = Conn(g)
        c.send(raw_request("POST", "/v1/chat/completions",
                           {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
                            "max_tokens": 1000, "temperature": 1.0, "top_k": 0}))
        with Client(d.sock) as sc:
            sc.send({"op": "generate", "id": 7, "prompt": PROMPT, "max_tokens": 24, "temperature": 0})
            got = c.s.recv(4096)
            g.proc.kill()
            g.proc.wait()
            toks, text = [], ""
            for ev in sc.events(7):
                if ev["event"] == "token":
                    text += ev["text"]
            assert ev["event"] == "done" and text == ref
        c.close()
    wait_until(lambda: slots_used(d) == 0, timeout=3, what="the killed gateway's slot freed")
    assert pid_alive(d.pid) and greedy_ref(d) == ref


# --- keys, binding, nxd away

def test_api_keys_and_admin(model_path, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# clients\nsk-one\n  sk-two  \n")
    admin = tmp_path / "admin"
    admin.write_text("adm-1\n")
    with Daemon(model_path, tmp_path, workers=1, args=["--ctx", "512"]) as d:
        with Gateway(d.sock, tmp_path, args=["--api-key-file", str(keys)]) as g:
            st, hd, e = request(g, "GET", "/v1/models")
            assert st == 401 and e["error"]["code"] == "invalid_api_key" and hd["www-authenticate"] == "Bearer"
            for key in ("sk-on", "sk-one1", "SK-ONE", "x" * 300):
                c = openai.OpenAI(base_url=g.url + "/v1", api_key=key, max_retries=0)
                with pytest.raises(openai.AuthenticationError) as ei:
                    c.models.list()
                assert ei.value.body["code"] == "invalid_api_key"
            for key in ("sk-one", "sk-two"):
                assert openai.OpenAI(base_url=g.url + "/v1", api_key=key, max_retries=0).models.list().data
            st, _, _ = request(g, "GET", "/health")
            assert st == 200  # a load balancer's check needs no key
            st, _, _ = request(g, "GET", "/metrics")
            assert st == 401
            # no admin key file: the admin endpoints do not exist, whatever the key
            st, _, e = request(g, "POST", "/admin/shutdown", {}, headers={"Authorization": "Bearer sk-one"})
            assert st == 404
        with Gateway(d.sock, tmp_path, name="gw-admin", args=["--api-key-file", str(keys),
                                                               "--admin-key-file", str(admin)]) as g:
            st, _, e = request(g, "POST", "/admin/shutdown", {}, headers={"Authorization": "Bearer sk-one"})
            assert st == 401
            st, _, e = request(g, "POST", "/admin/lora/unload", {"name": "x", "extra": 1},
                               headers={"Authorization": "Bearer adm-1"})
            assert st == 400 and e["error"]["param"] == "extra"
            st, _, e = request(g, "POST", "/admin/lora/unload", {"name": "x"}, headers={"Authorization": "Bearer adm-1"})
            assert st == 404 and e["error"]["code"] == "not_found"
            st, _, e = request(g, "POST", "/admin/shutdown", {}, headers={"Authorization": "Bearer adm-1"})
            assert st == 200 and e["event"] == "ok"
            assert d.proc.wait(15) == 0


def test_key_comparison_is_constant_time():
    """The comparison reads every key over its whole padded length (http/keys.c)."""
    src = open(os.path.join(os.path.dirname(__file__), "..", "..", "http", "keys.c")).read()
    body = src[src.index("static unsigned diff_key"):src.index("bool nxh_keys_match")]
    assert "for (size_t i = 0; i <= NXH_MAX_KEY; i++)" in body and "return" not in body.split("{", 1)[1][:-40]


def test_binds_loopback_by_default_and_ipv6(model_path, tmp_path):
    out = subprocess.run([str(build_dir() / "nxd-http"), "--help"], capture_output=True, text=True)
    assert "default 127.0.0.1:8080" in out.stdout
    with Daemon(model_path, tmp_path, workers=1, args=["--ctx", "512"]) as d:
        g = Gateway(d.sock, tmp_path, listen="[::1]:0", name="gw6")
        try:
            g.start()
        except Exception as e:
            pytest.skip(f"no IPv6 loopback here: {e}")
        try:  # started already: `with g` would start a second one
            assert g.host == "[::1]"
            st, _, body = request(g, "GET", "/health")
            assert st == 200
        finally:
            g.stop()
        bad = subprocess.run([str(build_dir() / "nxd-http"), "--listen", "localhost"], capture_output=True, text=True)
        assert bad.returncode == 2 and "ADDR:PORT" in bad.stderr


def test_nxd_unreachable_busy_and_back(model_path, tmp_path):
    sock = tmp_path / "nxd.sock"
    with Gateway(sock, tmp_path, args=["--upstream-timeout", "2"]) as g:
        c = openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as ei:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert ei.value.status_code == 503 and ei.value.body["code"] == "nxd_unreachable"
        st, _, body = request(g, "GET", "/health")
        assert st == 503 and "unreachable" in body["reason"]
        st, _, body = request(g, "GET", "/metrics")
        assert st == 200 and b"nxd_up 0" in body
        with Daemon(model_path, tmp_path, workers=1, socket_path=sock,
                    args=["--ctx", "512", "--slots", "1", "--max-queue", "1"]) as d:
            assert request(g, "GET", "/health")[0] == 200
            mid = c.models.list().data[0].id
            # one generating, one queued: the third is busy, a 429
            body = {"model": mid, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400,
                    "temperature": 1.0, "seed": 5, "top_k": 0, "stream": True}
            c1, c2 = Conn(g), Conn(g)
            c1.send(raw_request("POST", "/v1/chat/completions", body))
            c1.s.recv(100)
            c2.send(raw_request("POST", "/v1/chat/completions", body))
            wait_until(lambda: d.status()["slots"]["queued"] == 1, timeout=5, what="one queued")
            with pytest.raises(openai.RateLimitError) as ei:
                c.chat.completions.create(model=mid, messages=[{"role": "user", "content": "x"}], max_tokens=2)
            assert ei.value.status_code == 429 and ei.value.body["code"] == "rate_limit_exceeded"
            c1.close()
            c2.close()
            wait_until(lambda: d.status()["slots"]["used"] == 0 and d.status()["slots"]["queued"] == 0, timeout=5,
                       what="both cancelled")
            long = dict(model=mid, messages=[{"role": "user", "content": PROMPT}], max_tokens=400, temperature=1.0,
                        seed=5, extra_body={"top_k": 0}, stream=True)
            # nxd stopping mid-stream: the stream ends with an error, never as if complete
            s3 = c.chat.completions.create(**long)
            it = iter(s3)
            next(it)
            d.proc.send_signal(signal.SIGTERM)
            with pytest.raises(openai.APIError):
                for _ in it:
                    pass
            d.proc.wait(15)
        st, _, body = request(g, "GET", "/health")
        assert st == 503
        assert g.alive()


def test_presence_and_frequency_penalties(stack, client, model_id):
    """Implemented in nxd's sampler (tests/c/test_sampler.c checks the arithmetic): through HTTP they change
    greedy text as the same request on the socket does, and out-of-range values are a 400 naming the field."""
    d, g = stack
    prompt = PROMPT
    base = chat(client, model_id, messages=[{"role": "user", "content": prompt}], max_tokens=48)
    for kw in (dict(frequency_penalty=1.5), dict(presence_penalty=2.0)):
        r = chat(client, model_id, messages=[{"role": "user", "content": prompt}], max_tokens=48, **kw)
        with Client(d.sock) as c:
            _, text, _ = c.generate(rid=1, messages=[{"role": "user", "content": prompt}], max_tokens=48,
                                    temperature=0, **kw)
        assert r.choices[0].message.content == text
        assert text != base.choices[0].message.content
    for field in ("presence_penalty", "frequency_penalty"):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(client, model_id, **{field: 2.5})
        assert ei.value.body["param"] == field


def metric(text, name, labels=""):
    m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_metrics(stack, client, model_id):
    d, g = stack
    st, hd, before = request(g, "GET", "/metrics")
    assert st == 200 and hd["content-type"].startswith("text/plain; version=0.0.4")
    before = before.decode()
    r = chat(client, model_id, max_tokens=8)
    list(chat(client, model_id, max_tokens=8, stream=True))
    with pytest.raises(openai.BadRequestError):
        chat(client, model_id, n=3)
    st, _, after = request(g, "GET", "/metrics")
    t = after.decode()
    ok = 'nxd_http_requests_total{endpoint="chat_completions",status="200"}'
    assert metric(t, ok) - (metric(before, ok) or 0) == 2
    assert metric(t, 'nxd_http_requests_total{endpoint="chat_completions",status="400"}') >= 1
    assert metric(t, "nxd_http_completion_tokens_total") - metric(before, "nxd_http_completion_tokens_total") == \
        r.usage.completion_tokens + 8
    assert metric(t, "nxd_http_prompt_tokens_total") > 0
    assert metric(t, "nxd_http_time_to_first_token_seconds_count") >= 2
    assert metric(t, 'nxd_http_time_to_first_token_seconds_bucket{le="+Inf"}') == \
        metric(t, "nxd_http_time_to_first_token_seconds_count")
    assert metric(t, "nxd_http_time_per_output_token_seconds_count") >= 14
    st = d.status()
    assert metric(t, "nxd_up") == 1
    assert metric(t, "nxd_slots") == st["slots"]["total"]
    assert metric(t, "nxd_queue_length") == 0 and metric(t, "nxd_slots_in_use") is not None
    assert metric(t, "nxd_steps_retried_total") == st["steps_retried"]
    assert metric(t, 'nxd_worker_restarts_total{worker="0"}') is not None
    # Every sample line is NAME{labels} VALUE, every family has HELP and TYPE.
    for ln in t.splitlines():
        assert ln.startswith("# HELP ") or ln.startswith("# TYPE ") or \
            re.match(r'^[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+inf]+$', ln), ln


def test_metrics_profile_phases(model_path, tmp_path):
    with Daemon(model_path, tmp_path, workers=1, args=["--ctx", "512"], env={"NXD_PROFILE": "1"}) as d, \
            Gateway(d.sock, tmp_path) as g:
        with Client(d.sock) as c:
            c.generate(rid=1, prompt="Hi", max_tokens=8, temperature=0)
        st, _, t = request(g, "GET", "/metrics")
        assert 'nxd_step_phase_milliseconds{phase="matmul"}' in t.decode()


# --- the ollama API's core

def test_ollama_api(stack, client, model_id):
    d, g = stack
    st, _, v = request(g, "GET", "/api/version")
    assert st == 200 and v["version"]
    st, _, tags = request(g, "GET", "/api/tags")
    assert st == 200 and tags["models"][0]["name"] == model_id and tags["models"][0]["details"]["format"] == "gguf"
    st, _, ps = request(g, "GET", "/api/ps")
    assert st == 200 and ps["models"][0]["model"] == model_id
    # what `ollama run` and `ollama show` ask first: the served context, and no tools on SmolLM2's template
    st, _, show = request(g, "POST", "/api/show", {"model": model_id + ":latest"})
    assert st == 200 and show["model_info"] == {"general.architecture": "llama", "llama.context_length": 2048}, show
    assert show["capabilities"] == ["completion"] and show["details"]["quantization_level"] == "Q4_1", show
    st, _, e = request(g, "POST", "/api/show", {"model": "nope"})
    assert st == 404 and e == {"error": "model 'nope' not found"}, e
    # ollama's load: a generate without a prompt, a chat without messages (ollama run sends one first);
    # keep_alive is kept to (the model never unloads) but for 0, an unload nxd cannot do
    for path, body in (("/api/generate", {"prompt": "", "keep_alive": "10m"}), ("/api/generate", {}),
                       ("/api/chat", {"messages": [], "keep_alive": -1})):
        st, _, ld = request(g, "POST", path, dict(body, model=model_id + ":latest"))
        assert st == 200 and ld["done"] is True and ld["done_reason"] == "load" and ld["model"] == model_id, ld
        assert (ld["response"] if path == "/api/generate" else ld["message"]["content"]) == "", ld
    st, _, e = request(g, "POST", "/api/generate", {"model": "nope", "prompt": ""})
    assert st == 404 and "not found" in e["error"], e
    st, _, e = request(g, "POST", "/api/generate", {"model": model_id, "prompt": 5})  # not a load: refused
    assert st == 400 and "prompt" in e["error"], e
    for ka in (0, "0s", "0m"):
        st, _, e = request(g, "POST", "/api/generate", {"model": model_id, "prompt": "", "keep_alive": ka})
        assert st == 400 and "keep_alive" in e["error"] and "unload" in e["error"], (ka, e)
    st, _, e = request(g, "POST", "/api/generate", {"model": model_id, "prompt": "", "keep_alive": "soon"})
    assert st == 400 and "keep_alive" in e["error"], e
    want = chat(client, model_id, max_tokens=24).choices[0].message.content
    opts = {"temperature": 0, "num_predict": 24, "repeat_penalty": 1.0}  # ollama's default is 1.1
    msgs = [{"role": "user", "content": PROMPT}]
    st, hd, body = request(g, "POST", "/api/chat", {"model": model_id + ":latest", "messages": msgs, "options": opts})
    assert st == 200 and hd["content-type"] == "application/x-ndjson"
    lines = [json.loads(ln) for ln in body.decode().splitlines()]
    assert all(not ln["done"] for ln in lines[:-1]) and lines[-1]["done"]
    assert "".join(ln["message"]["content"] for ln in lines) == want
    assert lines[-1]["eval_count"] == 24 and lines[-1]["done_reason"] == "length"
    st, _, one = request(g, "POST", "/api/chat", {"model": model_id, "messages": msgs, "options": opts,
                                                  "stream": False})
    assert st == 200 and one["message"]["content"] == want and one["done"] and one["prompt_eval_count"] > 0
    st, _, gen = request(g, "POST", "/api/generate", {"model": model_id, "prompt": PROMPT, "options": opts,
                                                      "stream": False})
    assert st == 200 and gen["response"] == want
    st, _, e = request(g, "POST", "/api/generate", {"model": model_id, "prompt": "x", "options": {"mirostat": 1}})
    assert st == 400 and "options.mirostat" in e["error"]
    st, _, e = request(g, "POST", "/api/chat", {"model": model_id, "messages": msgs, "format": "yaml"})
    assert st == 400 and "format" in e["error"]
    st, _, e = request(g, "POST", "/api/chat", {"model": "nope", "messages": msgs})
    assert st == 404 and "nope" in e["error"]


# --- systemd units and make install

def test_units_install_verify_and_security(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    root = build_dir().parent if (build_dir().parent / "Makefile").is_file() else \
        os.path.join(os.path.dirname(__file__), "..", "..")
    dest = tmp_path / "dest"
    r = subprocess.run(["make", "--no-print-directory", "-C", str(root), f"B={build_dir()}", "install",
                        f"DESTDIR={dest}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    unitdir = dest / "usr/local/lib/systemd/system"
    for rel in ("usr/local/bin/nxd-http", "usr/local/lib/sysusers.d/nxd-http.conf", "etc/nxd/nxd-http.conf"):
        assert (dest / rel).is_file(), rel
    svc = (unitdir / "nxd-http.service").read_text()
    assert not re.findall(r"@[A-Z]+@", svc), "placeholders left"
    assert "ExecStart=/usr/local/bin/nxd-http " in svc and "EnvironmentFile=-/etc/nxd/nxd-http.conf" in svc
    assert re.search(r"^After=nxd\.socket", svc, re.M) and "User=nxd-http" in svc
    out = tmp_path / "units"
    out.mkdir()
    (out / "nxd-http.service").write_text(svc.replace("/usr/local/bin/nxd-http", str(dest / "usr/local/bin/nxd-http")))
    shutil.copy(unitdir / "nxd-http.socket", out)
    env = dict(os.environ)
    r = subprocess.run(["systemd-analyze", "verify", str(out / "nxd-http.service"), str(out / "nxd-http.socket")],
                       capture_output=True, text=True, timeout=120, env=env)
    ours = [ln for ln in (r.stdout + r.stderr).splitlines() if "nxd-http." in ln and "man " not in ln]
    assert not ours, r.stdout + r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(out / "nxd-http.service")],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r"Overall exposure level for nxd-http\.service:\s*([0-9.]+)", r.stdout)
    if not m:
        pytest.skip(f"systemd-analyze security --offline is not available: {r.stderr[:200]}")
    assert float(m.group(1)) <= 2.0, r.stdout
