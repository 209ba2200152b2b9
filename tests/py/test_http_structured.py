"""test_http_structured.py - OpenAI response_format and ollama format through nxd-http onto nxd's constrained decoding
(docs/http.md, "Structured output")."""
import json

import jsonschema
import pytest

from http_helpers import nxd_behind_gateway, request

openai = pytest.importorskip("openai", reason="the openai package is not in the venv (tests/requirements.txt)")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "population": {"type": "integer", "minimum": 0, "maximum": 50000000}},
          "required": ["city", "population"]}


@pytest.fixture(scope="module")
def stack(model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http_structured")
    with nxd_behind_gateway(model_path, tmp, 2048) as stack:
        yield stack


@pytest.fixture
def client(stack):
    return openai.OpenAI(base_url=stack[1].url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def model_id(stack):
    st, _, body = request(stack[1], "GET", "/v1/models")
    assert st == 200, body
    return body["data"][0]["id"]


def ask(client, model_id, **kw):
    args = dict(model=model_id, messages=[{"role": "user", "content": "Name a city and its population, as JSON."}],
                temperature=1.0, max_tokens=80)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_openai_json_schema(client, model_id):
    for seed in range(8):
        r = ask(client, model_id, seed=seed, response_format={
            "type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}})
        c = r.choices[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_openai_json_object_streamed(client, model_id):
    s = ask(client, model_id, seed=3, stream=True, response_format={"type": "json_object"})
    text, finish = "", None
    for ch in s:
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    if finish != "length":
        assert isinstance(json.loads(text), dict)


def test_openai_text_is_unconstrained(client, model_id):
    a = ask(client, model_id, seed=5, temperature=0, max_tokens=16, response_format={"type": "text"})
    b = ask(client, model_id, seed=5, temperature=0, max_tokens=16)
    assert a.choices[0].message.content == b.choices[0].message.content


@pytest.mark.parametrize("rf,needle", [
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "extra": 1}}, "extra"),
    ({"type": "json_object", "schema": {}}, "schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
     "uniqueItems"),
])
def test_openai_refusals(client, model_id, rf, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        ask(client, model_id, response_format=rf)
    assert ei.value.status_code == 400
    assert needle in ei.value.body["message"], ei.value.body
    assert ei.value.body["param"].startswith("response_format"), ei.value.body  # the client's field, not nxd's "format"


def test_openai_response_format_with_tools(client, model_id):
    """The pair is refused in the API's own words (nxd itself calls the field 'format')."""
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    for rf in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}):
        with pytest.raises(openai.BadRequestError) as ei:
            ask(client, model_id, response_format=rf, tools=tools)
        assert ei.value.body["param"] == "response_format", ei.value.body
        assert "'response_format'" in ei.value.body["message"] and "'tools'" in ei.value.body["message"]
        assert "'format'" not in ei.value.body["message"], ei.value.body
    # {"type": "text"} constrains nothing, so it goes with tools (SmolLM2's template then refuses them)
    with pytest.raises(openai.BadRequestError) as ei:
        ask(client, model_id, response_format={"type": "text"}, tools=tools, max_tokens=4)
    assert "chat template" in ei.value.body["message"], ei.value.body


def test_ollama_format(stack, model_id):
    d, g = stack
    for fmt, check in (("json", lambda v: isinstance(v, dict)), (SCHEMA, lambda v: jsonschema.validate(v, SCHEMA) or True)):
        for api, body in (("/api/generate", {"prompt": "Name a city and its population, as JSON."}),
                          ("/api/chat", {"messages": [{"role": "user", "content": "A city as JSON."}]})):
            req = dict(body, model=model_id, stream=False, format=fmt, options={"seed": 1, "num_predict": 80})
            st, _, v = request(g, "POST", api, req)
            assert st == 200, v
            text = v["response"] if api == "/api/generate" else v["message"]["content"]
            if v.get("done_reason") != "length":
                assert check(json.loads(text)), text
    st, _, v = request(g, "POST", "/api/generate", {"model": model_id, "prompt": "x", "format": "yaml"})
    assert st == 400 and "format" in json.dumps(v), v
    st, _, v = request(g, "POST", "/api/generate", {"model": model_id, "prompt": "x", "format": {"$ref": "#"}})
    assert st == 400 and "$ref" in json.dumps(v), v
