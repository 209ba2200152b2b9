"""test_speculate.py - speculative decoding (prompt lookup): the output is the one without speculation, token for token and logprob for logprob; the sampled distribution is unchanged; bad `speculate` values are refused by name."""
import math
import threading
from collections import Counter

import pytest

import make_tiny
from conftest import build_dir
from nxd_helpers import Client, Daemon

ARGS = ["--ctx", "1024", "--slots", "4"]

# Input-grounded prompts: the answer repeats the input, where drafts are right.
LIST = ("Repeat this list exactly:\n1. apples\n2. bananas\n3. cherries\n4. dates\n5. elderberries\n6. figs\n"
        "7. grapes\n8. honeydew\n\nHere is the list again:\n")
CODE = ("Rename the variable total to sum in this code:\n\ndef add_all(values):\n    total = 0\n    for v in values:\n"
        "        total += v\n    return total\n\nHere is the code with total renamed to sum:\n\ndef add_all(values):\n")
QUOTE = ("Passage: The mitochondrion is the powerhouse of the cell. It produces energy through cellular respiration "
         "and has its own DNA.\n\nQuote the passage word for word:\nThe mitochondrion")
FREE = "Once upon a time"
PROMPTS = [LIST, CODE, QUOTE, FREE]


# The tiny models' tests are about what drafts do, not how many pay: their daemons are told a step is
# mostly fixed cost (a model waiting on memory), so that drafts ride wherever prompt lookup finds them,
# whatever the host's own step times would say.
DRAFTS_PAY = {"NXD_TEST_SPEC_FIT": "1e-3,1e-6,0"}


def run(c, rid, prompt, spec=None, stream=True, **kw):
    """(tokens, logprobs, text, done) of one greedy generate."""
    req = dict(op="generate", id=rid, prompt=prompt, raw=True, temperature=0, logprobs=2, stream=stream)
    req.update(kw)
    if spec is not None:
        req["speculate"] = spec
    c.send(req)
    toks, lps, text, done = [], [], [], None
    for ev in c.events(rid):
        if ev["event"] == "token":
            toks.append(ev["token"])
            lps.append((ev["logprob"], [(a["token"], a["logprob"]) for a in ev["logprobs"]]))
            text.append(ev["text"])
        else:
            done = ev
    assert done["event"] == "done", done
    if not stream:
        return done["tokens"], None, done["text"], done
    return toks, lps, "".join(text), done


@pytest.fixture(scope="module")
def nxd2(model_path, tmp_path_factory):
    with Daemon(model_path, tmp_path_factory.mktemp("spec2"), workers=2, args=ARGS) as d:
        yield d


@pytest.fixture(scope="module")
def plain(nxd2):
    """Each prompt's greedy answer without speculation."""
    with Client(nxd2.sock) as c:
        return {p: run(c, i, p, max_tokens=96) for i, p in enumerate(PROMPTS)}


def assert_same(a, b, what):
    assert a[0] == b[0], f"{what}: tokens differ"
    if a[1] is not None and b[1] is not None:
        assert a[1] == b[1], f"{what}: logprobs differ"
    assert a[2] == b[2], f"{what}: text differs"
    assert a[3]["reason"] == b[3]["reason"], what


def test_greedy_identical_with_speculation(nxd2, plain):
    with Client(nxd2.sock) as c:
        accepted = 0
        for i, p in enumerate(PROMPTS):
            for k in (1, 4, 16):
                got = run(c, f"s{i}.{k}", p, spec={"mode": "prompt", "k": k}, max_tokens=96)
                assert_same(got, plain[p], f"prompt {i} k {k}")
                sp = got[3]["speculate"]
                assert 0 <= sp["accepted"] <= sp["drafted"], sp
                if p is not FREE:
                    accepted += sp["accepted"]
            off = run(c, f"o{i}", p, spec={"mode": "off"}, max_tokens=96)
            assert_same(off, plain[p], f"prompt {i} off")
            assert "speculate" not in off[3]
        # the grounded prompts did speculate: the comparison is not vacuous
        assert accepted > 50, accepted
        # non-streamed answers too
        got = run(c, "ns", LIST, spec={"mode": "prompt"}, stream=False, max_tokens=96)
        assert got[0] == plain[LIST][0] and got[2] == plain[LIST][2]
        st = c.request({"op": "status", "id": "st"})
        assert st["speculate"]["default"] == "off" and st["speculate"]["k"] == 8
        assert st["speculate"]["accepted"] >= accepted and st["speculate"]["drafted"] >= st["speculate"]["accepted"]


