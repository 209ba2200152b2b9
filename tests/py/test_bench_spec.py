"""test_bench_spec.py - the spec bench case's ceiling (bench/spec_prompts.lookup_ceiling): the fewest decode
steps any prompt-lookup drafter could take over a greedy answer, the yardstick its tokens-per-step row
holds nxd's drafting to."""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import spec_prompts  # noqa: E402


def latest_match_steps(prompt, answer, k, n_max=3):
    """Steps of one concrete drafter (spec.c's lookup without its cost rule): the tokens after the latest
    earlier occurrence of the last n = n_max .. 1 tokens, up to k; the right ones and the next token emitted."""
    hist = list(prompt) + list(answer[:1])
    pos, steps = 1, 0
    while pos < len(answer):
        draft = []
        for n in range(n_max, 0, -1):
            if len(hist) <= n:
                continue
            suf = hist[-n:]
            i = next((i for i in range(len(hist) - n - 1, -1, -1) if hist[i:i + n] == suf), -1)
            if i >= 0:
                draft = hist[i + n:i + n + k]
                break
        run = 0
        while run < len(draft) and pos + run < len(answer) and draft[run] == answer[pos + run]:
            run += 1
        hist += answer[pos:pos + run + 1]
        pos += run + 1
        steps += 1
    return steps


def test_an_answer_that_copies_its_prompt_takes_a_step_per_k_plus_one_tokens():
    prompt = list(range(100, 140))
    answer = prompt[:]  # the first token from the prompt's step, then 39 to decode
    assert spec_prompts.lookup_ceiling(prompt, answer, 8) == (5, 39)  # 9 + 9 + 9 + 9 + 3
    assert spec_prompts.lookup_ceiling(prompt, answer, 1) == (20, 39)


def test_an_answer_that_repeats_nothing_takes_a_step_per_token():
    assert spec_prompts.lookup_ceiling([1, 2, 3], [10, 11, 12, 13, 14], 8) == (4, 4)
    assert spec_prompts.lookup_ceiling([1, 2, 3], [10], 8) == (0, 0)


def test_no_lookup_drafter_takes_fewer_steps():
    rnd = random.Random(7)
    for trial in range(300):
        vocab = rnd.randint(3, 12)
        prompt = [rnd.randrange(vocab) for _ in range(rnd.randint(1, 40))]
        # answers that copy stretches of what came before, with changes
        answer = []
        while len(answer) < rnd.randint(1, 60):
            hist = prompt + answer
            if rnd.random() < 0.6:
                i = rnd.randrange(len(hist))
                answer += hist[i:i + rnd.randint(1, 10)]
            else:
                answer.append(rnd.randrange(vocab))
        k = rnd.randint(1, 16)
        steps, toks = spec_prompts.lookup_ceiling(prompt, answer, k)
        assert toks == len(answer) - 1
        assert steps <= latest_match_steps(prompt, answer, k), (prompt, answer, k)
        assert steps <= latest_match_steps(prompt, answer, k, n_max=1), (prompt, answer, k)
