"""test_spec_draft.py - speculative decoding with a draft model (nxd --draft-model): the output is the one without
speculation, token for token and logprob for logprob, whatever the draft; seeded sampling draws the same tokens;
a draft of another vocabulary, and mode draft without a draft model, are refused by name."""
import os
import signal
import subprocess
import threading
import time

import pytest

import make_tiny
from conftest import build_dir
from nxd_helpers import Client, Daemon

N_VOCAB = 300
ARGS = ["--ctx", "512", "--slots", "4"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The model; an unrelated draft of its vocabulary (another seed, smaller, another family); a second model
    in another weight type."""
    d = tmp_path_factory.mktemp("draft")
    main = make_tiny.build(d / "main.gguf", arch="llama", wtype="Q8_0", vocab=True, seed=3, n_vocab=N_VOCAB)
    other = make_tiny.build(d / "other.gguf", arch="qwen2", wtype="Q4_0", vocab=True, seed=11, n_vocab=N_VOCAB,
                            dim=128, n_layer=1, n_ff=256, n_head=2, n_head_kv=1)
    main2 = make_tiny.build(d / "main2.gguf", arch="qwen2", wtype="Q4_K", vocab=True, seed=5, n_vocab=N_VOCAB)
    return dict(dir=d, main=main, other=other, main2=main2)


def prompt(n=40, period=7):
    return [1] + [259 + (i % period) * 5 for i in range(n)]


PROMPTS = [prompt(), prompt(60, 3), [1, N_VOCAB - 5, 270], prompt(150, 8)]


# The drafts here come from the target itself (or a model as big as it): by their measured cost such a
# draft never pays (a draft step costs a target step), and nxd would draft only now and then (spec.c). Most
# daemons here are told a draft step costs a hundredth of a target step, as for a small draft and its target.
CHEAP = {"NXD_TEST_SPEC_FIT": "1e-2,1e-4,0/1e-4,1e-6,0"}


def greedy(toks, **kw):
    return dict(dict(op="generate", tokens=toks, temperature=0, logprobs=3, max_tokens=80, ignore_eos=True), **kw)


@pytest.fixture(scope="module")
def plain(models, tmp_path_factory):
    """Each prompt's greedy answer from the model without a draft model loaded at all."""
    with Daemon(models["main"], tmp_path_factory.mktemp("plain"), workers=2, args=ARGS, name="plain") as d:
        with Client(d.sock) as c:
            return [c.generate_logprobs(f"p{j}", greedy(p)) for j, p in enumerate(PROMPTS)]


def drafted(dn):
    sp = dn["speculate"]
    assert sp["mode"] == "draft" and 0 <= sp["accepted"] <= sp["drafted"], sp
    return sp["drafted"], sp["accepted"]


@pytest.mark.parametrize("workers", [1, 2])
def test_draft_is_the_model_itself(models, plain, tmp_path, workers):
    """The model drafting for itself: nearly every draft is accepted, and the answer is the plain one."""
    with Daemon(models["main"], tmp_path, workers=workers, args=ARGS + ["--draft-model", str(models["main"])],
                name="self", env=CHEAP) as d:
        with Client(d.sock) as c:
            n_d = n_a = 0
            for j, p in enumerate(PROMPTS):
                for k in (1, 4, 16):
                    got = c.generate_logprobs(f"g{j}.{k}", greedy(p, speculate={"mode": "draft", "k": k}))
                    assert got[:2] == plain[j][:2], (j, k)
                    a, b = drafted(got[2])
                    n_d, n_a = n_d + a, n_a + b
                off = c.generate_logprobs(f"o{j}", greedy(p))
                assert off[:2] == plain[j][:2] and "speculate" not in off[2]
            assert n_d > 300 and n_a > 0.95 * n_d, (n_d, n_a)
            st = c.request({"op": "status", "id": "st"})["speculate"]
            assert st["draft_model"] == "main.gguf" and st["draft_steps"] > 0, st
            m = st["modes"]["draft"]
            assert m["drafted"] == n_d and m["accepted"] == n_a and m["acceptance"] > 0.95, st
            assert st["modes"]["prompt"]["drafted"] == 0, st


def test_unrelated_draft(models, plain, tmp_path):
    """A random draft of the same vocabulary (another family, another type, Q4_0): few drafts accepted, the answer
    unchanged; the back-off keeps it from drafting at every step."""
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["other"])],
                name="other", env=CHEAP) as d:
        with Client(d.sock) as c:
            n_d = n_a = 0
            for j, p in enumerate(PROMPTS):
                got = c.generate_logprobs(f"g{j}", greedy(p, speculate={"mode": "draft", "k": 8}))
                assert got[:2] == plain[j][:2], j
                a, b = drafted(got[2])
                n_d, n_a = n_d + a, n_a + b
            assert n_d > 0 and n_a < 0.5 * n_d, (n_d, n_a)
            assert n_d < 8 * 80 * len(PROMPTS) / 4, n_d  # backed off: far fewer than k a step