def test_drafts_carried_as_far_as_they_pay(model_path, tmp_path, plain):
    """How many drafts a step carries follows the step-time fit (pinned by NXD_TEST_SPEC_FIT): where a
    step's fixed part is most of it (a model waiting on memory) the grounded prompts draft runs; where a
    draft costs half a decode step, only the likely drafts ride; where verifying a draft costs what
    decoding its token would (a = 0) none pays, and only a probe of one draft now and then is tried, to
    see whether that has changed. The output is the same in each."""
    got = {}
    for name, fit in (("memory-bound", "1e-3,1e-6,0"), ("compute-bound", "1e-3,1e-3,0"), ("no gain", "0,1e-3,0")):
        (tmp_path / name).mkdir()
        with Daemon(model_path, tmp_path / name, workers=2, args=ARGS, env={"NXD_TEST_SPEC_FIT": fit}) as d, \
                Client(d.sock) as c:
            dr = ac = n = 0
            steps0 = c.request({"op": "status", "id": "st0"})["steps"]
            for i, p in enumerate(PROMPTS[:3]):
                r = run(c, f"{name}{i}", p, spec={"mode": "prompt", "k": 8}, max_tokens=96)
                assert_same(r, plain[p], f"{name}, prompt {i}")
                dr += r[3]["speculate"]["drafted"]
                ac += r[3]["speculate"]["accepted"]
                n += len(r[0])
            got[name] = {"drafted": dr, "accepted": ac, "tokens": n,
                         "steps": c.request({"op": "status", "id": "st1"})["steps"] - steps0}
    mem, cpu, none = got["memory-bound"], got["compute-bound"], got["no gain"]
    assert mem["accepted"] > mem["tokens"] // 2 and mem["steps"] < 0.6 * mem["tokens"], got
    # only the likely drafts: fewer of them, more of them right, more steps for the same tokens
    assert 0 < cpu["drafted"] < mem["drafted"], got
    assert cpu["accepted"] / cpu["drafted"] > mem["accepted"] / mem["drafted"], got
    assert cpu["steps"] > mem["steps"], got
    # probes only: a third as many drafts as the memory-bound host's, and many more steps
    assert 0 < none["drafted"] and 3 * none["drafted"] < mem["drafted"], got
    assert none["steps"] > 1.5 * mem["steps"], got


def test_greedy_identical_across_worker_counts(model_path, tmp_path, plain):
    """One worker speculating by default (--speculate) gives what two give without."""
    with Daemon(model_path, tmp_path, workers=1, args=ARGS + ["--speculate", "prompt:6"]) as d:
        with Client(d.sock) as c:
            st = c.request({"op": "status", "id": "st"})
            assert st["speculate"]["default"] == "prompt" and st["speculate"]["k"] == 6, st
            for i, p in enumerate(PROMPTS):
                got = run(c, i, p, max_tokens=96)
                assert_same(got, plain[p], f"prompt {i}, 1 worker")
                assert "speculate" in got[3]
            off = run(c, "off", LIST, spec={"mode": "off"}, max_tokens=96)
            assert_same(off, plain[LIST], "off on a speculating daemon")
            assert "speculate" not in off[3]


