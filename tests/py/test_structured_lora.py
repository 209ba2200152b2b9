"""test_structured_lora.py - constrained decoding composes with a runtime LoRA delta: the mask applies to the adapted
logits, and the constrained log-probabilities are the adapted ones renormalised over the allowed tokens."""
import json

from nxd_helpers import Client
from test_lora_daemon import daemon, fx, gen, ok  # noqa: F401 (fx is a fixture)


def constrained(c, tokens, grammar, lora=None, rid="k"):
    req = {"id": rid, "op": "generate", "tokens": tokens, "max_tokens": 1, "temperature": 0, "logprobs": 20,
           "grammar": grammar, "stream": True}
    if lora:
        req["lora"] = lora
    c.send(req)
    out = None
    while True:
        e = c.recv()
        if e.get("id") != rid:
            continue
        if e["event"] == "token" and out is None:
            out = (e["token"], {x["token"]: x["logprob"] for x in e["logprobs"]})
        elif e["event"] in ("done", "error"):
            assert e["event"] == "done", e
            return out


def test_grammar_over_adapted_logits(fx, tmp_path):  # noqa: F811
    info = json.loads((fx / "visible.json").read_text())
    model, tok, prompt = fx / "tiny-f32-tok.gguf", info["token"], info["prompt"]
    with daemon(model, tmp_path) as d, Client(d.sock) as c:
        ok(c, {"id": 1, "op": "lora_load", "name": "vis", "path": str(fx / "visible")}, "lora_loaded")
        base_t, base_lp = gen(c, prompt)
        free_t, free_lp = gen(c, prompt, [{"name": "vis"}])
        assert free_t[0] == tok and base_t[0] != tok
        piece = c.request({"id": "p", "op": "detokenize", "tokens": [tok]})["text"]
        other = c.request({"id": "q", "op": "detokenize", "tokens": [base_t[0]]})["text"]
        assert piece and other and piece != other

        def lit(s):
            return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

        g = f"root ::= {lit(piece)} | {lit(other)}"
        # adapted: the visible token wins under the grammar too; without the adapter the other one does
        t1, lp1 = constrained(c, prompt, g, [{"name": "vis"}])
        t0, _ = constrained(c, prompt, g)
        assert t1 == tok and t0 == base_t[0], (t1, t0)
        # excluded by the grammar, the adapter's favourite cannot be drawn
        t2, lp2 = constrained(c, prompt, f"root ::= {lit(other)}", [{"name": "vis"}])
        assert t2 != tok and tok not in lp2
        # renormalised: one shift over every token both lists hold
        common = [t for t in lp1 if t in free_lp[0]]
        assert tok in common
        shifts = [lp1[t] - free_lp[0][t] for t in common]
        assert min(shifts) >= -1e-3 and max(shifts) - min(shifts) < 2e-3, shifts