def test_default_speculate_draft_and_prompt_cache(models, plain, tmp_path):
    """--speculate draft:K makes it every request's default; a request that reuses a slot's K/V (the same
    prompt again, or a longer one) has the draft catch up on what its cache lacks."""
    args = ARGS + ["--draft-model", str(models["main"]), "--speculate", "draft:5"]
    with Daemon(models["main"], tmp_path, workers=2, args=args, name="dflt", env=CHEAP) as d:
        with Client(d.sock) as c:
            st = c.request({"op": "status", "id": "st"})["speculate"]
            assert st["default"] == "draft" and st["k"] == 5, st
            for r in range(2):
                for j, p in enumerate(PROMPTS):
                    got = c.generate_logprobs(f"g{r}.{j}", greedy(p))
                    assert got[:2] == plain[j][:2], (r, j)
                    assert drafted(got[2])[1] > 0
            # a prompt that continues a finished one (the prompt cache keeps its slot's K/V)
            longer = PROMPTS[0] + plain[0][0][:30]
            want = c.generate_logprobs("w", greedy(longer, speculate={"mode": "off"}))
            got = c.generate_logprobs("l", greedy(longer))
            assert got[:2] == want[:2]
            # prompt lookup still works beside it
            got = c.generate_logprobs("pl", greedy(PROMPTS[1], speculate={"mode": "prompt"}))
            assert got[:2] == plain[1][:2] and got[2]["speculate"]["mode"] == "prompt"


def test_stops_and_context_end(models, tmp_path):
    """max_tokens inside a run of accepted drafts and the end of the context end the answer where they do
    without speculation."""
    args = ["--ctx", "256", "--slots", "2", "--draft-model", str(models["main"])]
    with Daemon(models["main"], tmp_path, workers=2, args=args, name="end", env=CHEAP) as d:
        with Client(d.sock) as c:
            base = greedy(prompt(200, 7), max_tokens=200)
            want = c.generate_logprobs("w", base)
            assert want[2]["reason"] == "length" and len(want[0]) == 256 - 201 + 1, want[2]
            got = c.generate_logprobs("g", dict(base, speculate={"mode": "draft", "k": 16}))
            assert got[:2] == want[:2] and got[2]["reason"] == "length"
            for n in (1, 2, 3, 7, 13, 17, 33):
                got = c.generate_logprobs(f"m{n}", dict(base, max_tokens=n, speculate={"mode": "draft", "k": 16}))
                assert got[:2] == (want[0][:n], want[1][:n]) and got[2]["usage"]["completion_tokens"] == n, n


