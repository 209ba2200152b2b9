"""test_structured.py - constrained decoding on the real model: every constrained output parses and validates, the constrained
distribution is the unconstrained one renormalised over the allowed tokens, length-cut output is flagged incomplete, and
what cannot be compiled is refused naming the construct (docs/protocol.md, "Constrained decoding").

NXD_STRUCTURED_N sets the generations per schema (default 200)."""
import json
import math
import os

import jsonschema
import pytest

from nxd_helpers import Client, Daemon

N_PER_SCHEMA = int(os.environ.get("NXD_STRUCTURED_N", "200"))

PROMPT = "Answer with JSON only."

# (name, schema, max_tokens): schemas that close within max_tokens for most draws.
SCHEMAS = [
    ("person", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                                 "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"]}, 64),
    ("color_enum", {"enum": ["red", "green", "blue", 7, None]}, 16),
    ("flags_optional", {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"},
                                                         "c": {"type": "null"}}}, 48),
    ("int_array", {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50},
                   "minItems": 1, "maxItems": 5}, 48),
    ("nested", {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 99999},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
            "required": ["id", "tags"]}}, "required": ["user"]}, 96),
    ("any_of", {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "maxLength": 5},
                          {"type": "null"}]}, 16),
    ("const_object", {"const": {"v": 1, "w": [True, "x"]}}, 24),
    ("code_pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}, 24),
    ("word_pattern", {"type": "string", "pattern": "^(yes|no|maybe)( please)?$"}, 16),
    ("number_bounds", {"type": "number", "minimum": -10, "maximum": 10}, 16),
    ("date_pattern", {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}, 24),
    ("type_union", {"type": ["integer", "boolean"], "minimum": -3, "maximum": 3}, 12),
    ("string_lengths", {"type": "string", "minLength": 3, "maxLength": 6}, 16),
    ("pair_of_enums", {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 2, "maxItems": 2}, 24),
    ("strict_record", {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "count": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000},
        "label": {"type": "string", "pattern": "^[a-z]+$"}},
        "required": ["ok", "count", "label"], "additionalProperties": False}, 64),
]


@pytest.fixture(scope="module")
def daemon(model_path, tmp_path_factory):
    d = Daemon(model_path, tmp_path_factory.mktemp("structured"), workers=2, args=["--slots", "8"]).start()
    yield d
    d.stop()


def run_many(sock, reqs, window=8):
    """Sends the requests (dicts with ids) pipelined, at most window in flight; returns {id: done_or_error}."""
    out = {}
    with Client(sock, timeout=600) as c:
        pending = list(reqs)
        inflight = 0
        while pending or inflight:
            while pending and inflight < window:
                c.send(pending.pop(0))
                inflight += 1
            ev = c.recv()
            assert ev is not None
            if ev.get("event") in ("done", "error"):
                out[ev["id"]] = ev
                inflight -= 1
    return out


