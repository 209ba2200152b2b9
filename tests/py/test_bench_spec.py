"""test_bench_spec.py - the spec bench case's yardsticks for nxd's tokens per step: the fewest decode steps any
prompt-lookup drafter could take over a greedy answer (bench/spec_prompts.lookup_ceiling), and the steps of
spec.c's lookup drafting k every step (lookup_steps)."""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import spec_prompts  # noqa: E402


def test_an_answer_that_copies_its_prompt_takes_a_step_per_k_plus_one_tokens():
    prompt = list(range(100, 140))
    answer = prompt[:]  # the first token from the prompt's step, then 39 to decode
    assert spec_prompts.lookup_ceiling(prompt, answer, 8) == (5, 39)  # 9 + 9 + 9 + 9 + 3
    assert spec_prompts.lookup_ceiling(prompt, answer, 1) == (20, 39)


def test_an_answer_that_repeats_nothing_takes_a_step_per_token():
    assert spec_prompts.lookup_ceiling([1, 2, 3], [10, 11, 12, 13, 14], 8) == (4, 4)
    assert spec_prompts.lookup_ceiling([1, 2, 3], [10], 8) == (0, 0)
    assert spec_prompts.lookup_steps([1, 2, 3], [10, 11, 12, 13, 14], 8) == (4, 4)


def test_the_latest_match_can_be_the_wrong_one():
    # the answer's first token 1 was last followed by 8: lookup drafts 8 (wrong), emits 2; then "1 2" is
    # found at the start and 3 4 copied. Looking at one token only, "2" was last followed by 9: wrong again.
    # The ceiling takes the first 1, whose 2 3 4 are all right.
    prompt = [1, 2, 3, 4, 1, 8, 2, 9]
    answer = [1, 2, 3, 4]
    assert spec_prompts.lookup_steps(prompt, answer, 8) == (2, 3)
    assert spec_prompts.lookup_steps(prompt, answer, 8, n_max=1) == (3, 3)
    assert spec_prompts.lookup_ceiling(prompt, answer, 8) == (1, 3)


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
        assert steps <= spec_prompts.lookup_steps(prompt, answer, k)[0], (prompt, answer, k)
        assert steps <= spec_prompts.lookup_steps(prompt, answer, k, n_max=1)[0], (prompt, answer, k)