@pytest.mark.parametrize("mixed", [False, True], ids=["cost-rule", "mixed-steps"])
def test_beside_clients_that_do_not_speculate(models, plain, tmp_path, mixed):
    """Clients that do not speculate get what they get alone while others draft with the draft model, and
    those get theirs: under the rule on what drafts may cost the others, and with drafts riding in every shared
    step (NXD_TEST_SPEC_SHARED), so that decode tokens, prompt chunks and drafts share steps."""
    results, errors = {}, []

    def client(i, spec):
        try:
            with Client(d.sock) as c:
                for r in range(2):
                    j = (i + r) % len(PROMPTS)
                    req = greedy(PROMPTS[j], **({"speculate": spec} if spec else {}))
                    results[(i, r)] = (j, c.generate_logprobs(f"c{i}.{r}", req))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    env = dict(CHEAP, **({"NXD_TEST_SPEC_SHARED": "1"} if mixed else {}))
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="mix", env=env) as d:
        specs = [{"mode": "draft", "k": 8}, None, {"mode": "draft", "k": 3}, {"mode": "off"}, {"mode": "prompt"},
                 None]
        ts = [threading.Thread(target=client, args=(i, s)) for i, s in enumerate(specs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
    assert not errors, errors
    assert len(results) == 2 * len(specs)
    n_a = 0
    for (i, r), (j, got) in results.items():
        assert got[:2] == plain[j][:2], (i, r)
        if specs[i] and specs[i]["mode"] == "draft":
            n_a += drafted(got[2])[1]
    if mixed:
        assert n_a > 100, n_a


def test_a_costly_draft_does_not_draft_beside_others(models, tmp_path):
    """Beside a client that does not speculate, drafting may add at most a few percent to the steps it shares
    (the draft steps counted): a draft whose steps cost a fifth of the model's (the fits pinned so) drafts
    alone, where that pays, and nothing while the other client decodes."""
    fits = {"NXD_TEST_SPEC_FIT": "1e-2,1e-4,0/2e-3,1e-5,0"}
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="cost", env=fits) as d:
        with Client(d.sock) as c:
            for r in range(3):
                assert drafted(c.generate_logprobs(f"a{r}", greedy(PROMPTS[r % 2], speculate={"mode": "draft"}))[2])[1] > 0
        seen, other = threading.Event(), {}

        def long_client():
            with Client(d.sock) as c2:
                c2.send(dict(greedy([1, 270, 280], max_tokens=400), id="long"))
                n = 0
                for ev in c2.events("long"):
                    n += 1
                    if n == 20:
                        seen.set()
                other["done_t"] = time.monotonic()
                other["ev"] = ev

        th = threading.Thread(target=long_client)
        th.start()
        assert seen.wait(60)
        with Client(d.sock) as c:
            got = c.generate_logprobs("b", greedy(PROMPTS[0], max_tokens=30, speculate={"mode": "draft", "k": 8}))
            t_end = time.monotonic()
        th.join(120)
        assert other["ev"]["event"] == "done" and t_end < other["done_t"], "the other client ended first"
        assert drafted(got[2]) == (0, 0), got[2]


def test_a_draft_that_cannot_pay_is_seldom_probed(models, plain, tmp_path):
    """A draft model whose drafts would not pay even were every one right (the fits pinned so: a draft step
    costs a second, a step of the model a millisecond) is tried once in a while for the whole daemon, not once
    per request: each try first catches the draft's cache up on all the tokens it has not seen, so waiting
    longer between tries would not make them cheaper. The answers are the plain ones."""
    fits = {"NXD_TEST_SPEC_FIT": "1e-3,1e-5,0/1,1e-5,0"}
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="dear", env=fits) as d:
        with Client(d.sock) as c:
            n_d = 0
            for r in range(2):
                for j, p in enumerate(PROMPTS):
                    got = c.generate_logprobs(f"g{r}.{j}", greedy(p, speculate={"mode": "draft", "k": 8}))
                    assert got[:2] == plain[j][:2], (r, j)
                    n_d += drafted(got[2])[0]
            assert n_d <= 1, n_d
            assert c.request({"op": "status", "id": "st"})["speculate"]["draft_steps"] <= 2


def test_a_request_starts_from_the_draft_models_record(models, plain, tmp_path):
    """How often a draft model is right is its own and the model's, not one request's: a request's estimate
    starts from the recent requests'. With the fits pinned so that drafts right half the time would not pay and
    drafts nearly always right would, the first request has to find out by probes, step by step; the same
    request again drafts from its first step, so more drafts and fewer steps, and the same answer."""
    fits = {"NXD_TEST_SPEC_FIT": "1e-2,1e-4,0/6e-3,1e-5,0"}
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="record", env=fits) as d:
        with Client(d.sock) as c:
            got = []
            for r in range(2):
                s0 = c.request({"op": "status", "id": f"s{r}"})["steps"]
                g = c.generate_logprobs(f"g{r}", greedy(PROMPTS[3], speculate={"mode": "draft", "k": 8}))
                assert g[:2] == plain[3][:2], r
                got.append((drafted(g[2]), c.request({"op": "status", "id": f"t{r}"})["steps"] - s0))
    (d1, a1), n1 = got[0]
    (d2, a2), n2 = got[1]
    assert a1 > 0.9 * d1 and a2 > 0.9 * d2, got
    assert d2 > d1 and n2 < n1, got


