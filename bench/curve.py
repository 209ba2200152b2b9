"""curve.py - how cost grows with clients: 1 .. 64 concurrent greedy clients on one server of 64 slots,
aggregate decode tok/s and the p50 / p99 time per token, nxd against llama-server, and its PNG.

A level's clients are sent at once (one connection and thread each, as the concurrent case). What is
measured is the server with N sequences decoding: the window from the last client's first token (every
client is decoding) to the first client's last token (none has finished yet). Its aggregate tok/s is
the tokens that arrive in that window over its length; its time per token is the gap between one
client's consecutive tokens inside it, pooled over all clients of the level (p50, p99). The span from
the first client's first token to the last client's last (the burst, which adds the late arrivals'
prefill and the tail where few clients are left) is kept as burst_tok_s. Each level is the median of
its repetitions."""
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


def level(run_many, prompts, reps):
    """run_many(prompts) -> per-client results (each with "times"). Medians of reps runs."""
    aggs, bursts, p50s, p99s = [], [], [], []
    for _ in range(reps):
        rr = run_many(prompts)
        bursts.append(burst_rate(rr))
        steady = steady_rate(rr)
        # an engine whose clients never all decode together has only its burst to show
        g = gaps(rr, *window(rr)) if steady else gaps(rr)
        aggs.append(steady if steady else bursts[-1])
        p50s.append(pct(g, 50) * 1e3)
        p99s.append(pct(g, 99) * 1e3)
    return {"tok_s": statistics.median(aggs), "p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s),
            "burst_tok_s": statistics.median(bursts),
            "reps": {"tok_s": aggs, "burst_tok_s": bursts, "p50_ms": p50s, "p99_ms": p99s}}


def curve(run_many, prompt_for, reps, levels=LEVELS, log=print, who=""):
    """prompt_for(i): client i's prompt. Returns {n: level(...)}; the warm-up is one client."""
    run_many([prompt_for(0)])
    out = {}
    for n in levels:
        out[n] = level(run_many, [prompt_for(i) for i in range(n)], reps)
        log(f"bench: clients: {who} {n:2d} clients: {out[n]['tok_s']:.1f} tok/s all decoding "
            f"({out[n]['burst_tok_s']:.1f} over the burst), per token p50 {out[n]['p50_ms']:.1f} ms, "
            f"p99 {out[n]['p99_ms']:.1f} ms")
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
