"""run.py - `make bench`: nxd side by side with llama.cpp on the same model files, threads and requests.

    .venv-bench/bin/python bench/run.py [--build B] [--cases decode,prefill,concurrent,memory,qwen,qwen3,llama1b,
                                                             moe,chat,http,clients,spec,draft,structured,depth,amx]
                                        [--reps N] [--out DIR] [--engines ours,llama]

Cases (docs/bench.md has the details and how to read the numbers):
  decode      one client, SmolLM2-135M Q4_1, greedy 128 tokens after a short prompt, decode-only tok/s,
              and % of the memory-bandwidth limit (weight bytes read per token / measured GB/s)
  prefill     prompt tok/s for 128 and 512 tokens, Q4_1 and our own Q4_K_M and Q8_0 re-quantizations
  concurrent  4 clients at once: total decode tok/s, nxd --slots 4 vs llama-server -np 4, and each
              client's tok/s against one client alone on the same server; then nxd again with
              --activations fast (llama.cpp's activation precision) against the same llama-server runs
  memory      nxd's summed PSS (supervisor + workers) against model + KV cache, start-to-ready time
              against llama.cpp's load time (Llama() and llama-server's /health)
  qwen        a Qwen2.5-0.5B-shaped qwen2 model with random weights in Q4_K_M: decode, prefill and
              4 clients (both nxd modes), as above
  qwen3       a Qwen3-0.6B-shaped qwen3 model (per-head Q/K norms), random weights, Q4_K_M: decode, prefill
  llama1b     a Llama-3.2-1B-shaped llama model (RoPE frequency factors, 128k vocabulary), random weights, in
              Q4_K_M, Q4_0 and Q8_0: decode (with its % of the bandwidth limit; it does not fit in cache) and prefill
  moe         a Qwen3-30B-A3B-shaped qwen3moe model (128 experts, 8 per token; 12 of its 48 layers)
              with random weights in Q4_K_M: decode (%bw of the active bytes: the 8 experts a token
              takes, not all 128) and prefill
  chat        a conversation's next turn: time to the first token of a follow-up question after a
              long first turn, nxd's prompt cache against llama-server's (cache_prompt); a second
              client with the same long instruction as one that is decoding; and 4 clients that send
              the same long instruction at once (the last one's first token)
  http        the OpenAI API: nxd through nxd-http against llama-server, both on POST /v1/chat/completions
              (streamed, greedy, ignore_eos), 1 client and 4 at once; and nxd over HTTP against nxd over its
              socket, turn about on one daemon, so the gateway's own cost shows
  clients     how cost grows: 1, 2, 4, ... 64 concurrent greedy clients of SmolLM2 Q4_1 on nxd --slots 64
              against llama-server -np 64: aggregate tok/s and p50 / p99 time per token while every client
              decodes (bench/curve.py; the whole burst's rate beside it), plotted in
              DIR/clients.png
  spec        speculative decoding by prompt lookup: one client, greedy chat answers of up to 128
              tokens to ~20 input-grounded prompts (edit this code, continue this list, quote this passage) and
              5 free-form ones, decode tok/s with speculation against without on the same daemon (turn about);
              llama.cpp: llama-server --spec-type ngram-simple against one without, turn about; and (nxd only)
              a client decoding beside one that speculates: its tok/s against beside one that does not
  draft       speculative decoding with a draft model (llama.cpp: llama-server -md, --spec-type draft-simple)
              on the Llama-3.2-1B shape (Q4_0): one client,
              greedy, 64 tokens after a 33-token prompt, speculate draft k 4 against off (turn about), for drafts
              of known relation to the target: the target itself (acceptance 1: the overhead's ceiling), its
              first 2 layers and head (random weights: accepts ~nothing), and that draft for targets whose later
              layers' output projections are damped (x0, x0.03, x0.1: the draft is right more often the more
              they are): decode tok/s with and without, the ratio against the acceptance
  structured  constrained decoding's cost: one client's decode tok/s under a typical JSON schema against the same
              daemon free (sampled, seeded, turn about), on SmolLM2 (49152 tokens) and the Qwen2.5-0.5B-shaped
              model (151936 tokens); nxd only (the bar: >= 0.90)
  amx         where the CPU has AMX-INT8: nxd's prefill (128, 512) and decode with the AMX kernels against
              the same daemon with NX_KERN=avx512, SmolLM2 Q4_1 and the 1B shape Q4_K_M; nxd only (the
              llama.cpp column holds the AVX-512 run). Elsewhere the header says "AMX: not available"
Medians of --reps repetitions after an untimed warm-up. Writes DIR/results.json and DIR/results.png.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import bwprobe  # noqa: E402
import curve  # noqa: E402
import http_side  # noqa: E402
import models  # noqa: E402
import nxd_side  # noqa: E402
import spec_prompts  # noqa: E402
import llama_server  # noqa: E402

ALL_CASES = ["decode", "prefill", "concurrent", "memory", "qwen", "qwen3", "llama1b", "moe", "chat", "http",
             "clients", "spec", "draft", "structured", "depth", "amx"]
THREADS = 2
CTX = 2048        # per sequence, both engines
N_BATCH = 512     # llama.cpp n_batch = n_ubatch; nxd --batch for the prefill cases
DECODE_N = 128
SLOTS = 4
CHAT_TURN = (480, 64, 24)  # chat case: first prompt, its answer, the follow-up question (tokens)
MIN_REPS = 3
CURVE_SLOTS = 64  # clients case: both servers' slots
CURVE_N = 64      # clients case: tokens per client
# structured case: a typical extraction schema (objects, bounded numbers, enums, free strings)
STRUCTURED_PROMPT = ("<|im_start|>user\nList some people you know of, with their age, city and a short note, as "
                     "JSON.<|im_end|>\n<|im_start|>assistant\n")
STRUCTURED_SCHEMA = {"type": "object", "properties": {"people": {"type": "array", "maxItems": 50, "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                     "city": {"type": "string"}, "role": {"enum": ["friend", "family", "colleague"]},
                                     "note": {"type": "string"}},
    "required": ["name", "age", "city", "role", "note"]}}}, "required": ["people"]}
BUDGET_S = 25.0   # per measurement and side: repetitions stop (after MIN_REPS) once past it
# depth case: DEPTH_NEW tokens prefilled on top of each prefix, then DECODE_N decoded after them; the
# second prefix fills SmolLM2's whole 8192-token context (nxd's --ctx stops at the model's).
DEPTHS = (3584, 7552)
DEPTH_NEW = 512
GGML_TYPE = {"f16": 1, "q8_0": 8}  # llama.cpp's -ctk / -ctv types (ggml.h)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def cache_dir():
    base = os.environ.get("NXD_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                      os.path.expanduser("~/.cache"), "nxd")
    d = os.path.join(base, "bench", "models")
    os.makedirs(d, exist_ok=True)
    return d


def prompt_ids(seed, n, lo=300, hi=20000):
    """Deterministic token ids away from the special tokens at the start of both vocabularies; the
    speed of a step does not depend on which ids it holds."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(lo, hi, n)]


SMOLLM2_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
CHAT = ("<|im_start|>user\nWhat is the capital of France? Tell me about its history, briefly."
        "<|im_end|>\n<|im_start|>assistant\n")
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "Explain what a hash table is.", "List three uses of copper."]


def text_ids(model, text):
    """Token ids of a ChatML text by llama.cpp's tokenizer (vocab only), the same ids for both engines;
    a real prompt gives the greedy-agreement check real logits rather than near-ties."""
    import llama_cpp
    saved = os.dup(2)  # llama.cpp warns about the context of a vocab-only load on fd 2
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            v = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    try:
        return v.tokenize(text.encode(), add_bos=False, special=True)
    finally:
        v.close()


# ---------------------------------------------------------------- the llama.cpp side

def repeat(fn, reps):
    """fn() -> (rate, seconds, extra). At least MIN_REPS (or reps if fewer), then stop when the next
    repetition would pass BUDGET_S, so a slow engine cannot stretch the run past its time."""
    rates, first, spent = [], None, 0.0
    while len(rates) < reps:
        r, sec, extra = fn()
        rates.append(r)
        first = extra if first is None else first
        spent += sec
        if len(rates) >= MIN_REPS and spent + sec > BUDGET_S:
            break
    return rates, first