def test_seeded_sampling_identical(models, tmp_path):
    """The same seed draws the same tokens with draft speculation on or off: each row is sampled as it would be
    one at a time, and a draft (the draft's argmax, a point mass) is kept only when it is the token drawn."""
    for draft in ("main", "other"):
        args = ARGS + ["--draft-model", str(models[draft])]
        with Daemon(models["main"], tmp_path, workers=2, args=args, name=f"seed-{draft}", env=CHEAP) as d:
            with Client(d.sock) as c:
                n_a = 0
                for seed in range(6):
                    kw = dict(temperature=0.7, top_k=40, top_p=0.95, seed=seed, max_tokens=48, repeat_penalty=1.1,
                              presence_penalty=0.3)
                    want = c.generate_logprobs(f"w{seed}", greedy(PROMPTS[seed % 2], **kw))
                    got = c.generate_logprobs(f"g{seed}", greedy(PROMPTS[seed % 2], speculate={"mode": "draft", "k": 6}, **kw))
                    assert got[:2] == want[:2], (draft, seed)
                    n_a += drafted(got[2])[1]
                if draft == "main":
                    assert n_a > 20, n_a


def test_another_model_and_type(models, tmp_path):
    """A qwen2 Q4_K model with a llama Q8_0 draft (and itself): the answer is its own."""
    for draft in ("main", "main2"):
        args = ARGS + ["--draft-model", str(models[draft])]
        with Daemon(models["main2"], tmp_path, workers=2, args=args, name=f"m2-{draft}", env=CHEAP) as d:
            with Client(d.sock) as c:
                for j, p in enumerate(PROMPTS[:2]):
                    want = c.generate_logprobs(f"w{j}", greedy(p))
                    got = c.generate_logprobs(f"g{j}", greedy(p, speculate={"mode": "draft", "k": 8}))
                    assert got[:2] == want[:2], (draft, j)
                    if draft == "main2":
                        assert drafted(got[2])[1] > 0.9 * drafted(got[2])[0]


@pytest.mark.parametrize("extra", [["--mmap"], ["--kv-type", "q8_0"], ["--activations", "fast", "--slots", "1"]],
                         ids=["mmap", "kv-q8_0", "fast-1slot"])
def test_options_apply_to_the_draft_too(models, tmp_path, extra):
    """The draft model is mapped like the model with --mmap, its K/V stored as --kv-type says, one slot is
    enough: the answer is the one of the same options without speculation."""
    args = ["--ctx", "512", "--slots", "4"] + extra + ["--draft-model", str(models["other"])]
    with Daemon(models["main"], tmp_path, workers=2, args=args, name="opt", env=CHEAP) as d:
        with Client(d.sock) as c:
            for j, p in enumerate(PROMPTS[:2]):
                want = c.generate_logprobs(f"w{j}", greedy(p))
                got = c.generate_logprobs(f"g{j}", greedy(p, speculate={"mode": "draft", "k": 8}))
                assert got[:2] == want[:2], j
                assert drafted(got[2])[0] > 0
            st = c.request({"op": "status", "id": "st"})
            assert st["speculate"]["draft_model"] == "other.gguf", st


def test_worker_killed_while_drafting(models, plain, tmp_path):
    """kill -9 a worker while a request drafts (draft steps and verification steps alternate): the step is run
    again from the unchanged slots, and the answer is the plain one."""
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="kill", env=CHEAP) as d:
        for kill_at in (3, 20, 41):
            pids = d.worker_pids()
            with Client(d.sock) as c:
                c.send(dict(greedy(PROMPTS[3], speculate={"mode": "draft", "k": 4}), id="k"))
                toks, lps, done = [], [], None
                for ev in c.events("k"):
                    if ev["event"] == "token":
                        toks.append(ev["token"])
                        lps.append((ev["logprob"], [(a["token"], a["logprob"]) for a in ev["logprobs"]]))
                        if len(toks) == kill_at:
                            os.kill(pids[kill_at % 2], signal.SIGKILL)
                    else:
                        done = ev
            assert done["event"] == "done", done
            assert (toks, lps) == plain[3][:2], kill_at
            assert drafted(done)[1] > 0
            d.wait_log("killed by signal 9")


