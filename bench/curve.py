"""curve.py - how cost grows with clients: 1 .. 64 concurrent greedy clients on one server of 64 slots,
aggregate decode tok/s and the p50 / p99 time per token, nxd against llama-server, and its PNG.

A level's clients are sent at once (one connection and thread each, as the concurrent case). What is
measured is the server with N sequences decoding: the window from the last client's first token (every
client is decoding) to the first client's last token (none has finished yet). Its aggregate tok/s is
the tokens that arrive in that window over its length; its time per token is the gap between one
client's consecutive tokens inside it, pooled over all clients of the level (p50, p99). The span from
the first client's first token to the last client's last (the burst, which adds the late arrivals'
prefill and the tail where few clients are left) is kept as burst_tok_s. Each level is the median of
its repetitions.

Beside the clock, counters that other load does not move (counters(), below): the server's CPU time
per token and per step, and for nxd its forward steps per level, from its status."""
import os
import statistics

LEVELS = (1, 2, 4, 8, 16, 32, 64)


def gaps(results, t0=float("-inf"), t1=float("inf")):
    """Gaps between one client's consecutive tokens, pooled; only gaps that end in (t0, t1]."""
    out = []
    for r in results:
        t = r["times"]
        out += [b - a for a, b in zip(t, t[1:]) if t0 < b <= t1]
    return out


def window(results):
    """(t0, t1): from the last client's first token to the first client's last; t1 <= t0 when the
    clients never all decoded at once."""
    rr = [r for r in results if len(r["times"]) >= 2]
    return max(r["times"][0] for r in rr), min(r["times"][-1] for r in rr)


def steady_rate(results):
    """Tokens per second while every client decodes: the tokens that arrive in window(), over its
    length; None when there is no such window."""
    t0, t1 = window(results)
    if t1 <= t0:
        return None
    n = sum(1 for r in results for t in r["times"] if t0 < t <= t1)
    return n / (t1 - t0)


def burst_rate(results):
    """Every client's decode tokens (all after its first) over the span from the first client's first
    token to the last client's last."""
    rr = [r for r in results if len(r["times"]) >= 2]
    span = max(r["times"][-1] for r in rr) - min(r["times"][0] for r in rr)
    return sum(len(r["times"]) - 1 for r in rr) / span


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def cpu_ns(pids):
    """{pid: (ns on a CPU, ns waiting for one)} summed over each process's live threads
    (/proc/PID/task/TID/schedstat); a process that is gone counts nothing."""
    out = {}
    for pid in pids:
        run = wait = 0
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            tids = []
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    x = f.read().split()
            except OSError:
                continue
            run += int(x[0])
            wait += int(x[1])
        out[pid] = (run, wait)
    return out


def counters(pids, steps=None):
    """A counters() callable for level(): the CPU and run-queue time of the server's processes (the
    first pid is the one that serves the sockets, the rest its workers, if any) and, given steps()
    (nxd's status `steps`), its forward steps."""
    def read():
        c = cpu_ns(pids())
        ps = list(c)
        out = {"server_cpu_ms": c[ps[0]][0] / 1e6 if ps else 0.0,
               "workers_cpu_ms": sum(c[p][0] for p in ps[1:]) / 1e6,
               "workers_wait_ms": sum(c[p][1] for p in ps[1:]) / 1e6}
        if steps:
            out["steps"] = steps()
        return out
    return read


def per_level(before, after, n_tokens):
    """The counters' growth over one run, per token and (with steps) per step."""
    d = {k: after[k] - before[k] for k in after}
    out = {"cpu_ms_per_token": (d["server_cpu_ms"] + d["workers_cpu_ms"]) / n_tokens}
    if "steps" in d and d["steps"] > 0:
        out["steps"] = d["steps"]
        out["tokens_per_step"] = n_tokens / d["steps"]
        out["supervisor_cpu_us_per_step"] = d["server_cpu_ms"] * 1e3 / d["steps"]
        out["workers_cpu_ms_per_step"] = d["workers_cpu_ms"] / d["steps"]
        out["workers_wait_ms_per_step"] = d["workers_wait_ms"] / d["steps"]
    return out


def level(run_many, prompts, reps, counters=None):
    """run_many(prompts) -> per-client results (each with "times"). Medians of reps runs.
    counters: a callable as counters() returns, read before and after each run."""
    aggs, bursts, p50s, p99s, server = [], [], [], [], []
    for _ in range(reps):
        c0 = counters() if counters else None
        rr = run_many(prompts)
        if counters:
            server.append(per_level(c0, counters(), sum(len(r["times"]) for r in rr)))
        bursts.append(burst_rate(rr))
        steady = steady_rate(rr)
        # an engine whose clients never all decode together has only its burst to show
        g = gaps(rr, *window(rr)) if steady else gaps(rr)
        aggs.append(steady if steady else bursts[-1])
        p50s.append(pct(g, 50) * 1e3)
        p99s.append(pct(g, 99) * 1e3)
    out = {"tok_s": statistics.median(aggs), "p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s),
           "burst_tok_s": statistics.median(bursts),
           "reps": {"tok_s": aggs, "burst_tok_s": bursts, "p50_ms": p50s, "p99_ms": p99s}}
    if server:
        out["server"] = {k: statistics.median(s[k] for s in server) for k in server[0]}
        out["reps"]["server"] = server
    return out


def curve(run_many, prompt_for, reps, levels=LEVELS, log=print, who="", counters=None):
    """prompt_for(i): client i's prompt. Returns {n: level(...)}; the warm-up is one client."""
    run_many([prompt_for(0)])
    out = {}
    for n in levels:
        out[n] = level(run_many, [prompt_for(i) for i in range(n)], reps, counters)
        sv = out[n].get("server", {})
        more = f"; CPU {sv['cpu_ms_per_token']:.2f} ms per token" if sv else ""
        if "steps" in sv:
            more += (f", {sv['steps']:.0f} steps of {sv['tokens_per_step']:.1f} generated tokens, supervisor "
                     f"{sv['supervisor_cpu_us_per_step']:.0f} us of CPU per step")
        log(f"bench: clients: {who} {n:2d} clients: {out[n]['tok_s']:.1f} tok/s all decoding "
            f"({out[n]['burst_tok_s']:.1f} over the burst), per token p50 {out[n]['p50_ms']:.1f} ms, "
            f"p99 {out[n]['p99_ms']:.1f} ms{more}")
    return out


def plot(ours, llama, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, c, color in (("nxd", ours, "#2a9d8f"), ("llama-server", llama, "#e76f51")):
        if not c:
            continue
        ns = sorted(c)
        a1.plot(ns, [c[n]["tok_s"] for n in ns], "o-", color=color, label=name)
        a2.plot(ns, [c[n]["p50_ms"] for n in ns], "o-", color=color, label=f"{name} p50")
        a2.plot(ns, [c[n]["p99_ms"] for n in ns], "s--", color=color, label=f"{name} p99")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(LEVELS, [str(n) for n in LEVELS])
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a1.set_ylabel("aggregate decode tok/s")
    a2.set_ylabel("time per token (ms)")
    a2.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