@pytest.mark.parametrize("name,schema,max_tokens", SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_every_output_validates(daemon, report, name, schema, max_tokens):
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    reqs = [{"op": "generate", "id": i, "prompt": PROMPT, "format": schema, "temperature": 1.0, "top_k": 0,
             "top_p": 1.0, "min_p": 0.0, "seed": 1000 + i, "max_tokens": max_tokens, "stream": False}
            for i in range(N_PER_SCHEMA)]
    res = run_many(daemon.sock, reqs)
    complete = 0
    distinct = set()
    for i in range(N_PER_SCHEMA):
        ev = res[i]
        assert ev["event"] == "done", ev
        assert "incomplete" in ev, ev
        if ev["incomplete"]:
            assert ev["reason"] == "length", ev
            continue
        complete += 1
        doc = json.loads(ev["text"])
        errors = list(validator.iter_errors(doc))
        assert not errors, f"{name} seed {1000 + i}: {ev['text']!r}: {errors[0].message}"
        distinct.add(json.dumps(doc, sort_keys=True))
    report(f"structured {name}: {complete}/{N_PER_SCHEMA} complete and valid, {len(distinct)} distinct")
    # at temperature 1 the constraint must still leave the model room, and most draws finish in max_tokens
    assert complete >= N_PER_SCHEMA // 2, f"{name}: only {complete} of {N_PER_SCHEMA} finished"
    if name not in ("const_object",):
        assert len(distinct) > 1


def test_json_mode_parses(daemon):
    reqs = [{"op": "generate", "id": i, "prompt": "Give a JSON object describing a cat.", "format": "json",
             "temperature": 1.0, "seed": 50 + i, "max_tokens": 80, "stream": False} for i in range(40)]
    res = run_many(daemon.sock, reqs)
    complete = 0
    for ev in res.values():
        assert ev["event"] == "done", ev
        if not ev["incomplete"]:
            complete += 1
            json.loads(ev["text"])
    assert complete > 0


def test_gbnf_grammar(daemon):
    g = 'root ::= "The answer is " ( "yes" | "no" ) "." ( " " [A-Z] [a-z]{1,8} "." )?'
    reqs = [{"op": "generate", "id": i, "prompt": "Is the sky blue?", "grammar": g, "temperature": 1.0, "seed": i,
             "max_tokens": 24, "stream": False} for i in range(30)]
    import re
    pat = re.compile(r"The answer is (yes|no)\.( [A-Z][a-z]{1,8}\.)?")
    for ev in run_many(daemon.sock, reqs).values():
        assert ev["event"] == "done", ev
        if not ev["incomplete"]:
            assert pat.fullmatch(ev["text"]), ev["text"]


def test_an_ambiguous_grammar_is_the_requests_error(daemon):
    """A grammar whose matcher state outgrows its bounds (nested repetitions that can split a run of letters
    in every way) ends its request as bad_request, the client's to fix, not internal; the daemon lives on."""
    g = 'root ::= ( [a-z]{0,50} ){0,50} "!"'
    ev = run_many(daemon.sock, [{"op": "generate", "id": 1, "prompt": "x", "grammar": g,
                                 "temperature": 0, "max_tokens": 64, "stream": False}])[1]
    if ev["event"] == "done":
        pytest.skip("the matcher held this grammar here: nothing to check")
    assert ev["event"] == "error" and ev["code"] == "bad_request" and "grammar" in ev["message"], ev


def logprob_map(ev):
    return {a["token"]: a["logprob"] for a in ev["logprobs"]}


def test_logprobs_are_renormalised(daemon):
    """At each step the constrained log-probabilities are the unconstrained ones shifted by one constant, -log of the
    allowed tokens' total probability: the unconstrained distribution renormalised over the allowed set."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "why": {"type": "string"}},
              "required": ["answer", "why"]}
    with Client(daemon.sock) as c:
        prompt = c.request({"op": "tokenize", "id": "t", "text": "<|im_start|>user\nIs water wet? Answer in JSON.<|im_end|>\n"
                                                       "<|im_start|>assistant\n", "special": True})["tokens"]
        c.send({"op": "generate", "id": "c", "tokens": prompt, "format": schema, "temperature": 0, "logprobs": 20,
                "max_tokens": 12})
        steps = [ev for ev in c.events("c") if ev["event"] == "token"]
        assert len(steps) >= 6
        checked = 0
        for k, ev in enumerate(steps):
            con = logprob_map(ev)
            # logprobs report the renormalised distribution: the drawn token's is among them, and they sum to <= 1
            assert sum(math.exp(v) for v in con.values()) <= 1.0 + 1e-4
            c.send({"op": "generate", "id": f"u{k}", "tokens": prompt + [s["token"] for s in steps[:k]],
                    "temperature": 0, "logprobs": 20, "max_tokens": 1})
            un = [e for e in c.events(f"u{k}") if e["event"] == "token"]
            assert un
            unc = logprob_map(un[0])
            common = [t for t in con if t in unc]
            if not common:
                continue
            shifts = [con[t] - unc[t] for t in common]
            assert min(shifts) >= -1e-3, shifts  # renormalising over a subset only raises log-probabilities
            assert max(shifts) - min(shifts) < 2e-3, (k, shifts)
            checked += 1
        assert checked >= 3


def test_length_cut_is_incomplete(daemon):
    with Client(daemon.sock) as c:
        _, text, done = c.generate("a", prompt=PROMPT, format=SCHEMAS[0][1], max_tokens=3, stream=False)
        assert done["reason"] == "length" and done["incomplete"] is True, done
        # a grammar that cannot finish within max_tokens
        _, text, done = c.generate("b", prompt="a", grammar='root ::= "a"{60} "!"', max_tokens=5, stream=False)
        assert done["reason"] == "length" and done["incomplete"] is True, (text, done)
        assert set(text) == {"a"} and len(text) < 60, text
        # streamed: the done event says it too
        _, text, done = c.generate("c", prompt=PROMPT, format="json", max_tokens=2)
        assert done["event"] == "done" and done["incomplete"] is True
        # an unconstrained request has no such field
        _, _, done = c.generate("d", prompt="hi", max_tokens=2)
        assert "incomplete" not in done
        # a stop string that cuts the document makes it incomplete too
        _, text, done = c.generate("e", prompt=PROMPT, format={"const": {"k": "v"}}, stop=[":"], max_tokens=20,
                                   stream=False)
        assert done["reason"] == "stop" and done["incomplete"] is True and text == '{"k"', (text, done)


REFUSALS = [
    ({"format": {"$ref": "#/$defs/x"}}, "'$ref'"),
    ({"format": {"type": "object", "patternProperties": {"^a": {}}}}, "'patternProperties'"),
    ({"format": {"type": "array", "uniqueItems": True}}, "'uniqueItems'"),
    ({"format": {"oneOf": [{"type": "integer"}, {"type": "string"}]}}, "'oneOf'"),
    ({"format": {"type": "string", "pattern": "a(?=b)"}}, "lookahead"),
    ({"format": {"type": "string", "pattern": "(a)\\1"}}, "backreference"),
    ({"format": {"type": "number", "minimum": 0.5}}, "not an integer"),
    ({"format": {"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}}, "properties.a"),
    ({"format": "xml"}, "\"xml\""),
    ({"format": 3}, "'format'"),
    ({"grammar": "root ::= missing"}, "'missing' is used"),
    ({"grammar": "root ::= root \"a\""}, "left-recursive"),
    ({"grammar": "root ::= <think>"}, "token references"),
    ({"grammar": 1}, "'grammar' must be a string"),
    ({"grammar": "root ::= \"a\"", "format": "json"}, "cannot be used together"),
    ({"format": "json", "ignore_eos": True}, "ignore_eos"),
]


@pytest.mark.parametrize("fields,needle", REFUSALS, ids=[n for _, n in REFUSALS])
def test_refusals_name_the_construct(daemon, fields, needle):
    with Client(daemon.sock) as c:
        req = {"op": "generate", "id": 9, "prompt": "x", "max_tokens": 4}
        req.update(fields)
        ev = c.request(req)
        assert ev["event"] == "error" and ev["code"] == "bad_request", ev
        assert needle in ev["message"], ev["message"]
        # the daemon and the connection live on
        _, _, done = c.generate(10, prompt="hi", max_tokens=2)
        assert done["event"] == "done"


def test_batched_with_unconstrained(daemon):
    """Constrained and unconstrained sequences share steps: each gets exactly what it gets alone."""
    schema = SCHEMAS[0][1]
    con = {"op": "generate", "prompt": PROMPT, "format": schema, "temperature": 1.0, "seed": 77, "max_tokens": 40,
           "stream": False}
    unc = {"op": "generate", "prompt": "Tell me about the sea.", "temperature": 1.0, "seed": 78, "max_tokens": 40,
           "stream": False}
    alone_c = run_many(daemon.sock, [dict(con, id="c")])["c"]
    alone_u = run_many(daemon.sock, [dict(unc, id="u")])["u"]
    mixed = run_many(daemon.sock, [dict(con, id="c1"), dict(unc, id="u1"), dict(con, id="c2"), dict(unc, id="u2")])
    for k in ("c1", "c2"):
        assert mixed[k]["text"] == alone_c["text"]
    for k in ("u1", "u2"):
        assert mixed[k]["text"] == alone_u["text"]
        assert "incomplete" not in mixed[k]
    assert not alone_c["incomplete"]


def test_speculation_under_a_grammar(daemon):
    """Drafts of a constrained request are drawn under its grammar like any token: with speculation the
    answer is the one without it (greedy and seeded sampling), and drafts were tried."""
    record = '{"name": "Ada Lovelace", "age": 36, "city": "London", "tags": ["math", "engines"]}'
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
        "required": ["name", "age", "city", "tags"]}
    prompt = f"Copy this record exactly, as JSON: {record}\nThe record: "
    drafted = 0
    for i, samp in enumerate([{"temperature": 0}, {"temperature": 1.0, "seed": 5}, {"temperature": 0.7, "seed": 9}]):
        base = dict({"op": "generate", "prompt": prompt, "format": schema, "max_tokens": 60, "stream": False},
                    **samp)
        # one after the other: a draft rides in a step shared with another sequence only once the
        # daemon's step-time fit says it is cheap
        off = run_many(daemon.sock, [dict(base, id="off", speculate={"mode": "off"})])["off"]
        on = run_many(daemon.sock, [dict(base, id="on", speculate={"mode": "prompt", "k": 8})])["on"]
        assert off["event"] == "done" and on["event"] == "done", (off, on)
        assert on["text"] == off["text"] and on["tokens"] == off["tokens"], (on["text"], off["text"])
        assert on["incomplete"] == off["incomplete"]
        if not on["incomplete"]:
            jsonschema.validate(json.loads(on["text"]), schema)
        drafted += on["speculate"]["drafted"]
    assert drafted > 0