def test_worker_scribbling_on_the_draft_models_state(models, plain, tmp_path):
    """A worker writes on the step's model word, the draft model's state struct or its scratch struct (then
    hangs): the supervisor's checks find it, every worker is killed and the block rewritten, the step runs again,
    and the answer is the plain one."""
    scribbles = [("step_model", "the step's model word is 32767"),
                 ("draft_state", "the workers' draft-model state struct changed"),
                 ("draft_scratch", "worker 0's draft-model scratch struct changed")]
    env = dict(CHEAP, NXD_TEST_WORKER_SCRIBBLE=",".join(f for f, _ in scribbles) + ":25")
    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="scribble", env=env) as d:
        for k, (field, msg) in enumerate(scribbles):
            for r in range(4):
                with Client(d.sock) as c:
                    got = c.generate_logprobs(f"s{k}.{r}", greedy(PROMPTS[3], speculate={"mode": "draft", "k": 4}))
                assert got[:2] == plain[3][:2], (field, r)
                if f"scribbling on {field}," in d.log():
                    break
            d.wait_log("control block inconsistent: " + msg)
        assert d.log().count("control block rewritten") == len(scribbles)
        assert "step watchdog" not in d.log()


def test_real_model_drafting_for_itself(model_path, tmp_path):
    """The real model (NXD_MODEL) as its own draft, through its chat template: greedy chat answers, ending
    at the end-of-turn token or a stop string inside a run of accepted drafts, are the ones without."""
    prompts = ["Repeat this list exactly:\n1. apples\n2. bananas\n3. cherries\n4. dates\n\nHere is the list again:",
               "Once upon a time"]
    with Daemon(model_path, tmp_path, workers=2, args=["--ctx", "1024", "--slots", "2", "--draft-model",
                                                       str(model_path)], name="real", env=CHEAP) as d:
        with Client(d.sock) as c:
            for j, p in enumerate(prompts):
                for extra in ({}, {"stop": ["3."]}):
                    base = dict(op="generate", prompt=p, temperature=0, logprobs=2, max_tokens=96, **extra)
                    want = c.generate_logprobs(f"w{j}", base)
                    got = c.generate_logprobs(f"g{j}", dict(base, speculate={"mode": "draft", "k": 6}))
                    assert got[:2] == want[:2] and got[2]["reason"] == want[2]["reason"], (j, extra)
                    n_d, n_a = drafted(got[2])
                    assert n_a == n_d > 0, got[2]  # the same model: every draft is its own greedy token


# ---------------------------------------------------------------- refusals