def run_llama_side(model, reps, decode=None, prefill=None, flash_attn=False, depth=None, n_ctx=CTX, type_kv=None):
    spec = {"model": model, "threads": THREADS, "n_ctx": n_ctx, "n_batch": N_BATCH, "flash_attn": flash_attn,
            "reps": reps, "min_reps": MIN_REPS, "budget_s": BUDGET_S, "decode": decode, "prefill": prefill,
            "depth": depth, "type_kv": type_kv}
    p = subprocess.run([sys.executable, os.path.join(HERE, "llama_side.py")], input=json.dumps(spec),
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"llama_side.py failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout)


# ---------------------------------------------------------------- our side

class Ours:
    def __init__(self, build):
        self.nxd = os.path.join(build, "nxd")
        self.ok = os.access(self.nxd, os.X_OK)
        self.why = None if self.ok else f"{self.nxd} is not built"

    def daemon(self, model, batch=None, slots=SLOTS, extra=(), ctx=CTX, env=None):
        return nxd_side.Daemon(self.nxd, model, workers=THREADS, slots=slots, ctx=ctx, batch=batch, extra=extra,
                               env=env)

    def depth(self, model, prefix, news, reps, kv_type, ctx):
        """The prefix once (untimed), then per repetition prefix + new tokens on the same slot: the prompt
        cache keeps the prefix's K/V, so the new tokens are prefilled at its depth (the daemon's
        prefill_ms), and DECODE_N tokens decoded after them."""
        with self.daemon(model, batch=N_BATCH, slots=1, ctx=ctx, extra=["--kv-type", kv_type]) as d:
            c = nxd_side.Conn(d.sock)
            c.generate(prefix, 1)
            pre, dec, cached = [], [], []
            for k, new in enumerate(news[:max(1, reps)]):
                res = c.generate(prefix + new, DECODE_N, rid=k + 2)
                pre.append(nxd_side.prefill_rate(res, len(new))[0])
                dec.append(nxd_side.decode_rates(res)[0])
                cached.append((res["done"].get("usage") or {}).get("cached_tokens"))
            st = c.status()
            c.close()
            return {"prefill_tok_s": pre, "decode_tok_s": dec, "prompt_tokens_cached": cached,
                    "kv_type": st.get("kv_type"), "kv_bytes": st.get("kv_bytes")}

    def decode(self, model, prompt, reps, probe=None, env=None):
        """probe: a bandwidth probe's command line, run before each repetition and after the last."""
        with self.daemon(model, env=env) as d:
            c = nxd_side.Conn(d.sock)
            c.generate(prompt, 16)  # warm-up
            server, probes = [], []

            def one():
                if probe:
                    probes.append(bwprobe.run(probe))
                res = c.generate(prompt, DECODE_N, rid=len(server) + 2)
                if len(res["times"]) != DECODE_N:
                    raise nxd_side.DaemonError(f"asked for {DECODE_N} tokens, got {len(res['times'])}: {res['done']}")
                cl, sv = nxd_side.decode_rates(res)
                server.append(sv)
                return cl, res["times"][-1] - res["times"][0], res["ids"]

            client, ids = repeat(one, reps)
            c.close()
            out = {"tok_s": client, "tok_s_server_timing": server, "ids": ids}
            if probe:
                probes.append(bwprobe.run(probe))
                out["probes_gbs"] = [p["best_gbs"] for p in probes]
                out["probes_median_gbs"] = [p["median_gbs"] for p in probes]
            return out

    def prefill(self, model, lengths, reps, env=None):
        out = {}
        # Whole prompts, as llama.cpp's side computes them (its KV cache cleared).
        with self.daemon(model, batch=N_BATCH, extra=["--no-prompt-cache"], env=env) as d:
            c = nxd_side.Conn(d.sock)
            c.generate(prompt_ids(1000, min(lengths)), 1)  # warm-up
            for n in lengths:
                src, k = [], [0]

                def one():
                    # A fresh prompt for every request, so no prefix reuse can shorten the work.
                    k[0] += 1
                    res = c.generate(prompt_ids(2000 + 10 * n + k[0], n), 1, rid=k[0] + 1)
                    rate, s = nxd_side.prefill_rate(res, n)
                    src.append(s)
                    return rate, n / rate, None

                rates, _ = repeat(one, reps)
                out[str(n)] = {"tok_s": rates, "timing_source": src[0]}
            c.close()
        return out


# ---------------------------------------------------------------- results

class Table:
    def __init__(self):
        self.rows = []

    def add(self, case, what, unit, ours, llama, ours_bw=None, llama_bw=None, lower_better=False, note=""):
        ratio = ours / llama if (ours is not None and llama) else None
        self.rows.append({"case": case, "what": what, "unit": unit, "ours": ours, "llama": llama,
                          "ratio": ratio, "ours_pct_bw": ours_bw, "llama_pct_bw": llama_bw,
                          "lower_better": lower_better, "note": note})

    def text(self):
        def f(x, nd=1):
            return "-" if x is None else f"{x:.{nd}f}"
        head = f"{'case':<11} {'what':<34} {'unit':<7} {'nxd':>9} {'llama.cpp':>10} {'ratio':>6} {'nxd %bw':>8} {'l.cpp %bw':>9}"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            nd = 2 if r["unit"] in ("s", "x", "/step") else 1
            lines.append(f"{r['case']:<11} {r['what']:<34} {r['unit']:<7} {f(r['ours'], nd):>9} {f(r['llama'], nd):>10} "
                         f"{f(r['ratio'], 2):>6} {f(r['ours_pct_bw']):>8} {f(r['llama_pct_bw']):>9}"
                         + (f"  {r['note']}" if r["note"] else ""))
        return "\n".join(lines)


def plot(rows, path, title):
    try:
        import matplotlib
    except ImportError:  # the peer's venv has it; a run of nxd's cases alone may not
        log(f"bench: no matplotlib: {path} not drawn")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rs = [r for r in rows if r["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(11, 0.42 * max(4, len(rs)) + 1.5))
    if not rs:
        ax.text(0.5, 0.5, "no case has numbers from both engines", ha="center", va="center")
        ax.set_axis_off()
    else:
        labels = [f"{r['case']}: {r['what']}" + (" (lower is better)" if r["lower_better"] else "") for r in rs]
        vals = [r["ratio"] for r in rs]
        good = [(v <= 1) if r["lower_better"] else (v >= 1) for v, r in zip(vals, rs)]
        y = np.arange(len(rs))[::-1]
        ax.barh(y, vals, color=["#2a9d8f" if g else "#e76f51" for g in good])
        ax.axvline(1.0, color="black", lw=1)
        ax.set_yticks(y, labels, fontsize=8)
        for yy, v in zip(y, vals):
            ax.text(v, yy, f" {v:.2f}", va="center", fontsize=8)
        ax.set_xlabel("nxd / llama.cpp")
        ax.set_xlim(0, max(vals) * 1.15)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_info(bw_bin):
    info = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            txt = f.read()
        m = re.search(r"model name\s*:\s*(.*)", txt)
        info["cpu"] = m.group(1) if m else None
        flags = re.search(r"flags\s*:\s*(.*)", txt)
        info["cpu_simd"] = sorted(x for x in (flags.group(1).split() if flags else [])
                                  if x.startswith(("avx", "fma", "f16c", "amx")))
    except OSError:
        pass
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def cpu_snapshot():
    """(wall s, busy CPU s of the whole machine, CPU s of this process and its waited-for children)."""
    import resource
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz  # user nice system irq softirq
    steal = (v[7] if len(v) > 7 else 0) / hz
    ours = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        ours += ru.ru_utime + ru.ru_stime
    return time.time(), busy, ours, steal


def foreign_share(a, b):
    """Share of the machine's CPU time that processes other than the benchmark used between two
    snapshots (every engine the benchmark starts is its child and waited for)."""
    wall = b[0] - a[0]
    other = (b[1] - a[1]) - (b[2] - a[2])
    cap = wall * (os.cpu_count() or 1)
    return {"other_cpu_s": other, "steal_s": b[3] - a[3], "wall_s": wall,
            "share": max(0.0, other) / cap if cap > 0 else None}


def measure_bw(bw_bin):
    return bwprobe.run([bw_bin, "--threads", str(THREADS)])


def paired_pct_bw(side, bytes_per_tok, sustained=False):
    """Median over a decode case's repetitions of each one's %bw against the probes taken right before and
    right after it (one more than repetitions): the faster of their best passes (side["probes_gbs"]), or,
    sustained, the mean of their median passes (side["probes_median_gbs"])."""
    pr = (side or {}).get("probes_median_gbs" if sustained else "probes_gbs")
    if not pr or len(pr) != len(side["tok_s"]) + 1:
        return None
    return med([pct_bw(r, bytes_per_tok, (pr[i] + pr[i + 1]) / 2 if sustained else max(pr[i], pr[i + 1]))
                for i, r in enumerate(side["tok_s"])])


def pct_bw(tok_s, bytes_per_tok, bw_gbs):
    if tok_s is None or not bw_gbs:
        return None
    return 100.0 * tok_s * bytes_per_tok / (bw_gbs * 1e9)


def agree(a, b):
    """Leading greedy tokens the two engines agree on (same weights, different arithmetic order)."""
    n = 0
    for x, y in zip(a or [], b or []):
        if x != y:
            break
        n += 1
    return n


def conc_summary(results):
    """Total decode tok/s over the span from the first client's first token to the last one's last,
    and each client's own decode tok/s."""
    firsts = [r["times"][0] for r in results if len(r["times"]) >= 2]
    lasts = [r["times"][-1] for r in results if len(r["times"]) >= 2]
    total = sum(len(r["times"]) - 1 for r in results) / (max(lasts) - min(firsts))
    per = [nxd_side.decode_rates(r)[0] for r in results]
    return total, per


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("--engines", default="ours,llama")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--wait-idle", type=float, default=0, metavar="S",
                    help="wait up to S seconds for the 1-minute load average to fall below 1.0 first")
    ap.add_argument("--flash-attn", action="store_true",
                    help="llama.cpp with flash attention in the Python-driven cases (llama-server uses its default, auto)")
    a = ap.parse_args()
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in ALL_CASES]
    if bad:
        sys.exit(f"run.py: unknown case(s) {bad}; known: {ALL_CASES}")
    engines = set(e.strip() for e in a.engines.split(","))
    build = os.path.join(ROOT, a.build) if not os.path.isabs(a.build) else a.build
    os.makedirs(a.out, exist_ok=True)
    if a.wait_idle > 0:
        t_end = time.time() + a.wait_idle
        while os.getloadavg()[0] >= 1.0 and time.time() < t_end:
            time.sleep(10)
    load0 = os.getloadavg()
    snap0 = cpu_snapshot()
    if load0[0] >= 1.0:
        log(f"bench: WARNING: load average {load0[0]:.1f} on {os.cpu_count()} CPUs: other work will skew "
            "every number (llama.cpp's spinning OpenMP threads most); see docs/bench.md")
    t_start = time.time()

    ours = Ours(build)
    if "ours" not in engines:
        ours.ok, ours.why = False, "skipped (--engines)"
    use_llama = "llama" in engines
    if not ours.ok:
        log(f"bench: nxd side skipped: {ours.why}")
    libnx = os.path.join(build, "libnx.so")
    try:
        with open(os.path.join(ROOT, ".venv-bench", "llama-info.json")) as f:
            llama_info = json.load(f)
    except OSError:  # scripts/bench-venv writes it; without it, ask the bindings directly
        if use_llama:
            import llama_cpp
            llama_info = {"llama_cpp_python": llama_cpp.__version__,
                          "system_info": llama_cpp.llama_print_system_info().decode().strip()}
        else:
            llama_info = {}
    srv_bin = llama_info.get("llama_server")

    res = {"machine": machine_info(None), "llama_cpp": llama_info, "threads": THREADS, "ctx": CTX,
           "n_batch": N_BATCH, "reps": a.reps, "cases": cases, "engines": sorted(engines),
           "nxd": {"binary": ours.nxd, "tested": ours.ok, "why_not": ours.why}, "models": {}, "raw": {}}
    bw = measure_bw(os.path.join(build, "bench", "bw"))
    probes = []  # the probes after each decode case (decode_case)
    res["bandwidth"] = bw
    res["bandwidth_after"] = probes
    bw_gbs = bw["best_gbs"]
    log(f"bench: {bw['line']}")
    log(f"bench: llama-cpp-python {llama_info.get('llama_cpp_python')}; {llama_info.get('llama_server_version', '')[:200]}")

    q41 = subprocess.run([os.path.join(ROOT, "scripts", "fetch-model")], capture_output=True, text=True,
                         check=True).stdout.strip()
    mdir = cache_dir()

    def requant(mode):
        dst = os.path.join(mdir, os.path.basename(q41).replace(".Q4_1.gguf", f".nx-{mode.upper()}.gguf"))
        if not os.path.exists(dst):
            models.requantize(libnx, q41, dst, mode, threads=THREADS, log=log)
        return dst

    def model_info(key, path):
        if key not in res["models"]:
            res["models"][key] = models.describe(path)
        return res["models"][key]

    table = Table()

    def both(case, fn_ours, fn_llama):
        """Run one side after the other; a failure on one side is recorded, not fatal."""
        o = l = None
        if ours.ok:
            try:
                o = fn_ours()
            except Exception as e:
                log(f"bench: {case}: nxd failed: {e}")
                res["raw"].setdefault("errors", []).append(f"{case}: nxd: {e}")
        if use_llama:
            try:
                l = fn_llama()
            except Exception as e:
                log(f"bench: {case}: llama.cpp failed: {e}")
                res["raw"].setdefault("errors", []).append(f"{case}: llama.cpp: {e}")
        return o, l

    # -------------------------------------------------------- decode
    def decode_case(case, key, path, reps):
        mi = model_info(key, path)
        log(f"bench: {case}: {key} decode {DECODE_N} tokens x {reps}")
        dprompt = text_ids(path, CHAT)
        # A probe before every repetition and after the last, on both sides: 32 passes over 1 GiB, about
        # a second of streaming, whose best pass may catch a burst of the host's memory bandwidth and whose
        # median says what streaming that long gets (docs/bench.md, "Bandwidth limit").
        probe = [os.path.join(build, "bench", "bw"), "--threads", str(THREADS), "--reps", "32"]
        o, l = both(case, lambda: ours.decode(path, dprompt, reps, probe=probe),
                    lambda: run_llama_side(path, reps, decode={"prompt": dprompt, "n": DECODE_N, "probe": probe},
                                           flash_attn=a.flash_attn)["decode"])
        res["raw"][f"{case}/{key}/decode"] = {"ours": o, "llama": l}
        om, lm = med(o["tok_s"]) if o else None, med(l["tok_s"]) if l else None
        note = ""
        if o and l:
            n = agree(o["ids"], l["ids"])
            res["raw"][f"{case}/{key}/decode"]["greedy_agreement"] = n
            note = f"greedy ids agree on {n}/{DECODE_N}"
        bpt = mi["bytes_per_token"]
        # The host's bandwidth drifts within a run: probe again right after the
        # case and hold both engines to the faster of the two probes around it.
        after = measure_bw(os.path.join(build, "bench", "bw"))
        probes.append({"after": f"{case}/{key}", **after})
        case_gbs = max(bw_gbs, after["best_gbs"])
        log(f"bench: {case}: probe after: {after['line']}")
        table.add(case, f"{key} decode tok/s (1 client)", "tok/s", om, lm, pct_bw(om, bpt, case_gbs),
                  pct_bw(lm, bpt, case_gbs), note=note)
        po, pl = paired_pct_bw(o, bpt), paired_pct_bw(l, bpt)
        table.add(case, f"{key} decode %bw, paired probes", "%", po, pl, po, pl,
                  note="median of each repetition's %bw against the faster probe just before or after it")
        po, pl = paired_pct_bw(o, bpt, sustained=True), paired_pct_bw(l, bpt, sustained=True)
        table.add(case, f"{key} decode %bw, sustained", "%", po, pl, po, pl,
                  note="the same against the mean of the two probes' median passes")
        limit = case_gbs * 1e9 / bpt
        res["raw"][f"{case}/{key}/decode"]["bandwidth_limit_tok_s"] = limit
        log(f"bench: {case}: {key}: nxd {om} llama.cpp {lm} tok/s; limit {limit:.1f} tok/s "
            f"({bpt / 1e6:.1f} MB/token at {case_gbs:.1f} GB/s)")

    def prefill_case(case, key, path, reps, lengths=(128, 512)):
        model_info(key, path)
        log(f"bench: {case}: {key} prefill {list(lengths)} x {reps}")
        pf = {str(n): prompt_ids(3000 + n, n) for n in lengths}
        o, l = both(case, lambda: ours.prefill(path, lengths, reps),
                    lambda: run_llama_side(path, reps, prefill=pf, flash_attn=a.flash_attn)["prefill"])
        res["raw"][f"{case}/{key}/prefill"] = {"ours": o, "llama": l}
        for n in lengths:
            om = med(o[str(n)]["tok_s"]) if o else None
            lm = med(l[str(n)]["tok_s"]) if l else None
            table.add(case, f"{key} prefill {n} tok/s", "tok/s", om, lm)

    if "decode" in cases:
        decode_case("decode", "smollm2-135m Q4_1", q41, a.reps)

    if "prefill" in cases:
        prefill_case("prefill", "smollm2-135m Q4_1", q41, a.reps)
        prefill_case("prefill", "smollm2-135m Q4_K_M(nx)", requant("q4_k_m"), a.reps)
        prefill_case("prefill", "smollm2-135m Q8_0(nx)", requant("q8_0"), a.reps)

    # -------------------------------------------------------- concurrent
    def concurrent_case(case, key, path, reps, extra=(), llama=None, note=""):
        """extra: more nxd options; llama: llama-server's results from an earlier call, reused (not
        run again). Returns llama-server's results."""
        reps = min(reps, MIN_REPS)
        cprompts = [text_ids(path, f"<|im_start|>user\n{QUESTIONS[i % len(QUESTIONS)]}<|im_end|>\n"
                                   "<|im_start|>assistant\n") for i in range(SLOTS)]
        log(f"bench: {case}: {key}: {SLOTS} clients x {DECODE_N} tokens x {reps}")

        def conc(gen_alone, gen_many):
            gen_alone(cprompts[0])  # warm-up
            pers = []

            def alone1():
                r = gen_alone(cprompts[0])
                return nxd_side.decode_rates(r)[0], r["times"][-1] - r["times"][0], None

            def many1():
                rr = gen_many(cprompts)
                t, per = conc_summary(rr)
                pers.append(per)
                return t, max(x["times"][-1] for x in rr) - min(x["times"][0] for x in rr), None

            alone, _ = repeat(alone1, reps)
            totals, _ = repeat(many1, reps)
            return {"alone_tok_s": alone, "total_tok_s": totals, "per_client_tok_s": pers}

        def conc_ours():
            with ours.daemon(path, slots=SLOTS, extra=extra) as d:
                c = nxd_side.Conn(d.sock)
                try:
                    return conc(lambda p: c.generate(p, DECODE_N),
                                lambda ps: nxd_side.concurrent(d.sock, ps, DECODE_N))
                finally:
                    c.close()

        def conc_llama():
            if not srv_bin or not os.access(srv_bin, os.X_OK):
                raise RuntimeError(f"llama-server not built ({srv_bin})")
            with llama_server.Server(srv_bin, path, THREADS, SLOTS, CTX, N_BATCH) as s:
                return conc(lambda p: s.generate(p, DECODE_N), lambda ps: s.concurrent(ps, DECODE_N))

        o, l = both(case, conc_ours, conc_llama if llama is None else (lambda: llama))
        res["raw"][f"{case}/{key}/concurrent"] = {"ours": o, "llama": l, "nxd_options": list(extra)}
        bpt = model_info(key, path)["bytes_per_token"]
        om, lm = (med(o["total_tok_s"]) if o else None), (med(l["total_tok_s"]) if l else None)
        # 4 sequences share one read of the weights per step: the limit is per step, not per token.
        table.add(case, f"{key} total tok/s ({SLOTS} clients)", "tok/s", om, lm,
                  pct_bw(om / SLOTS if om else None, bpt, bw_gbs), pct_bw(lm / SLOTS if lm else None, bpt, bw_gbs),
                  note="%bw: per step (4 tokens share one weight read)" + (f"; {note}" if note else ""))
        oa, la = (med(o["alone_tok_s"]) if o else None), (med(l["alone_tok_s"]) if l else None)
        table.add(case, f"{key} 1 client alone, same server", "tok/s", oa, la)
        op = med([x for rep in o["per_client_tok_s"] for x in rep]) if o else None
        lp = med([x for rep in l["per_client_tok_s"] for x in rep]) if l else None
        table.add(case, f"{key} per client ({SLOTS} at once)", "tok/s", op, lp)
        table.add(case, f"{key} per client / alone", "x", op / oa if op and oa else None,
                  lp / la if lp and la else None)
        return l

    FAST = dict(extra=("--activations", "fast"), note="nxd --activations fast: one 8-bit part, as llama.cpp")
    if "concurrent" in cases:
        l = concurrent_case("concurrent", "smollm2-135m Q4_1", q41, a.reps)
        concurrent_case("concurrent", "smollm2-135m Q4_1 fast", q41, a.reps, llama=l, **FAST)

    # -------------------------------------------------------- depth: prefill and decode at 4k and 8k of context
    def depth_case(case, key, path, reps):
        """For each prefix of DEPTHS tokens: DEPTH_NEW tokens prefilled on top of it and DECODE_N decoded
        after them (llama-bench's -d), nxd with an f16 and a q8_0 K/V cache against llama.cpp with flash
        attention and the same two cache types (-ctk / -ctv)."""
        reps = min(reps, MIN_REPS)
        ctx = max(DEPTHS) + DEPTH_NEW + DECODE_N
        log(f"bench: {case}: {key}: depths {list(DEPTHS)}, +{DEPTH_NEW} prefilled, {DECODE_N} decoded, x {reps}")
        for depth in DEPTHS:
            prefix = prompt_ids(11000 + depth, depth)
            news = [prompt_ids(12000 + depth + k, DEPTH_NEW) for k in range(reps)]
            for kv in ("f16", "q8_0"):
                o, l = both(case, lambda: ours.depth(path, prefix, news, reps, kv, ctx),
                            lambda: run_llama_side(path, reps, flash_attn=True, n_ctx=ctx, type_kv=GGML_TYPE[kv],
                                                   depth={"prefix": prefix, "news": news, "n": DECODE_N})["depth"])
                res["raw"][f"{case}/{key}/{depth}/{kv}"] = {"ours": o, "llama": l}
                log(f"bench: {case}: {depth} {kv} KV: nxd prefill {o and o['prefill_tok_s']} decode "
                    f"{o and o['decode_tok_s']}; llama.cpp prefill {l and l['prefill_tok_s']} decode "
                    f"{l and l['decode_tok_s']} tok/s")
                at = f"{depth}..{depth + DEPTH_NEW}"
                table.add(case, f"{key} {kv} KV prefill at {at}", "tok/s", med(o["prefill_tok_s"]) if o else None,
                          med(l["prefill_tok_s"]) if l else None,
                          note=f"{DEPTH_NEW} new tokens on a {depth}-token prefix; llama.cpp flash attention on")
                at = f"{depth + DEPTH_NEW}..{depth + DEPTH_NEW + DECODE_N}"
                table.add(case, f"{key} {kv} KV decode at {at}", "tok/s", med(o["decode_tok_s"]) if o else None,
                          med(l["decode_tok_s"]) if l else None,
                          note=(f"nxd KV cache {o['kv_bytes'] / 2**20:.0f} MiB" if o and o.get("kv_bytes") else ""))

    if "depth" in cases:
        depth_case("depth", "smollm2-135m Q4_1", q41, a.reps)

    # -------------------------------------------------------- chat: a conversation's next turn
    def chat_case(case, key, path, reps):
        """Turn 1: a long prompt and its answer; turn 2: all of that plus a short question. Time from
        sending turn 2 to its first token, each side with its own prompt cache (nxd's default; llama-server
        with cache_prompt), the first turn's time beside it. A fresh conversation every repetition."""
        n_first, n_answer, n_follow = CHAT_TURN
        log(f"bench: {case}: {key}: turn 1 {n_first} + {n_answer} tokens, turn 2 +{n_follow} x {reps}")

        def convo(gen):
            firsts = []

            def one():
                k = len(firsts)
                first = prompt_ids(7000 + k, n_first)
                r1 = gen(first, n_answer)
                r2 = gen(first + r1["ids"] + prompt_ids(8000 + k, n_follow), 8)
                firsts.append(r1["times"][0] - r1["t_send"])
                t2 = r2["times"][0] - r2["t_send"]
                return t2, r2["t_done"] - r1["t_send"], None

            gen(prompt_ids(6999, 32), 4)  # warm-up
            second, _ = repeat(one, reps)
            return {"turn2_s": second, "turn1_s": firsts}

        def shared(gen_a, gen_b):
            """Client A sends an n_first-token instruction and a question; once A decodes, client B sends
            the same instruction and another question: B's time to its first token."""
            out = []

            def one():
                k = len(out)
                instr = prompt_ids(9000 + k, n_first)
                started, res = threading.Event(), []
                a = threading.Thread(target=lambda: res.append(
                    gen_a(instr + prompt_ids(9100 + k, n_follow), n_answer, started.set)))
                a.start()
                if not started.wait(300):
                    raise RuntimeError("client A got no token")
                rb = gen_b(instr + prompt_ids(9200 + k, n_follow), 8)
                a.join()
                out.append(rb["times"][0] - rb["t_send"])
                return out[-1], rb["t_done"] - rb["t_send"], None

            vals, _ = repeat(one, reps)
            return vals

        def together(gens):
            """SLOTS clients send the same n_first-token instruction, each with its own question, at
            once: the time from the first send to the last client's first token."""
            out = []

            def one():
                k = len(out)
                instr = prompt_ids(9500 + k, n_first)
                go, res = threading.Barrier(len(gens)), [None] * len(gens)

                def client(i):
                    go.wait()
                    res[i] = gens[i](instr + prompt_ids(9600 + 10 * k + i, n_follow), 8)

                th = [threading.Thread(target=client, args=(i,)) for i in range(len(gens))]
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                if any(r is None for r in res):
                    raise RuntimeError("a client of the shared-instruction case failed")
                out.append(max(r["times"][0] for r in res) - min(r["t_send"] for r in res))
                return out[-1], max(r["t_done"] for r in res) - min(r["t_send"] for r in res), None

            vals, _ = repeat(one, reps)
            return vals

        def chat_ours(cache):
            with ours.daemon(path, batch=N_BATCH, extra=[] if cache else ["--no-prompt-cache"]) as d:
                cs = [nxd_side.Conn(d.sock) for _ in range(SLOTS)]
                c, c2 = cs[0], cs[1]
                try:
                    r = convo(lambda p, n: c.generate(p, n))
                    r["shared_s"] = shared(lambda p, n, f: c.generate(p, n, on_first=f),
                                           lambda p, n: c2.generate(p, n, rid=2))
                    r["together_s"] = together([lambda p, n, c=c: c.generate(p, n, rid=3) for c in cs])
                    return r
                finally:
                    for c in cs:
                        c.close()

        def chat_llama(cache):
            if not srv_bin or not os.access(srv_bin, os.X_OK):
                raise RuntimeError(f"llama-server not built ({srv_bin})")
            with llama_server.Server(srv_bin, path, THREADS, SLOTS, CTX, N_BATCH) as s:
                r = convo(lambda p, n: s.generate(p, n, cache_prompt=cache))
                r["shared_s"] = shared(lambda p, n, f: s.generate(p, n, cache_prompt=cache, on_first=f),
                                       lambda p, n: s.generate(p, n, cache_prompt=cache))
                r["together_s"] = together([lambda p, n: s.generate(p, n, cache_prompt=cache)] * SLOTS)
                return r

        o, l = both(case, lambda: chat_ours(True), lambda: chat_llama(True))
        o0, l0 = both(case, lambda: chat_ours(False), lambda: chat_llama(False))
        res["raw"][f"{case}/{key}/chat"] = {"ours": o, "llama": l, "ours_no_cache": o0, "llama_no_cache": l0}
        ms = lambda r, f: med(r[f]) * 1e3 if r else None  # noqa: E731
        size = f"turn 2 = turn 1's {n_first} + {n_answer} tokens + {n_follow} new"
        table.add(case, f"{key} turn 2 first token, prompt caches", "ms", ms(o, "turn2_s"), ms(l, "turn2_s"),
                  lower_better=True, note=size)
        table.add(case, f"{key} turn 2 first token, no caches", "ms", ms(o0, "turn2_s"), ms(l0, "turn2_s"),
                  lower_better=True, note="nxd --no-prompt-cache, llama-server cache_prompt: false")
        table.add(case, f"{key} turn 1 first token ({n_first}-token prompt)", "ms", ms(o, "turn1_s"),
                  ms(l, "turn1_s"), lower_better=True)
        table.add(case, f"{key} 2nd client, same instruction, first token", "ms", ms(o, "shared_s"),
                  ms(l, "shared_s"), lower_better=True,
                  note=f"{n_first}-token instruction + {n_follow}, while a client with it decodes")
        table.add(case, f"{key} 2nd client, same instruction, no caches", "ms", ms(o0, "shared_s"),
                  ms(l0, "shared_s"), lower_better=True)
        table.add(case, f"{key} {SLOTS} clients, same instruction at once, last first token", "ms",
                  ms(o, "together_s"), ms(l, "together_s"), lower_better=True,
                  note=f"{n_first}-token instruction + {n_follow} each, sent together")
        table.add(case, f"{key} {SLOTS} clients, same instruction at once, no caches", "ms",
                  ms(o0, "together_s"), ms(l0, "together_s"), lower_better=True)

    if "chat" in cases:
        chat_case("chat", "smollm2-135m Q4_1", q41, a.reps)

    # -------------------------------------------------------- http: the OpenAI API over HTTP
    def http_case(case, key, path, reps):
        """Streamed greedy chat completions of DECODE_N tokens on POST /v1/chat/completions: nxd through
        nxd-http against llama-server, 1 client and SLOTS at once. And nxd over HTTP against nxd over its
        socket: the same requests, turn about (which goes first alternates) on one daemon with the
        gateway in front, so the host's drift falls on both alike and the ratio is the gateway's cost."""
        qs = [http_side.messages(QUESTIONS[i % len(QUESTIONS)]) for i in range(SLOTS)]
        reps_many = min(reps, MIN_REPS)
        # HTTP against the socket is a difference of a few per cent, under the host's drift: more rounds,
        # and the median of each round's own ratio.
        pairs, pairs_many = max(reps, 25), max(reps_many, 9)
        log(f"bench: {case}: {key}: chat over HTTP, 1 client x {reps}, {SLOTS} clients x {reps_many}; "
            f"against the socket {pairs} and {pairs_many} rounds")
        gw_bin = os.path.join(build, "nxd-http")

        def single(res):
            return {"tok_s": http_side.rate(res), "ttft_s": res["times"][0] - res["t_send"],
                    "n": res["n"], "text_chunks": len(res["times"]),
                    "client_cpu_us": res["client_cpu_s"] / res["n"] * 1e6 if res["n"] else None}

        def many(rr):
            return {"total_tok_s": http_side.total_rate(rr), "per_client_tok_s": [http_side.rate(r) for r in rr],
                    "n": [r["n"] for r in rr]}

        def turns(fns, summarize, n):
            """n rounds of every fn in fns, the order turned each round; stops after MIN_REPS once the next
            round would pass BUDGET_S per side. {index: [summaries]}."""
            out, spent = {i: [] for i in range(len(fns))}, 0.0
            for k in range(n):
                for i in (range(len(fns)) if k % 2 == 0 else reversed(range(len(fns)))):
                    t0 = time.perf_counter()
                    out[i].append(summarize(fns[i]()))
                    spent += time.perf_counter() - t0
                if k + 1 >= MIN_REPS and spent / len(fns) * (k + 2) / (k + 1) > BUDGET_S:
                    break
            return out

        def chat_clients(port):
            # A connection per request (llama-server closes a kept-alive one after a stream): the connect
            # falls outside the decode span, inside the time to the first token, alike for both.
            mid = http_side.model_id(port)
            one = lambda: http_side.chat(port, qs[0], DECODE_N, mid)  # noqa: E731
            all_ = lambda: http_side.together([lambda i=i: http_side.chat(port, qs[i], DECODE_N, mid)  # noqa: E731
                                               for i in range(SLOTS)])
            return one, all_

        def http_ours():
            if not os.access(gw_bin, os.X_OK):
                raise RuntimeError(f"{gw_bin} is not built")
            with ours.daemon(path) as d:
                g = http_side.Gateway(gw_bin, d.sock)
                socks = [nxd_side.Conn(d.sock) for _ in range(SLOTS)]
                h1, hn = chat_clients(g.port)
                s1 = lambda: http_side.socket_chat(socks[0], qs[0], DECODE_N)  # noqa: E731
                sn = lambda: http_side.together([lambda i=i: http_side.socket_chat(socks[i], qs[i], DECODE_N, rid=i + 1)  # noqa: E731
                                                 for i in range(SLOTS)])
                try:
                    s1(), h1()  # warm-up
                    one = turns([s1, h1], single, pairs)
                    all_ = turns([sn, hn], many, pairs_many)
                finally:
                    for c in socks:
                        c.close()
                    gw_cpu = g.stop()
            # Every token the gateway passed on, the warm-up's too: its CPU time per token does not
            # depend on how busy the host is, as the rates do.
            tokens = DECODE_N + sum(x["n"] for x in one[1]) + sum(sum(x["n"]) for x in all_[1])
            return {"socket_1": one[0], "http_1": one[1], "socket_n": all_[0], "http_n": all_[1],
                    "gateway_cpu_s": gw_cpu, "gateway_tokens": tokens}

        def http_llama():
            if not srv_bin or not os.access(srv_bin, os.X_OK):
                raise RuntimeError(f"llama-server not built ({srv_bin})")
            with llama_server.Server(srv_bin, path, THREADS, SLOTS, CTX, N_BATCH) as s:
                h1, hn = chat_clients(s.port)
                h1()  # warm-up
                return {"http_1": turns([h1], single, reps)[0], "http_n": turns([hn], many, reps_many)[0]}

        o, l = both(case, http_ours, http_llama)
        res["raw"][f"{case}/{key}/chat"] = {"ours": o, "llama": l}
        pick = lambda r, side, f: med([x[f] for x in r[side]]) if r else None  # noqa: E731
        per = lambda r, side: med([v for x in r[side] for v in x["per_client_tok_s"]]) if r else None  # noqa: E731
        ms = lambda v: v * 1e3 if v is not None else None  # noqa: E731
        req = "POST /v1/chat/completions, streamed, greedy, ignore_eos"
        table.add(case, f"{key} chat 1 client tok/s", "tok/s", pick(o, "http_1", "tok_s"), pick(l, "http_1", "tok_s"),
                  note=f"nxd-http vs llama-server; {req}")
        table.add(case, f"{key} chat 1 client first token", "ms", ms(pick(o, "http_1", "ttft_s")),
                  ms(pick(l, "http_1", "ttft_s")), lower_better=True,
                  note="send to the first text chunk; the same prompt each time, in both prompt caches")
        table.add(case, f"{key} chat total tok/s ({SLOTS} clients)", "tok/s", pick(o, "http_n", "total_tok_s"),
                  pick(l, "http_n", "total_tok_s"))
        table.add(case, f"{key} chat per client ({SLOTS} at once)", "tok/s", per(o, "http_n"), per(l, "http_n"))
        for n, side, f in ((1, "1", "tok_s"), (SLOTS, "n", "total_tok_s")):
            sk, hp = pick(o, f"socket_{side}", f), pick(o, f"http_{side}", f)
            rr = [h[f] / k[f] for k, h in zip(o[f"socket_{side}"], o[f"http_{side}"]) if k[f] and h[f]] if o else []
            if o:
                o[f"http_over_socket_{side}"] = rr
            table.add(case, f"{key} nxd HTTP / socket, {n} client{'s' if n > 1 else ''}", "x", med(rr), None,
                      note=(f"the gateway's cost: median of {len(rr)} rounds' ratios ({min(rr):.2f}..{max(rr):.2f}); "
                            f"socket {sk:.1f}, HTTP {hp:.1f} tok/s; the bar: >= 0.95") if rr else "")
        if o and o["gateway_cpu_s"] is not None:
            us = o["gateway_cpu_s"] / o["gateway_tokens"] * 1e6
            tot = pick(o, "http_n", "total_tok_s")
            # The workers step in lockstep: time the gateway takes from either CPU delays the step for all.
            busy = us * 1e-6 * tot * 100 if tot else None
            table.add(case, f"{key} nxd-http CPU per token", "us", us, None, lower_better=True,
                      note=f"{o['gateway_cpu_s']:.2f} CPU s for {o['gateway_tokens']} tokens in requests of "
                           f"{DECODE_N}" + (f"; at {SLOTS} clients' {tot:.0f} tok/s it runs {busy:.1f}% of the "
                                             "time" if busy else ""))
        if o:
            sk, hp = pick(o, "socket_1", "client_cpu_us"), pick(o, "http_1", "client_cpu_us")
            table.add(case, f"{key} bench client CPU per token, HTTP", "us", hp, None, lower_better=True,
                      note=f"over the socket {sk:.1f} us; both read their stream alike (http_side._Stream), and "
                           "on a host whose CPUs the workers fill, the client's CPU is taken from them on either side")
            sk, hp = pick(o, "socket_1", "ttft_s"), pick(o, "http_1", "ttft_s")
            table.add(case, f"{key} nxd first token, HTTP", "ms", ms(hp), None, lower_better=True,
                      note=f"over the socket {ms(sk):.1f} ms; HTTP adds the client's TCP connection, the gateway's "
                           "own to nxd and its hello, per request")

    if "http" in cases:
        http_case("http", "smollm2-135m Q4_1", q41, a.reps)

    # -------------------------------------------------------- speculative decoding (nxd alone)
    # llama.cpp's own prompt-lookup speculation (llama-server --spec-type ngram-simple), drafting as nxd
    # does: the tokens after the latest match of the last 3, at most 8 of them.
    LLAMA_NGRAM = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                   "--spec-ngram-simple-size-m", "8", "--spec-draft-n-max", "8"]

    def spec_case(case, key, path, reps):
        """Decode tok/s of each prompt = (tokens - 1) / (first token .. last token), with and without
        speculation, turn about (which goes first alternates by prompt and repetition); a set's tok/s is
        its tokens over its decode seconds. On both engines: nxd's prompt lookup, llama-server's ngram
        speculation (two servers, one with it, asked turn about). Then, nxd only: a client decoding 128
        tokens (free-form, ignore_eos) beside a client asking one grounded prompt over and over (another
        each round), with and without speculation, turn about."""
        reps = max(1, min(reps, 2))
        spec = {"mode": "prompt", "k": 8}
        sets = {"grounded": spec_prompts.GROUNDED, "free": spec_prompts.FREE}
        log(f"bench: {case}: {len(spec_prompts.GROUNDED)} grounded + {len(spec_prompts.FREE)} free-form prompts "
            f"x {reps}, speculation on and off")

        def chatml(p):
            """One user message p as SmolLM2's template renders it (nxd renders the same)."""
            return SMOLLM2_SYSTEM + f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n"

        def turns(ask):
            """ask(kind, i, mode) -> {"n", "s", "ids", "speculate"} for every prompt, both modes, turn about."""
            out = {"grounded": [], "free": []}
            for r in range(reps):
                for kind, prompts in sets.items():
                    for i in range(len(prompts)):
                        got = {mode: ask(kind, i, mode)
                               for mode in (("off", "prompt") if (i + r) % 2 == 0 else ("prompt", "off"))}
                        out[kind].append({"prompt": i, "rep": r, "off": got["off"], "prompt_mode": got["prompt"],
                                          "same": got["off"]["ids"] == got["prompt"]["ids"]})
            return out

        def timed(times, ids, speculate):
            return {"n": len(times), "s": times[-1] - times[0] if len(times) > 1 else 0.0, "ids": ids,
                    "speculate": speculate}

        def spec_ours():
            with ours.daemon(path) as d:
                c = nxd_side.Conn(d.sock)
                c.request({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0})

                def ask(kind, i, mode):
                    p = sets[kind][i]
                    got = c.request({"messages": [{"role": "user", "content": p}], "max_tokens": DECODE_N,
                                     "temperature": 0, "speculate": dict(spec, mode=mode)}, rid=f"{kind}{i}{mode}")
                    return timed(got["times"], got["ids"], got["done"].get("speculate"))

                out = turns(ask)
                # the prompts as the template renders them, for lookup_ceiling
                out["prompt_ids"] = {kind: [c.tokenize(chatml(p)) for p in prompts] for kind, prompts in sets.items()}
                out["beside"] = beside(d, c)
                out["status"] = c.status().get("speculate")
                c.close()
            return out

        def beside(d, c):
            # The client beside: free-form, 128 tokens, while another asks one grounded prompt over and
            # over. One prompt per round: its prefill then comes from the prompt cache, so what the
            # client beside feels is the drafts' share of the steps, not the speculating client
            # starting new prompts more often because it finishes sooner.
            stop = threading.Event()
            rows = []

            def looper(mode, p):
                cc = nxd_side.Conn(d.sock)
                k = 0
                while not stop.is_set():
                    cc.request({"messages": [{"role": "user", "content": p}], "max_tokens": DECODE_N,
                                "temperature": 0, "speculate": dict(spec, mode=mode)}, rid=f"l{k}")
                    k += 1
                cc.close()

            for r in range(4 * reps + 1):
                for mode in (("off", "prompt") if r % 2 == 0 else ("prompt", "off")):
                    stop.clear()
                    th = threading.Thread(target=looper, args=(mode, spec_prompts.GROUNDED[r % len(spec_prompts.GROUNDED)]))
                    th.start()
                    time.sleep(0.5)
                    b_r = c.request({"messages": [{"role": "user", "content": spec_prompts.FREE[r % len(spec_prompts.FREE)]}],
                                     "max_tokens": DECODE_N, "temperature": 0, "ignore_eos": True,
                                     "speculate": {"mode": "off"}}, rid=f"b{r}{mode}")
                    stop.set()
                    th.join()
                    rows.append({"rep": r, "mode": mode, "tok_s": nxd_side.decode_rates(b_r)[0]})
            return rows

        def spec_llama():
            if not srv_bin or not os.access(srv_bin, os.X_OK):
                raise RuntimeError(f"llama-server not built ({srv_bin})")
            ids = {kind: [text_ids(path, chatml(p)) for p in prompts] for kind, prompts in sets.items()}
            with llama_server.Server(srv_bin, path, THREADS, 1, CTX, N_BATCH) as off, \
                    llama_server.Server(srv_bin, path, THREADS, 1, CTX, N_BATCH, extra=LLAMA_NGRAM) as on:
                for srv in (off, on):
                    srv.generate(ids["free"][0], 8)

                def ask(kind, i, mode):
                    g = (off if mode == "off" else on).generate(ids[kind][i], DECODE_N, ignore_eos=False)
                    tm = g["done"].get("timings") or {}
                    sp = {"drafted": tm["draft_n"], "accepted": tm.get("draft_n_accepted", 0)} if "draft_n" in tm else None
                    return timed(g["times"], g["ids"], sp)

                return turns(ask)

        o, l = both(case, spec_ours, spec_llama)
        res["raw"][f"{case}/{key}"] = {"ours": o, "llama": l}
        with open(os.path.join(a.out, "spec-raw.json"), "w") as f:
            json.dump(res["raw"][f"{case}/{key}"], f)

        def rate(rows, mode):
            n = sum(x[mode]["n"] - 1 for x in rows if x[mode]["n"] > 1)
            t = sum(x[mode]["s"] for x in rows if x[mode]["n"] > 1)
            return n / t if t > 0 else None

        def summary(out, kind):
            """(tok/s speculating, without, per-prompt median ratio, accepted, drafted, identical, prompts)."""
            if not out:
                return None
            rows = out[kind]
            per = [x["prompt_mode"]["n"] / x["prompt_mode"]["s"] / (x["off"]["n"] / x["off"]["s"])
                   for x in rows if x["off"]["n"] > 2 and x["prompt_mode"]["s"] > 0 and x["off"]["s"] > 0]
            dr = sum((x["prompt_mode"]["speculate"] or {}).get("drafted", 0) for x in rows)
            ac = sum((x["prompt_mode"]["speculate"] or {}).get("accepted", 0) for x in rows)
            return (rate(rows, "prompt_mode"), rate(rows, "off"), med(per) if per else None, ac, dr,
                    sum(x["same"] for x in rows), len(rows))

        def ratio(sm):
            return sm[0] / sm[1] if sm and sm[0] and sm[1] else None

        def says(who, sm):
            if not sm or sm[2] is None:
                return ""
            return (f"{who}: per prompt median {sm[2]:.2f}, {sm[3]}/{sm[4]} drafts accepted, "
                    f"output identical in {sm[5]}/{sm[6]}")

        def per_step(out, kind):
            """Decode tokens per step: nxd's while speculating; its lookup's if it drafted k at every step
            (spec_prompts.lookup_steps: what the cost rule leaves out); and the most any prompt lookup could
            give (spec_prompts.lookup_ceiling), on the same answers, drafting at most k."""
            rows = [x for x in out[kind] if x["prompt_mode"]["n"] > 1]
            tok = sum(x["prompt_mode"]["n"] - 1 for x in rows)
            acc = sum((x["prompt_mode"]["speculate"] or {}).get("accepted", 0) for x in rows)

            def rate(f):
                got = [f(out["prompt_ids"][kind][x["prompt"]], x["off"]["ids"], spec["k"]) for x in rows]
                return sum(t for _, t in got) / sum(s for s, _ in got)
            return (tok / (tok - acc) if tok > acc else None, rate(spec_prompts.lookup_steps),
                    rate(spec_prompts.lookup_ceiling))

        for kind in sets:
            so, sl = summary(o, kind), summary(l, kind)
            target = 2.0 if kind == "grounded" else 0.95
            table.add(case, f"{key} {kind} tok/s, speculating", "tok/s", so and so[0], sl and sl[0],
                      note="; ".join(f"{w} without: {sm[1]:.1f} tok/s" for w, sm in (("nxd", so), ("llama.cpp", sl))
                                     if sm and sm[1]) + (f"; llama.cpp: llama-server {' '.join(LLAMA_NGRAM)}"
                                                         if sl else ""))
            table.add(case, f"{key} {kind} speculating / not", "x", ratio(so), ratio(sl),
                      note="; ".join(x for x in (f"nxd target >= {target}", says("nxd", so), says("llama.cpp", sl)) if x))
            if o and o[kind]:
                got, always, most = per_step(o, kind)
                table.add(case, f"{key} {kind} tokens per step", "/step", got, None,
                          note=f"nxd's lookup drafting k every step: {always:.2f}; the most any prompt lookup "
                          f"could give these answers (k {spec['k']}): {most:.2f}")
        if o:
            b_on = med([x["tok_s"] for x in o["beside"] if x["mode"] == "prompt"])
            b_off = med([x["tok_s"] for x in o["beside"] if x["mode"] == "off"])
            table.add(case, f"{key} client beside a speculating one", "x", b_on / b_off if b_on and b_off else None,
                      None, note=f"its tok/s {b_on:.1f} vs {b_off:.1f} beside one that does not (target >= 0.95)"
                      if b_on and b_off else "")

    if "spec" in cases:
        spec_case("spec", "smollm2-135m Q4_1", q41, a.reps)

    # -------------------------------------------------------- speculative decoding with a draft model (nxd alone)
    def draft_case(case, reps):
        """For each (target, draft) pair: one daemon with --draft-model, an untimed warm-up, then per
        repetition the same greedy request with speculate draft (k 4) and off, turn about; decode tok/s =
        (tokens - 1) / (first token .. last token). llama.cpp's own (llama-server -md DRAFT --spec-type
        draft-simple, at most 4 drafts) on the same pairs: a server with the draft and one without, asked
        turn about."""
        reps = max(2, min(reps, 3))
        base = shaped(case, models.LLAMA1B, "q4_0", "llama3.2-1b-shape-random.nx-Q4_0.gguf")
        first2 = base.replace(".gguf", ".first2.gguf")
        if not os.path.exists(first2):
            models.make_truncated(base, first2, 2, log=log)
        pairs = [("target itself", base, base), ("first 2 layers + head", base, first2)]
        for s in (0.0, 0.03, 0.1):
            t = base.replace(".gguf", f".damped{s}.gguf")
            if not os.path.exists(t):
                models.make_damped(base, t, 2, s, log=log)
            pairs.append((f"first 2 layers + head, later layers x{s}", t, first2))
        prompt = [128000] + [1000 + 37 * i for i in range(32)]
        req = {"tokens": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True}
        out = []

        def turns(row, ask):
            for r in range(reps):
                ids = {}
                for mode in (("off", "draft") if r % 2 == 0 else ("draft", "off")):
                    tok_s, ids[mode], sp = ask(mode, r)
                    row["off" if mode == "off" else "draft_mode"].append(tok_s)
                    row["drafted"] += sp.get("drafted", 0)
                    row["accepted"] += sp.get("accepted", 0)
                row["same"] = row["same"] and ids["off"] == ids["draft"]

        def pair_ours(target, draft):
            row = {"off": [], "draft_mode": [], "same": True, "drafted": 0, "accepted": 0,
                   "steps": {"off": [0, 0, 0], "draft": [0, 0, 0]}}  # main steps, draft steps, tokens
            with ours.daemon(target, extra=["--draft-model", draft]) as d:
                c = nxd_side.Conn(d.sock)
                # untimed, drafting: the step-time fits of both models learnt, as in a daemon that has run
                c.request(dict(req, max_tokens=32, speculate={"mode": "draft", "k": 4}))

                def ask(mode, r):
                    st0 = c.status()
                    got = c.request(dict(req, speculate={"mode": mode, "k": 4}), rid=f"{mode}{r}")
                    st1 = c.status()
                    n = row["steps"][mode]
                    n[0] += st1["steps"] - st0["steps"]
                    n[1] += st1["speculate"]["draft_steps"] - st0["speculate"]["draft_steps"]
                    n[2] += len(got["ids"])
                    return nxd_side.decode_rates(got)[0], got["ids"], got["done"].get("speculate") or {}

                turns(row, ask)
                c.close()
            return row

        def pair_llama(target, draft):
            if not srv_bin or not os.access(srv_bin, os.X_OK):
                raise RuntimeError(f"llama-server not built ({srv_bin})")
            row = {"off": [], "draft_mode": [], "same": True, "drafted": 0, "accepted": 0}
            spec = ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0"]
            with llama_server.Server(srv_bin, target, THREADS, 1, CTX, N_BATCH) as off, \
                    llama_server.Server(srv_bin, target, THREADS, 1, CTX, N_BATCH, extra=spec) as on:
                for srv in (off, on):
                    srv.generate(prompt, 8)

                def ask(mode, r):
                    g = (off if mode == "off" else on).generate(prompt, req["max_tokens"])
                    t = g["times"]
                    tm = g["done"].get("timings") or {}
                    return ((len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else None, g["ids"],
                            {"drafted": tm.get("draft_n", 0), "accepted": tm.get("draft_n_accepted", 0)})

                turns(row, ask)
            return row

        def says(who, row):
            on, off = med([x for x in row["draft_mode"] if x]), med([x for x in row["off"] if x])
            if not (on and off):
                return None, ""
            acc = row["accepted"] / row["drafted"] if row["drafted"] else 0.0
            return on / off, (f"{who} {on:.1f} vs {off:.1f} tok/s, acceptance {acc:.2f} "
                              f"({row['accepted']}/{row['drafted']}), output identical: {row['same']}")

        for what, target, draft in pairs:
            log(f"bench: {case}: {what} x {reps}")
            o, l = both(case, lambda: pair_ours(target, draft), lambda: pair_llama(target, draft))
            out.append({"what": what, "target": os.path.basename(target), "draft": os.path.basename(draft),
                        "ours": o, "llama": l})
            ro, no = says("nxd", o) if o else (None, "")
            rl, nl = says("llama.cpp", l) if l else (None, "")
            if o and no:
                ms, ds, nt = o["steps"]["draft"]
                no += f", per token {ms / nt:.2f} main + {ds / nt:.2f} draft steps" if nt else ""
            table.add(case, f"llama3.2-1b-shape Q4_0(nx), draft: {what}", "x", ro, rl,
                      note="; ".join(x for x in (no, nl) if x))
        res["raw"][case] = out

    # -------------------------------------------------------- memory and start-up
    if "memory" in cases:
        case = "memory"
        reps = max(1, min(a.reps, 3))
        mi = model_info("smollm2-135m Q4_1", q41)
        log(f"bench: {case}: start-to-ready x {reps}, PSS after a request")
        prompt = text_ids(q41, CHAT)

        def mem_ours():
            readies, pss = [], None
            for i in range(reps):
                with ours.daemon(q41) as d:
                    readies.append(d.ready_s)
                    if i == reps - 1:
                        c = nxd_side.Conn(d.sock)
                        c.generate(prompt, 16)
                        st = c.status()
                        c.close()
                        pss = d.pss()
                        arena = [l.split("info: ", 1)[-1].strip() for l in d.tail(60).splitlines()
                                 if "arena:" in l or " pages" in l]  # and what pages the weights got
            return {"ready_s": readies, "pss_kib": pss, "status": st, "arena_log": arena}

        def mem_llama():
            out = {"load_s_python": [], "ready_s_server": []}
            for _ in range(reps):
                r = run_llama_side(q41, 1, decode={"prompt": prompt, "n": 16})
                out["load_s_python"].append(r["load_s"])
                out["pss_kib_python"] = r["pss_kib"]
            if srv_bin and os.access(srv_bin, os.X_OK):
                for i in range(reps):
                    with llama_server.Server(srv_bin, q41, THREADS, SLOTS, CTX, N_BATCH) as s:
                        out["ready_s_server"].append(s.ready_s)
                        if i == reps - 1:
                            s.generate(prompt, 16)
                            out["pss_kib_server"] = s.pss()
            return out

        o, l = both(case, mem_ours, mem_llama)
        res["raw"]["memory"] = {"ours": o, "llama": l}
        # KV: f16 K and V for every slot, layer and position (nxd and llama.cpp both keep f16).
        import gguf
        r = gguf.GGUFReader(q41)
        arch = r.fields["general.architecture"].contents()
        g = lambda k: int(r.fields[f"{arch}.{k}"].contents())  # noqa: E731
        kv_dim = g("embedding_length") // g("attention.head_count") * g("attention.head_count_kv")
        kv_bytes = SLOTS * CTX * g("block_count") * 2 * kv_dim * 2
        model_bytes = mi["bytes"]
        res["raw"]["memory"]["expected"] = {"model_bytes": model_bytes, "kv_bytes": kv_bytes}
        opss = sum(v for v in o["pss_kib"].values() if v) * 1024 / 2**20 if o and o.get("pss_kib") else None
        lpss = (sum(v for v in l["pss_kib_server"].values() if v) * 1024 / 2**20
                if l and l.get("pss_kib_server") else None)
        table.add(case, f"PSS sum, {SLOTS} slots x {CTX} ctx", "MiB", opss, lpss, lower_better=True,
                  note=f"model {model_bytes / 2**20:.0f} + KV {kv_bytes / 2**20:.0f} MiB = "
                       f"{(model_bytes + kv_bytes) / 2**20:.0f} MiB + scratch; llama.cpp = llama-server")
        table.add(case, "start to ready (vs llama-server)", "s", med(o["ready_s"]) if o else None,
                  med(l["ready_s_server"]) if l else None, lower_better=True)
        table.add(case, "start to ready (vs Llama() load)", "s", med(o["ready_s"]) if o else None,
                  med(l["load_s_python"]) if l else None, lower_better=True)

    # -------------------------------------------------------- Qwen2.5-0.5B-shaped
    if "qwen" in cases:
        qpath = os.path.join(mdir, "qwen2.5-0.5b-shape-random.nx-Q4_K_M.gguf")
        if not os.path.exists(qpath):
            log("bench: qwen: making the Qwen2.5-0.5B-shaped model (once)")
            models.make_qwen(libnx, qpath, threads=THREADS, log=log)
        reps = a.reps
        decode_case("qwen", "qwen2-0.5b-shape Q4_K_M(nx)", qpath, reps)
        prefill_case("qwen", "qwen2-0.5b-shape Q4_K_M(nx)", qpath, reps)
        l = concurrent_case("qwen", "qwen2-0.5b-shape Q4_K_M(nx)", qpath, reps)
        concurrent_case("qwen", "qwen2-0.5b-shape Q4_K_M(nx) fast", qpath, reps, llama=l, **FAST)

    # -------------------------------------------------------- Qwen3-30B-A3B-shaped mixture of experts
    if "moe" in cases:
        mpath = os.path.join(mdir, f"qwen3moe-30b-a3b-shape-{models.QWEN3MOE['n_layer']}l-random.nx-Q4_K_M.gguf")
        if not os.path.exists(mpath):
            log("bench: moe: making the Qwen3-30B-A3B-shaped model (once)")
            models.make_qwen3moe(libnx, mpath, threads=THREADS, log=log)
        decode_case("moe", "qwen3moe-30b-a3b-shape Q4_K_M(nx)", mpath, a.reps)
        prefill_case("moe", "qwen3moe-30b-a3b-shape Q4_K_M(nx)", mpath, a.reps)

    # -------------------------------------------------------- Qwen3-0.6B- and Llama-3.2-1B-shaped
    def shaped(case, shape, mode, fname):
        path = os.path.join(mdir, fname)
        if not os.path.exists(path):
            log(f"bench: {case}: making the {shape['name']}-shaped model, {mode} (once)")
            models.make_random(libnx, path, shape, mode, threads=THREADS, log=log)
        return path

    if "qwen3" in cases:
        p = shaped("qwen3", models.QWEN3, "q4_k_m", "qwen3-0.6b-shape-random.nx-Q4_K_M.gguf")
        decode_case("qwen3", "qwen3-0.6b-shape Q4_K_M(nx)", p, a.reps)
        prefill_case("qwen3", "qwen3-0.6b-shape Q4_K_M(nx)", p, a.reps)

    if "llama1b" in cases:
        for mode in ("q4_k_m", "q4_0", "q8_0"):
            p = shaped("llama1b", models.LLAMA1B, mode, f"llama3.2-1b-shape-random.nx-{mode.upper()}.gguf")
            key = f"llama3.2-1b-shape {mode.upper()}(nx)"
            decode_case("llama1b", key, p, a.reps)
            prefill_case("llama1b", key, p, a.reps)

    if "draft" in cases:  # after shaped(): it makes the 1B-shaped target
        draft_case("draft", a.reps)

    # -------------------------------------------------------- amx: the AMX kernels on and off
    # nxd against itself with NX_KERN=avx512 (the "llama.cpp" column), not against llama.cpp.
    if "amx" in cases:
        if not {"amx_tile", "amx_int8"} <= set(res["machine"].get("cpu_simd", [])):
            log("bench: amx: AMX: not available on this CPU; case skipped")
            res["amx"] = "not available"
        elif not ours.ok:
            log(f"bench: amx: nxd {ours.why}; case skipped")
        else:
            off = {"NX_KERN": "avx512"}
            p1b = shaped("amx", models.LLAMA1B, "q4_k_m", "llama3.2-1b-shape-random.nx-Q4_K_M.gguf")
            for key, path in (("smollm2-135m Q4_1", q41), ("llama3.2-1b-shape Q4_K_M(nx)", p1b)):
                log(f"bench: amx: {key}: prefill and decode, AMX on and off")
                on_p, off_p = ours.prefill(path, (128, 512), a.reps), ours.prefill(path, (128, 512), a.reps, env=off)
                dprompt = prompt_ids(11, 64)
                on_d, off_d = ours.decode(path, dprompt, a.reps), ours.decode(path, dprompt, a.reps, env=off)
                res["raw"][f"amx/{key}"] = {"on": {"prefill": on_p, "decode": on_d},
                                            "off": {"prefill": off_p, "decode": off_d}}
                for n in (128, 512):
                    table.add("amx", f"{key} prefill {n}", "tok/s", med(on_p[str(n)]["tok_s"]),
                              med(off_p[str(n)]["tok_s"]), note="nxd AMX on / off (NX_KERN=avx512)")
                table.add("amx", f"{key} decode", "tok/s", med(on_d["tok_s"]), med(off_d["tok_s"]),
                          note="nxd AMX on / off (NX_KERN=avx512)")
                if on_d["ids"] != off_d["ids"]:
                    log(f"bench: amx: {key}: the answers differ with AMX on and off")

    # -------------------------------------------------------- clients: 1 .. 64 at once
    if "clients" in cases:
        reps = MIN_REPS
        cprompts = [text_ids(q41, f"<|im_start|>user\n{QUESTIONS[i % len(QUESTIONS)]} ({i})<|im_end|>\n"
                                  "<|im_start|>assistant\n") for i in range(CURVE_SLOTS)]
        log(f"bench: clients: {list(curve.LEVELS)} clients x {CURVE_N} tokens x {reps}, {CURVE_SLOTS} slots")

        def curve_ours():
            with ours.daemon(q41, slots=CURVE_SLOTS) as d:
                st = nxd_side.Conn(d.sock)
                try:
                    return curve.curve(lambda ps: nxd_side.concurrent(d.sock, ps, CURVE_N), lambda i: cprompts[i],
                                       reps, log=log, who="nxd",
                                       counters=curve.counters(d.pids, lambda: st.status()["steps"]))
                finally:
                    st.close()

        def curve_llama():
            if not srv_bin or not os.access(srv_bin, os.X_OK):
                raise RuntimeError(f"llama-server not built ({srv_bin})")
            with llama_server.Server(srv_bin, q41, THREADS, CURVE_SLOTS, CTX, N_BATCH) as s:
                return curve.curve(lambda ps: s.concurrent(ps, CURVE_N), lambda i: cprompts[i], reps, log=log,
                                   who="llama-server", counters=curve.counters(lambda: [s.proc.pid]))

        o, l = both("clients", curve_ours, curve_llama)
        res["raw"]["clients"] = {"ours": o, "llama": l, "slots": CURVE_SLOTS, "tokens": CURVE_N}
        for n in curve.LEVELS:
            on, ln = (o or {}).get(n), (l or {}).get(n)
            table.add("clients", f"smollm2-135m Q4_1 {n} clients total tok/s", "tok/s", on and on["tok_s"],
                      ln and ln["tok_s"],
                      note=f"all decoding; over the burst {on['burst_tok_s']:.1f} vs {ln['burst_tok_s']:.1f}"
                      if on and ln else "")
            table.add("clients", f"smollm2-135m Q4_1 {n} clients p99 per token", "ms", on and on["p99_ms"],
                      ln and ln["p99_ms"], lower_better=True,
                      note=f"p50 {on['p50_ms']:.1f} vs {ln['p50_ms']:.1f} ms" if on and ln else "")
        curve.plot(o, l, os.path.join(a.out, "clients.png"),
                   f"SmolLM2-135M Q4_1, {CURVE_SLOTS} slots, {CURVE_N} greedy tokens per client, {THREADS} threads")
    # -------------------------------------------------------- constrained decoding
    def structured_case(case, key, path, reps, n_tok):
        log(f"bench: {case}: {key}: {n_tok} tokens under a schema and free, x {reps}")

        def gen(c, rid, prompt, fmt):
            req = {"id": rid, "op": "generate", "tokens": prompt, "max_tokens": n_tok, "temperature": 0.8,
                   "seed": 7 + rid, "stream": True}
            if fmt:
                req["format"] = fmt
            else:
                req["ignore_eos"] = True
            c.send(req)
            times = []
            while True:
                ev = c.recv()
                if ev.get("event") == "token":
                    times.append(time.perf_counter())
                elif ev.get("event") == "done":
                    break
                elif ev.get("event") == "error":
                    raise nxd_side.DaemonError(f"generate: {ev.get('code')}: {ev.get('message')}")
            n = len(times)
            return ((n - 1) / (times[-1] - times[0]) if n >= 17 else None), n

        def run():
            with ours.daemon(path) as d:
                c = nxd_side.Conn(d.sock)
                c.send({"id": "t", "op": "tokenize", "special": True, "text": STRUCTURED_PROMPT})
                prompt = c.recv()["tokens"]
                gen(c, 1, prompt, None), gen(c, 2, prompt, STRUCTURED_SCHEMA)  # warm-up
                free, con, ns = [], [], []
                for k in range(reps):
                    order = (None, STRUCTURED_SCHEMA) if k % 2 == 0 else (STRUCTURED_SCHEMA, None)
                    for fmt in order:
                        r, n = gen(c, 10 + k, prompt, fmt)
                        (con if fmt else free).append(r)
                        if fmt:
                            ns.append(n)
                c.close()
            return {"free_tok_s": free, "schema_tok_s": con, "schema_tokens": ns}

        o = None
        if ours.ok:
            try:
                o = run()
            except Exception as e:
                log(f"bench: {case}: nxd failed: {e}")
                res["raw"].setdefault("errors", []).append(f"{case}: nxd: {e}")
        res["raw"][f"{case}/{key}/structured"] = {"ours": o, "schema": STRUCTURED_SCHEMA}
        if o:
            f, s_ = med(o["free_tok_s"]), med(o["schema_tok_s"])
            table.add(case, f"{key} decode under a schema / free", "x", s_ / f if f and s_ else None, None,
                      note=f"free {f:.1f}, schema {s_:.1f} tok/s (temperature 0.8, {med(o['schema_tokens'])} tokens "
                           "in the schema's answers); the bar: >= 0.90" if f and s_ else "")

    if "structured" in cases:
        structured_case("structured", "smollm2-135m Q4_1", q41, a.reps, DECODE_N)
        qpath = os.path.join(mdir, "qwen2.5-0.5b-shape-random.nx-Q4_K_M.gguf")
        if not os.path.exists(qpath):
            log("bench: structured: making the Qwen2.5-0.5B-shaped model (once)")
            models.make_qwen(libnx, qpath, threads=THREADS, log=log)
        structured_case("structured", "qwen2-0.5b-shape Q4_K_M(nx)", qpath, a.reps, 64)

    # -------------------------------------------------------- report
    res["table"] = table.rows
    res["elapsed_s"] = time.time() - t_start
    res["machine"]["foreign_cpu"] = fs = foreign_share(snap0, cpu_snapshot())
    try:
        res["machine"]["loadavg_end"] = os.getloadavg()
    except OSError:
        pass
    title = (f"nxd vs llama.cpp (llama-cpp-python {llama_info.get('llama_cpp_python')}), {THREADS} threads, "
             f"bandwidth {bw_gbs:.1f} GB/s" + ("" if ours.ok else " — nxd side NOT RUN"))
    if fs["share"] is not None and fs["share"] >= 0.05:
        title += f"\nmachine NOT idle: other processes used {100 * fs['share']:.0f}% of the CPU time; numbers skewed"
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(table.rows, os.path.join(a.out, "results.png"), title)
    print()
    print(title)
    print(f"memory read bandwidth: best {bw['best_gbs']:.2f} GB/s, median {bw['median_gbs']:.2f} GB/s "
          f"({THREADS} threads) at the start" +
          "".join(f"; best {p['best_gbs']:.2f} after {p['after']}" for p in probes) +
          "; %bw = tok/s x weight bytes per token / the best probe before or after the case"
          "; paired: each decode repetition against the probes just before and after it")
    amx = [x for x in res["machine"].get("cpu_simd", []) if x.startswith("amx")]
    print(f"CPU: {res['machine'].get('cpu')}; " + (f"AMX: {' '.join(amx)} (nxd's prefill and steps of many tokens "
                                                   "take it; the amx case compares NX_KERN=avx512)" if amx
                                                   else "AMX: not available"))
    print(f"llama.cpp: llama-cpp-python {llama_info.get('llama_cpp_python')}; "
          f"llama-server {llama_info.get('llama_server_version', '?').splitlines()[0] if llama_info.get('llama_server_version') else '?'}")
    print(f"ggml system info: {llama_info.get('system_info')}")
    if not ours.ok:
        print(f"nxd: not run: {ours.why}")
    print()
    print(table.text())
    if ours.ok and res["raw"].get("memory", {}).get("ours"):
        for line in res["raw"]["memory"]["ours"].get("arena_log", []):
            print(f"nxd {line}")
    if fs["share"] is not None:
        print(f"other processes used {fs['other_cpu_s']:.0f} CPU s of {fs['wall_s'] * (os.cpu_count() or 1):.0f} "
              f"({100 * fs['share']:.1f}%) during the run; steal {fs['steal_s']:.1f} s"
              + ("  -- NOT an idle machine: numbers are skewed" if fs["share"] >= 0.05 else ""))
    for e in res["raw"].get("errors", []):
        print(f"error: {e}")
    print(f"\nratio = nxd / llama.cpp (higher is better for tok/s, lower for MiB and s); "
          f"{res['elapsed_s']:.0f} s; {os.path.join(a.out, 'results.json')}, results.png")


if __name__ == "__main__":
    main()
