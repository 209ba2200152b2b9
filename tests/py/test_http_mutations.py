"""test_http_mutations.py - nxd-http under requests that are almost right: valid bodies of every generation and
token route with fields retyped, dropped, repeated or cut short, and unknown ones added (seeded, so a failure
repeats). Each must get a whole answer: a 4xx with an error message a client can read, or a 200 that ends as
its API says; and nxd and the gateway must serve a plain request afterwards."""
import json
import random

import pytest

from http_helpers import nxd_behind_gateway, request, sse_events

N_REQUESTS = 300

ODD = [None, True, False, 0, -1, 1, 2**31, 2**63 - 1, -2**63, 1e308, -1e308, 0.5, -0.0, "", "x", "\u0000", "\uffff",
       "a" * 3000, [], [None], {}, {"a": [1, {"b": None}]}, [[[[[]]]]], "NaN"]
UNKNOWN = ["extra", "n", "best_of", "functions", "min_p", "top_k", "max_completion_tokens", "speculate", "lora",
           "images", "keep_alive", "template", "suffix", "logit_bias"]


def bases(model):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    return {
        "/v1/chat/completions": {
            "model": model, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "stream": True, "stop": ["\n"], "logprobs": True,
            "top_logprobs": 2, "seed": 3, "stream_options": {"include_usage": True}, "presence_penalty": 0.1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
        "/v1/completions": {"model": model, "prompt": "Once upon", "max_tokens": 4, "temperature": 0, "stop": "x",
                            "logprobs": 2, "stream": False, "echo": False},
        "/api/chat": {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False, "format": "json",
                      "options": {"num_predict": 4, "temperature": 0.5, "top_k": 10, "seed": 1}},
        "/api/generate": {"model": model, "prompt": "hi", "stream": True, "system": "s", "options": {"num_predict": 4}},
        "/tokenize": {"model": model, "prompt": "hello", "add_special_tokens": True},
        "/detokenize": {"model": model, "tokens": [1, 2, 3]},
    }


def mutate(rng, v):
    if rng.random() < 0.15:
        return rng.choice(ODD)
    if isinstance(v, dict):
        v = {k: (mutate(rng, x) if rng.random() < 0.3 else x) for k, x in v.items() if rng.random() >= 0.05}
        if rng.random() < 0.1:
            v[rng.choice(UNKNOWN)] = rng.choice(ODD + [3, "required"])
        return v
    if isinstance(v, list):
        v = [mutate(rng, x) if rng.random() < 0.3 else x for x in v]
        return v * rng.randint(2, 20) if v and rng.random() < 0.1 else v
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return rng.choice([v, -v, v * 1000, v + 0.5, 0, 2**40])
    if isinstance(v, str):
        return rng.choice([v, v * 50, "", "<tool_call>", "{{", "\x01", v + "\u00e9\U0001F600"])
    return v


@pytest.fixture(scope="module")
def stack(model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http-mut")
    with nxd_behind_gateway(model_path, tmp, 512) as stack:
        yield stack


def check_answer(path, body, st, out):
    """What a client gets: an error it can read, or an answer that ends as its API says."""
    where = f"POST {path} {body[:300]!r} -> {st}: {out if isinstance(out, (dict, list)) else out[:300]!r}"
    assert st in (200, 400, 404, 413), where
    ollama = path.startswith("/api/")
    if st != 200:
        assert isinstance(out, dict), where
        msg = out["error"] if ollama else out["error"]["message"]
        assert isinstance(msg, str) and msg and "JSON_" not in msg, where
        return
    if isinstance(out, dict):  # a whole answer
        assert "error" not in out, where
        if ollama:
            assert out.get("done") is True, where
        return
    text = out.decode()
    if ollama:  # NDJSON, the last line done
        lines = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        assert lines and lines[-1].get("done") is True and "error" not in lines[-1], where
    else:  # SSE, ending with [DONE] after no error
        events = sse_events(out)
        assert events and events[-1] == "[DONE]", where
        assert not any(isinstance(e, dict) and "error" in e for e in events), where


def test_mutated_requests_get_whole_answers(stack):
    d, g = stack
    st, _, models = request(g, "GET", "/v1/models")
    assert st == 200, models
    model = models["data"][0]["id"]
    rng = random.Random(20261202)
    routes = bases(model)
    seen = set()
    for i in range(N_REQUESTS):
        path = rng.choice(sorted(routes))
        body = json.dumps(mutate(rng, routes[path])).encode()
        if rng.random() < 0.05:
            body = body[:rng.randint(0, len(body))]
        st, _, out = request(g, "POST", path, body)
        check_answer(path, body, st, out)
        seen.add((path, st))
    # the run reached answers as well as refusals on every route
    for path in routes:
        assert (path, 200) in seen and (path, 400) in seen, sorted(seen)
    assert d.proc.poll() is None and g.alive()
    st, _, out = request(g, "POST", "/v1/chat/completions",
                         {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert st == 200 and out["choices"][0]["message"]["content"] is not None, out