def test_stops_inside_an_accepted_run(nxd2, plain):
    """max_tokens, a stop string and the end of sequence that fall inside a run of accepted drafts end the
    answer exactly where they do without speculation."""
    spec = {"mode": "prompt", "k": 16}
    with Client(nxd2.sock) as c:
        # through the chat template, where the answer ends with the end-of-turn token
        ref_toks, ref_lps, ref_text, ref_done = run(c, "ref", LIST, raw=False, max_tokens=96)
        assert ref_done["reason"] == "eos"
        for n in list(range(1, len(ref_toks) + 1, 3)) + [len(ref_toks), len(ref_toks) + 1]:
            got = run(c, f"m{n}", LIST, spec=spec, raw=False, max_tokens=n)
            assert got[0] == ref_toks[:n] and got[1] == ref_lps[:n], n
            assert got[3]["reason"] == ("length" if n <= len(ref_toks) else "eos"), (n, got[3])
            assert got[3]["usage"]["completion_tokens"] == min(n, len(ref_toks))
            if n > 8:
                assert got[3]["speculate"]["accepted"] > 0, got[3]
        for stop in ("cherries", "5.", "honeydew", "s\n4"):
            want = run(c, f"w{stop}", LIST, stop=[stop], raw=False, max_tokens=96)
            got = run(c, f"g{stop}", LIST, spec=spec, stop=[stop], raw=False, max_tokens=96)
            assert want[3]["reason"] == "stop", (stop, want)
            assert_same(got, want, f"stop {stop!r}")
            assert got[3]["speculate"]["accepted"] > 0, (stop, got[3])
            got = run(c, f"n{stop}", LIST, spec=spec, stop=[stop], raw=False, max_tokens=96, stream=False)
            assert got[2] == want[2] and got[0] == want[0]
        got = run(c, "eos", LIST, spec=spec, raw=False, max_tokens=200)
        assert_same(got, (ref_toks, ref_lps, ref_text, ref_done), "eos")