def refused_at_start(model, tmp_path, *args):
    r = subprocess.run([str(build_dir() / "nxd"), "--model", str(model), "--socket", str(tmp_path / "s"),
                        "--workers", "1", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stderr
    return r.stderr


def vocab_variant(tmp_path, name, edit):
    """A small draft whose vocabulary is the tiny one edited by edit(tokens, types)."""
    orig = make_tiny.add_vocab

    def add_vocab(w, n_vocab):
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        toks += [f"\u2581w{i}" for i in range(n_vocab - len(toks))]
        types = [2, 3, 3] + [6] * 256 + [1] * (len(toks) - 259)
        edit(toks, types)
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([0.0] * len(toks))
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)

    make_tiny.add_vocab = add_vocab
    try:
        return make_tiny.build(tmp_path / name, vocab=True, seed=9, n_vocab=N_VOCAB, dim=128, n_layer=1, n_ff=256)
    finally:
        make_tiny.add_vocab = orig


def test_draft_of_another_vocabulary_is_refused(models, tmp_path):
    fewer = make_tiny.build(tmp_path / "fewer.gguf", vocab=True, seed=9, n_vocab=N_VOCAB - 1, dim=128, n_layer=1,
                            n_ff=256)
    err = refused_at_start(models["main"], tmp_path, "--draft-model", str(fewer))
    assert "--draft-model" in err and "vocabulary is not the model's" in err and "299" in err, err

    def piece(toks, types):
        toks[280] = "\u2581x21"

    err = refused_at_start(models["main"], tmp_path, "--draft-model", str(vocab_variant(tmp_path, "p.gguf", piece)))
    assert "token 280 is \"\u2581x21\", the model's \"\u2581w21\"" in err, err

    def kind(toks, types):
        types[290] = 4

    err = refused_at_start(models["main"], tmp_path, "--draft-model", str(vocab_variant(tmp_path, "t.gguf", kind)))
    assert "token 290" in err and "tokenizer.ggml.token_type" in err, err
    # the same edit-free variant is accepted: the refusals are the edits'
    with Daemon(models["main"], tmp_path, workers=1,
                args=ARGS + ["--draft-model", str(vocab_variant(tmp_path, "same.gguf", lambda a, b: None))],
                name="same") as d:
        assert d.status()["speculate"]["draft_model"] == "same.gguf"


def test_draft_the_loader_refuses(models, tmp_path):
    """The draft goes through the model's loader: a key it refuses is refused for the draft too."""
    def bad(meta, tensors):
        meta["llama.attention.layer_norm_rms_epsilon"] = ("str", "x")

    m = make_tiny.build(tmp_path / "bad.gguf", vocab=True, seed=9, n_vocab=N_VOCAB, dim=128, n_layer=1, n_ff=256,
                        mutate=bad)
    err = refused_at_start(models["main"], tmp_path, "--draft-model", str(m))
    assert "--draft-model" in err and "layer_norm_rms_epsilon" in err, err
    err = refused_at_start(models["main"], tmp_path, "--draft-model", str(tmp_path / "missing.gguf"))
    assert "--draft-model" in err and "missing.gguf" in err, err


def test_mode_draft_without_a_draft_model(models, tmp_path):
    with Daemon(models["main"], tmp_path, workers=1, args=ARGS, name="none") as d:
        with Client(d.sock) as c:
            ev = c.request(dict(greedy(PROMPTS[0]), id="x", speculate={"mode": "draft"}))
            assert ev["event"] == "error" and ev["code"] == "bad_request", ev
            assert "--draft-model" in ev["message"] and "speculate.mode" in ev["message"], ev
            st = c.request({"op": "status", "id": "st"})["speculate"]
            assert st["draft_model"] is None and st["draft_steps"] == 0, st
            toks, _, ev = c.generate(rid="ok", tokens=PROMPTS[0], max_tokens=2, temperature=0)
            assert ev["event"] == "done" and len(toks) == 2
    r = subprocess.run([str(build_dir() / "nxd"), "--model", str(models["main"]), "--socket", str(tmp_path / "s"),
                        "--speculate", "draft:4"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--draft-model" in r.stderr, r.stderr


def test_http_metrics_count_the_draft_models_drafts(models, tmp_path):
    """The gateway's /metrics reads them from status: by source, the draft model's drafts under `draft`."""
    import re

    from http_helpers import Gateway, request

    def metric(text, name):
        m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    with Daemon(models["main"], tmp_path, workers=2, args=ARGS + ["--draft-model", str(models["main"])],
                name="http", env=CHEAP) as d:
        with Client(d.sock) as c:
            got = c.generate_logprobs("g", greedy(PROMPTS[0], speculate={"mode": "draft", "k": 4}))
            n_d, n_a = drafted(got[2])
            assert n_a > 0
        with Gateway(d.sock, tmp_path) as g:
            _, _, body = request(g, "GET", "/metrics")
            text = body.decode()
            assert metric(text, 'nxd_speculative_accepted_by_source_total{source="draft"}') == n_a, text
            assert metric(text, 'nxd_speculative_drafted_by_source_total{source="draft"}') == n_d, text
            assert metric(text, 'nxd_speculative_drafted_by_source_total{source="prompt"}') == 0, text
            assert metric(text, "nxd_speculative_accepted_total") == n_a, text
