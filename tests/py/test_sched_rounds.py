"""test_sched_rounds.py - continuous batching packs every decoding sequence into each step: N clients
decoding together take one step per token, not one per client, and each step carries all N."""
import json
import math

import pytest

from nxd_helpers import Client, Daemon

N = 16       # clients decoding together
BATCH = 32   # the step's token budget (--batch)
PROMPT = 4   # tokens of each prompt
T = 32       # tokens each client generates


@pytest.fixture(scope="module")
def nxd16(model_path, tmp_path_factory):
    with Daemon(model_path, tmp_path_factory.mktemp("rounds"), workers=2,
                args=["--ctx", "512", "--slots", str(N), "--batch", str(BATCH)]) as d:
        yield d


def test_n_decoders_take_one_step_per_token(nxd16):
    with Client(nxd16.sock, timeout=300) as c:
        before = c.request({"op": "status", "id": "s0"})
        assert before["event"] == "status", before
        # Prompts that share no beginning, so none waits for another's K/V;
        # all sent in one write, so they are admitted between the same two steps.
        reqs = [{"op": "generate", "id": i, "tokens": [100 + i, 200 + i, 300 + i, 400 + i], "max_tokens": T,
                 "temperature": 0, "ignore_eos": True, "stream": False} for i in range(N)]
        c.send(b"".join((json.dumps(r) + "\n").encode() for r in reqs))
        done = {}
        while len(done) < N:
            ev = c.recv()
            assert ev is not None, "connection closed"
            assert ev["event"] == "done", ev
            done[ev["id"]] = ev
        after = c.request({"op": "status", "id": "s1"})
    for i, ev in done.items():
        assert ev["usage"]["completion_tokens"] == T, (i, ev["usage"])
    steps = after["steps"] - before["steps"]
    # Each step that still has prompt tokens to feed carries at least BATCH - N of them; after the
    # last prompt, the last client's T tokens need at most T steps; one more for the first request
    # admitted alone. A step per client and token would be N * T.
    bound = 1 + math.ceil(N * PROMPT / (BATCH - N)) + T
    assert T <= steps <= bound, f"{N} clients x {T} tokens took {steps} steps (at most {bound} expected)"
    assert after["sequences_per_step"]["max"] == N, after["sequences_per_step"]