def test_concurrent_clients_mixing_speculation(nxd2, plain):
    results, errors = {}, []

    def client(i, p, spec):
        try:
            with Client(nxd2.sock) as c:
                for r in range(2):
                    results[(i, r)] = (p, run(c, f"c{i}.{r}", p, spec=spec, max_tokens=96))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    specs = [{"mode": "prompt", "k": 8}, None, {"mode": "prompt", "k": 3}, {"mode": "off"}, {"mode": "prompt"}]
    ts = [threading.Thread(target=client, args=(i, PROMPTS[i % len(PROMPTS)], s)) for i, s in enumerate(specs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors, errors
    assert len(results) == 2 * len(specs)
    for (i, r), (p, got) in results.items():
        assert_same(got, plain[p], f"client {i} run {r}")


def test_seeded_sampling_identical_with_speculation(nxd2):
    """The same seed draws the same tokens with speculation on or off (each row is sampled as it would be
    one at a time, and a draft is kept only when it is the token drawn)."""
    with Client(nxd2.sock) as c:
        accepted = 0
        for seed in range(6):
            kw = dict(temperature=0.8, top_k=40, top_p=0.95, seed=seed, max_tokens=48, repeat_penalty=1.1,
                      presence_penalty=0.3)
            want = run(c, f"w{seed}", LIST, **kw)
            got = run(c, f"g{seed}", LIST, spec={"mode": "prompt", "k": 8}, **kw)
            assert_same(got, want, f"seed {seed}")
            accepted += got[3]["speculate"]["accepted"]
        assert accepted > 20, accepted


def test_bad_speculate_values_are_refused(nxd2):
    bad = [
        ("yes", "field 'speculate' must be an object"),
        ({"mode": "draft"}, "field 'speculate.mode'"),
        ({"mode": 1}, "field 'speculate.mode' must be a string"),
        ({"k": 0}, "field 'speculate.k'"),
        ({"k": 17}, "field 'speculate.k'"),
        ({"k": 2.5}, "field 'speculate.k'"),
        ({"mode": "prompt", "draft_model": "x.gguf"}, "field 'speculate.draft_model' is not supported"),
    ]
    with Client(nxd2.sock) as c:
        for v, msg in bad:
            ev = c.request({"op": "generate", "id": "b", "prompt": "hi", "raw": True, "speculate": v})
            assert ev["event"] == "error" and ev["code"] in ("bad_request", "out_of_range"), (v, ev)
            assert msg in ev["message"], (v, ev)
        toks, _, ev = c.generate(rid="ok", prompt="hi", raw=True, max_tokens=2, temperature=0)
        assert ev["event"] == "done" and len(toks) == 2


@pytest.mark.parametrize("arg", ["draft", "prompt:0", "prompt:17", "prompt:x", "off:"])
def test_bad_speculate_option_is_refused(arg, tmp_path):
    import subprocess
    model = make_tiny.build(tmp_path / "m.gguf", wtype="Q8_0", vocab=True)
    r = subprocess.run([str(build_dir() / "nxd"), "--model", str(model), "--socket", str(tmp_path / "s"),
                        "--speculate", arg], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--speculate" in r.stderr, (arg, r.stderr)


# ---------------------------------------------------------------- tiny models

@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return [make_tiny.build(d / f"{arch}-{t}.gguf", arch=arch, wtype=t, vocab=True, seed=3, n_vocab=300)
            for arch, t in (("llama", "Q8_0"), ("qwen2", "Q4_K"), ("llama", "F16"))]


def tiny_prompt(n=40, period=7):
    return [1] + [259 + (i % period) * 5 for i in range(n)]


@pytest.mark.parametrize("workers", [1, 2])
def test_tiny_models_greedy_identical(tiny_models, tmp_path, workers):
    for m in tiny_models:
        with Daemon(m, tmp_path, workers=workers, args=["--ctx", "512", "--slots", "3"], name=m.stem,
                    env=DRAFTS_PAY) as d:
            with Client(d.sock) as c:
                accepted = 0
                for j, prompt in enumerate((tiny_prompt(), tiny_prompt(60, 3), [1, 300 - 5, 270])):
                    base = dict(op="generate", tokens=prompt, temperature=0, logprobs=3, max_tokens=80,
                                ignore_eos=True)
                    want = c.generate_logprobs(f"w{j}", base)
                    for k in (2, 9):
                        got = c.generate_logprobs(f"g{j}.{k}", dict(base, speculate={"mode": "prompt", "k": k}))
                        assert got[:2] == want[:2], (m.name, j, k)
                        accepted += got[2]["speculate"]["accepted"]
                assert accepted > 0, m.name


def test_tiny_context_end_and_back_off(tiny_models, tmp_path):
    """A speculating request that runs into the end of the context stops where it does without; one whose
    drafts keep being rejected drafts less and less (k shrinks, then pauses that double)."""
    with Daemon(tiny_models[0], tmp_path, workers=2, args=["--ctx", "256", "--slots", "2"], name="end",
                env=DRAFTS_PAY) as d:
        with Client(d.sock) as c:
            base = dict(op="generate", tokens=tiny_prompt(200, 7), temperature=0, logprobs=1, max_tokens=200,
                        ignore_eos=True)
            want = c.generate_logprobs("w", base)
            assert want[2]["reason"] == "length" and len(want[0]) == 256 - 201 + 1, want[2]
            got = c.generate_logprobs("g", dict(base, speculate={"mode": "prompt", "k": 16}))
            assert got[:2] == want[:2] and got[2]["reason"] == "length"
            assert got[2]["speculate"]["accepted"] > 0
            # sampled far from the model's preferences: nearly every draft is wrong
            hot = dict(op="generate", tokens=tiny_prompt(20, 7), temperature=5.0, top_k=0, top_p=1.0, min_p=0.0,
                       max_tokens=200, ignore_eos=True, seed=1, stream=False, speculate={"mode": "prompt", "k": 8})
            c.send(dict(hot, id="hot"))
            ev = c.recv()
            assert ev["event"] == "done" and ev["usage"]["completion_tokens"] == 200, ev
            sp = ev["speculate"]
            assert sp["accepted"] < 0.2 * sp["drafted"], sp
            assert sp["drafted"] < 40, sp  # without the back-off: ~8 a step, 200 steps


def chi2_sf_bound(df, alpha):
    """The chi-square critical value at level alpha (Wilson-Hilferty: accurate to ~1% for df >= 3)."""
    # z of the upper alpha tail by bisection on the normal survival function
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > alpha:
            lo = mid
        else:
            hi = mid
    z = lo
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampling_distribution_unchanged(tiny_models, tmp_path, report):
    """The first generated tokens' joint distribution with speculation (other seeds) is the one without:
    a chi-square test of homogeneity over many seeded runs, where drafts are proposed at every position and
    accepted about half the time."""
    m = tiny_models[0]
    with Daemon(m, tmp_path, workers=2, args=["--ctx", "512", "--slots", "4"], name="dist", env=DRAFTS_PAY) as d:
        with Client(d.sock) as c:
            # the model's own greedy output, which falls into a cycle: drafts are often, not always, right
            _, _, ev = c.generate(rid="g", tokens=tiny_prompt(12), temperature=0, max_tokens=100, ignore_eos=True,
                                  stream=False)
            prompt = tiny_prompt(12) + ev["tokens"]
            kw = dict(op="generate", tokens=prompt, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                      max_tokens=4, ignore_eos=True, stream=False)
            n = 600
            hist = {}
            drafted = accepted = 0
            for mode in ("off", "prompt"):
                h = Counter()
                for i in range(n):
                    seed = i if mode == "off" else 100000 + i
                    c.send(dict(kw, id=i, seed=seed, speculate={"mode": mode, "k": 3}))
                    ev = c.recv()
                    assert ev["event"] == "done", ev
                    h[tuple(ev["tokens"])] += 1
                    if mode == "prompt":
                        drafted += ev["speculate"]["drafted"]
                        accepted += ev["speculate"]["accepted"]
                hist[mode] = h
    # drafts were proposed and both accepted and rejected: the rule was exercised
    assert drafted >= n and 0.1 * drafted < accepted < 0.9 * drafted, (drafted, accepted)
    # per position, a chi-square test of homogeneity over the tokens drawn at least 20 times in both runs
    # pooled (the rest in one bin), each at 0.001 / positions
    for pos in range(kw["max_tokens"]):
        h = {md: Counter(t[pos] for t, v in hist[md].items() for _ in range(v)) for md in hist}
        pooled = h["off"] + h["prompt"]
        bins = [k for k, v in pooled.items() if v >= 20]
        rows = [[h[md][k] for k in bins] + [sum(v for k, v in h[md].items() if k not in bins)]
                for md in ("off", "prompt")]
        cols = [a + b for a, b in zip(*rows)]
        chi2 = sum((rows[r][j] - cols[j] / 2) ** 2 / (cols[j] / 2) for r in range(2) for j in range(len(cols))
                   if cols[j])
        df = len([x for x in cols if x]) - 1
        crit = chi2_sf_bound(df, 0.001 / kw["max_tokens"])
        report(f"speculative sampling, token {pos + 1}: chi2 {chi2:.1f} over {df} df (critical {crit:.1f}), "
               f"{accepted}/{drafted} drafts accepted")
        assert df >= 3, (pos, h)
        assert chi2 < crit, (pos, chi2, crit, rows)


# ---------------------------------------------------------------- through the HTTP gateway

def test_http_gateway_passes_speculate_and_counts_it(nxd2, tmp_path):
    import re

    from http_helpers import Gateway, request

    def metric(text, name):
        m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    with Gateway(nxd2.sock, tmp_path) as g:
        _, _, models = request(g, "GET", "/v1/models")
        body = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": LIST}], "max_tokens": 64,
                "temperature": 0}
        st, _, want = request(g, "POST", "/v1/chat/completions", body)
        assert st == 200, want
        _, _, before = request(g, "GET", "/metrics")
        st, _, got = request(g, "POST", "/v1/chat/completions", dict(body, speculate={"mode": "prompt", "k": 8}))
        assert st == 200, got
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        _, _, after = request(g, "GET", "/metrics")
        a = metric(after.decode(), "nxd_speculative_accepted_total")
        b = metric(before.decode(), "nxd_speculative_accepted_total")
        assert a is not None and a > b, (a, b)
        assert metric(after.decode(), "nxd_speculative_drafted_total") >= a
        for bad, field in (({"mode": "draft"}, "speculate.mode"), ("on", "speculate"), ({"k": 99}, "speculate.k")):
            st, _, err = request(g, "POST", "/v1/chat/completions", dict(body, speculate=bad))
            assert st == 400 and err["error"]["param"] == field and field in err["error"]["message"], (bad, err)


# ---------------------------------------------------------------- with an 8-bit K/V cache

def test_q8_kv_cache_identical_with_speculation(model_path, tmp_path):
    """--kv-type q8_0: a verifying step writes its drafts' K/V as Q8_0 rows, and the rows of rejected drafts
    are written again by the next step. Greedy and seeded answers of clients that speculate beside clients
    that do not are the ones each gets alone without speculation. The steps are priced as mostly fixed cost
    (DRAFTS_PAY), so that drafts ride in the shared steps whatever this host's step times say."""
    sampled = dict(temperature=0.8, top_k=40, top_p=0.95, seed=7, repeat_penalty=1.1)
    cases = [(p, kw) for p in PROMPTS for kw in ({}, sampled)]
    with Daemon(model_path, tmp_path, workers=2, args=ARGS + ["--kv-type", "q8_0"], name="spec-q8",
                env=DRAFTS_PAY) as d:
        with Client(d.sock) as c:
            want = [run(c, f"w{i}", p, spec={"mode": "off"}, max_tokens=64, **kw) for i, (p, kw) in enumerate(cases)]
        results, errors = {}, []

        def client(j):
            try:
                with Client(d.sock) as c:
                    for i in range(j, len(cases), 4):
                        p, kw = cases[i]
                        # each round two clients speculate and two do not, greedy and sampled cases both
                        speculating = (i // 4 + j) % 2 == 0
                        spec = {"mode": "prompt", "k": (4, 8, 16)[i % 3]} if speculating else {"mode": "off"}
                        results[i] = run(c, f"g{i}", p, spec=spec, max_tokens=64, **kw)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        ts = [threading.Thread(target=client, args=(j,)) for j in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        assert not errors, errors
        assert len(results) == len(cases)
        accepted = 0
        for i, got in results.items():
            assert_same(got, want[i], f"case {i}")
            accepted += got[3].get("speculate", {}).get("accepted", 0)
        assert accepted > 20, accepted  # drafts were kept: the comparison is not vacuous


# ---------------------------------------------------------------- with a runtime LoRA delta

def test_lora_runtime_delta_identical_with_speculation(tmp_path):
    """Drafts carry their sequence's adapters: with a runtime delta, speculation changes nothing either."""
    import make_lora
    from test_lora_daemon import with_tokenizer

    make_lora.build_tiny(tmp_path)
    model = with_tokenizer(tmp_path / "tiny-q4_1.gguf", tmp_path / "tiny-q4_1-tok.gguf") or \
        tmp_path / "tiny-q4_1-tok.gguf"
    with Daemon(model, tmp_path, workers=2, args=["--ctx", "512", "--slots", "3"], name="lora") as d:
        with Client(d.sock) as c:
            ev = c.request({"id": "l", "op": "lora_load", "name": "r4", "path": str(tmp_path / "tiny-r4.gguf")})
            assert ev["event"] == "lora_loaded", ev
            accepted = 0
            for j, prompt in enumerate((tiny_prompt(), tiny_prompt(60, 3))):
                base = dict(op="generate", tokens=prompt, temperature=0, logprobs=3, max_tokens=80, ignore_eos=True)
                plain = c.generate_logprobs(f"p{j}", base)
                lora = dict(base, lora=[{"name": "r4", "scale": 2.0}])
                want = c.generate_logprobs(f"w{j}", lora)
                assert want[1] != plain[1]  # the adapter is applied
                got = c.generate_logprobs(f"g{j}", dict(lora, speculate={"mode": "prompt", "k": 6}))
                assert got[:2] == want[:2], j
                accepted += got[2]["speculate"]["accepted"]
            assert accepted > 0


# ---------------------------------------------------------------- a worker's death

def test_worker_killed_while_speculating(model_path, tmp_path, plain):
    """kill -9 a worker while a speculating request decodes: the step (drafts and all) is planned again from
    the unchanged slot, and the answer is the one without speculation."""
    import os
    import signal

    with Daemon(model_path, tmp_path, workers=2, args=ARGS) as d:
        pids = d.worker_pids()
        with Client(d.sock) as c:
            c.send(dict(op="generate", id="k", prompt=CODE, raw=True, temperature=0, logprobs=2, max_tokens=96,
                        speculate={"mode": "prompt", "k": 8}))
            toks, lps, done = [], [], None
            for ev in c.events("k"):
                if ev["event"] == "token":
                    toks.append(ev["token"])
                    lps.append((ev["logprob"], [(a["token"], a["logprob"]) for a in ev["logprobs"]]))
                    if len(toks) == 5:
                        os.kill(pids[1], signal.SIGKILL)
                else:
                    done = ev
        assert done["event"] == "done", done
        assert toks == plain[CODE][0] and lps == plain[CODE][1]
        assert done["speculate"]["accepted"] > 0, done
        d.wait_log("killed by signal 9")
