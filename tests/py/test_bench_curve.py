"""test_bench_curve.py - the clients curve (bench/curve.py) measures the server while every client decodes:
the late arrivals' prefill and the tail where few clients are left count in the burst rate only."""
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import curve  # noqa: E402


def client(first, n, gap):
    return {"times": [first + k * gap for k in range(n)]}


def test_steady_rate_counts_only_the_window_where_all_decode():
    # a starts at 0, b after a 5 s prefill; a token a second each; a ends at 9, b at 14
    rr = [client(0, 10, 1.0), client(5, 10, 1.0)]
    assert curve.window(rr) == (5, 9)
    assert curve.steady_rate(rr) == pytest.approx(8 / 4)  # 6, 7, 8, 9 of each
    assert curve.burst_rate(rr) == pytest.approx(18 / 14)


def test_gaps_inside_the_window_leave_out_the_stagger():
    # b's gaps are 3 s apart before a joins, 1 s while both decode
    a = client(10, 6, 1.0)
    b = {"times": [0, 3, 6, 9, 10, 11, 12, 13, 14, 15]}
    t0, t1 = curve.window([a, b])
    assert (t0, t1) == (10, 15)
    assert sorted(curve.gaps([a, b], t0, t1)) == [1.0] * 10
    assert 3 in curve.gaps([a, b])


def test_level_falls_back_to_the_burst_when_clients_never_overlap():
    # an engine that serves one client after the other: no moment when both decode
    rr = [client(0, 5, 1.0), client(10, 5, 1.0)]
    assert curve.steady_rate(rr) is None
    out = curve.level(lambda ps: rr, [None, None], reps=1)
    assert out["tok_s"] == pytest.approx(curve.burst_rate(rr)) == pytest.approx(8 / 14)
    assert out["burst_tok_s"] == out["tok_s"]
    assert out["p50_ms"] == pytest.approx(1000.0)


def test_counters_read_this_process_cpu_and_the_steps():
    steps = iter([10, 75])
    read = curve.counters(lambda: [os.getpid()], lambda: next(steps))
    a = read()
    t = time.process_time()
    while time.process_time() - t < 0.05:  # 50 ms of CPU
        pass
    b = read()
    assert b["server_cpu_ms"] - a["server_cpu_ms"] >= 40
    assert b["workers_cpu_ms"] == a["workers_cpu_ms"] == 0
    lv = curve.per_level(a, b, n_tokens=130)
    assert lv["steps"] == 65 and lv["tokens_per_step"] == pytest.approx(2.0)
    assert lv["supervisor_cpu_us_per_step"] == pytest.approx((b["server_cpu_ms"] - a["server_cpu_ms"]) * 1e3 / 65)
    assert lv["cpu_ms_per_token"] == pytest.approx((b["server_cpu_ms"] - a["server_cpu_ms"]) / 130)


def test_counters_without_steps_give_cpu_per_token_only():
    # llama-server: one process, no step count
    read = curve.counters(lambda: [os.getpid()])
    a = read()
    b = dict(a, server_cpu_ms=a["server_cpu_ms"] + 30.0)
    assert curve.per_level(a, b, n_tokens=10) == {"cpu_ms_per_token": pytest.approx(3.0)}
