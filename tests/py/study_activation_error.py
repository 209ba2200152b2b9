"""study_activation_error.py - where SmolLM2 loses top-1 agreement with the float64 reference, and what it costs to win it back (a study, not a test).

Accuracy (default): runs the float64 numpy reference (reference.py) over
test_real_model.py's 337 teacher-forced tokens with the engine's rounding
points - the input of each quantized matmul, the f16 K/V cache - switched on
one kind at a time, and with other activation formats in their place, and
prints for each configuration how far its logits are from the exact float64
ones: top-1 agreement, mean / max |dlogit|, and the rms change of the
reference's top-1 minus top-2 margin (what decides a flip; less noisy than the
count of flips). No engine code is involved.

    NXD_MODEL=$(scripts/fetch-model) .venv/bin/python tests/py/study_activation_error.py [--only NAME,...]

Speed (--bench A,B,...): times nx-eval binaries, alternating, on a decode plan
(128 steps of 1 token) and a prefill plan (337 tokens in steps of 64), 2
threads, and prints median wall and CPU seconds of each (CPU time is the
steadier figure on a shared machine).

    .venv/bin/python tests/py/study_activation_error.py --bench build-a/nx-eval,build-b/nx-eval --reps 5

Op kinds (the matmul whose input is rounded):
    qkv   attn_q / attn_k / attn_v input (attn-normed residual)
    wo    attn_output input (attention output)
    gu    ffn_gate / ffn_up input (ffn-normed residual)
    down  ffn_down input (silu(gate) * up)
    head  output head input (final-normed residual)
and "kv": K/V stored as f16.
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import Reference, round_hi_lo, round_q8_0, round_q8_0_two_part  # noqa: E402
from test_real_model import TEXT_IDS  # noqa: E402

OPS = ("qkv", "wo", "gu", "down", "head")
_OP_OF = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "attn_output": "wo", "ffn_gate": "gu",
          "ffn_up": "gu", "ffn_down": "down"}
# One weight per op kind whose input is sampled for the statistics table (Q/K/V and gate/up share theirs).
_STATS_OF = {"attn_q", "attn_output", "ffn_gate", "ffn_down"}


def op_of(name):
    """Op kind of weight `name` ("blk.3.ffn_down.weight" -> "down"; the head -> "head")."""
    parts = name.split(".")
    return _OP_OF[parts[2]] if parts[0] == "blk" else "head"


def round_blocks(x, block, qmax, scale=np.float32):
    """x (..., n) through symmetric blocks of `block` values, as ggml's Q8_0 does it: d = amax / qmax,
    q = round(x / d) (ties away from zero), stored d rounded to `scale`; back to float64."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, block)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(qmax)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = b * idv
    q = np.trunc(v + np.copysign(np.float32(0.5), v))
    return (q * d.astype(scale).astype(np.float32)).astype(np.float64).reshape(np.shape(x))


# Activation formats: name -> (x float64 -> x as a matmul would see it). No Q8_K
# here: SmolLM2's widths (576, 1536) are not all multiples of 256.
FORMATS = {
    "q8_0": round_q8_0,                                          # one Q8_0: int8 per 32, f16 scale (the engine before)
    "q8_32f": lambda x: round_blocks(x, 32, 127),                # int8 per 32, f32 scale
    "q8_16f": lambda x: round_blocks(x, 16, 127),                # int8 per 16, f32 scale
    "q8_8f": lambda x: round_blocks(x, 8, 127),                  # int8 per 8, f32 scale
    "q10_32f": lambda x: round_blocks(x, 32, 511),               # 10 bits per 32, f32 scale
    "q12_32f": lambda x: round_blocks(x, 32, 2047),              # 12 bits per 32, f32 scale
    "q16_32": lambda x: round_blocks(x, 32, 32767, np.float16),  # int16 per 32, f16 scale
    "q16_32f": lambda x: round_blocks(x, 32, 32767),             # int16 per 32, f32 scale
    "q8_0x2": lambda x: round_hi_lo(x, round_q8_0),              # hi = Q8_0(x), lo = Q8_0(x - hi) (the engine before)
    "q8_0t": round_q8_0_two_part,                                # lo in steps of hi's scale / 128 (the engine now)
    "f16": lambda x: np.asarray(x).astype(np.float16).astype(np.float64),
    "f32": lambda x: np.asarray(x).astype(np.float32).astype(np.float64),
}


class StudyReference(Reference):
    """The float64 reference with a chosen activation format per op kind and an optional f16 K/V cache."""

    def __init__(self, path):
        super().__init__(path)
        self.fmt = {}       # op kind -> format name (absent: exact float64)
        self.kv_f16 = False
        self.stats = None   # op kind -> [per-layer statistics], while collecting
        self._wt = {}

    def _w(self, name):
        w = self._wt.get(name)  # float64 copies, reused by every configuration
        if w is None:
            w = self._wt[name] = self.t[name].astype(np.float64)
        return w

    def _mm(self, x, name):
        op = op_of(name)
        if self.stats is not None and (op == "head" or name.split(".")[2] in _STATS_OF):
            self.stats.setdefault(op, []).append(act_stats(x))
        f = self.fmt.get(op)
        if f is not None:
            x = FORMATS[f](x)
        return x @ self._w(name).T

    def _kv(self, x):
        return x.astype(np.float16).astype(np.float64) if self.kv_f16 else x

    def run(self, fmt, kv_f16=False):
        self.fmt, self.kv_f16 = dict(fmt), kv_f16
        return self.logits(TEXT_IDS)


def act_stats(x):
    """How hard one matmul input x (T, n) is to quantize."""
    rms = np.sqrt(np.mean(x * x, axis=1))
    peak = np.abs(x).max(axis=1)
    err = np.sqrt(np.sum((round_q8_0(x) - x) ** 2, axis=1) / np.sum(x * x, axis=1))
    return dict(peak_rms=np.median(peak / rms), peak=peak.max(), peak_ch=int(np.abs(x).max(axis=0).argmax()),
                q8_err=np.median(err))


def score(got, want):
    """Top-1 agreement, mean / max |d|, rms change of the reference's top-1 - top-2 margin, flip margins."""
    d = np.abs(got - want)
    order = np.argsort(-want, axis=1)[:, :2]
    rows = np.arange(len(want))
    m_want = want[rows, order[:, 0]] - want[rows, order[:, 1]]
    m_got = got[rows, order[:, 0]] - got[rows, order[:, 1]]
    agree = got.argmax(1) == want.argmax(1)
    return dict(top1=agree.mean(), n_flip=int((~agree).sum()), mean=d.mean(), max=d.max(),
                dmargin=np.sqrt(np.mean((m_got - m_want) ** 2)), flips=np.round(m_want[~agree], 3).tolist())


def configs():
    """(name, {op: format}, f16 K/V) in report order."""
    one = {op: "q8_0" for op in OPS}
    out = [("exact", {}, False), ("engine before: all q8_0 + f16 kv", one, True), ("f16 kv only", {}, True),
           ("all f32 + f16 kv", {op: "f32" for op in OPS}, True)]
    out += [(f"only {op} q8_0", {op: "q8_0"}, False) for op in OPS]             # one op rounded, rest exact
    out += [(f"all q8_0 + f16 kv but {op} exact", {**one, op: None}, True) for op in OPS]
    out += [(f"all q8_0 + f16 kv, down {f}", {**one, "down": f}, True) for f in ("q8_16f", "q16_32f", "f16")]
    out.append(("all q8_0 + f16 kv, qkv gu head q16_32f", {**one, "qkv": "q16_32f", "gu": "q16_32f",
                                                            "head": "q16_32f"}, True))
    out += [(f"all {f} + f16 kv", {op: f for op in OPS}, True)
            for f in ("q8_32f", "q8_16f", "q8_8f", "q10_32f", "q12_32f", "q16_32", "q16_32f", "q8_0x2", "q8_0t")]
    return out


def study(model, only):
    ref = StudyReference(model)
    t0 = time.time()
    exact = ref.run({})
    margins = np.diff(np.sort(exact, axis=1)[:, -2:], axis=1)[:, 0]
    print(f"# {len(TEXT_IDS)} tokens, {time.time() - t0:.0f} s per pass, logit std {exact.std():.2f}; reference "
          f"top-2 margins below 0.01 / 0.03 / 0.1: {(margins < 0.01).sum()} / {(margins < 0.03).sum()} / "
          f"{(margins < 0.1).sum()}")

    ref.stats = {}
    ref.run({})
    print("\n| op input | median peak/rms | max abs x (layer, channel) | median Q8_0 rel. rms error |")
    print("|---|---|---|---|")
    for op in OPS:
        s = ref.stats[op]
        i = int(np.argmax([v["peak"] for v in s]))
        where = f"layer {i}, ch {s[i]['peak_ch']}" if op != "head" else f"ch {s[i]['peak_ch']}"
        print(f"| {op} | {np.median([v['peak_rms'] for v in s]):.1f} | {s[i]['peak']:.1f} ({where}) | "
              f"{np.median([v['q8_err'] for v in s]):.4f} |")
    ref.stats = None

    cfgs = configs()
    if only:
        cfgs = [c for c in cfgs if any(k in c[0] for k in only.split(","))]
    print("\n| configuration | top-1 | flips | mean abs d | max abs d | rms d(margin) | flip margins |")
    print("|---|---|---|---|---|---|---|")
    for name, fmt, kv in cfgs:
        s = score(ref.run({k: v for k, v in fmt.items() if v}, kv), exact)
        print(f"| {name} | {s['top1']:.3f} | {s['n_flip']} | {s['mean']:.4f} | {s['max']:.3f} | "
              f"{s['dmargin']:.4f} | {s['flips']} |", flush=True)


def bench(model, bins, reps):
    ids = " ".join(map(str, TEXT_IDS))
    plans = {
        "decode 128 x 1": f"seq 0 {' '.join(map(str, TEXT_IDS[:128]))}\n" + "".join(f"step 0:{i}:1\n" for i in range(128)),
        "prefill 337 / 64": f"seq 0 {ids}\n" + "".join(f"step 0:{i}:{min(64, len(TEXT_IDS) - i)}\n"
                                                       for i in range(0, len(TEXT_IDS), 64)),
    }
    wall = {(b, p): [] for b in bins for p in plans}
    cpu = {(b, p): [] for b in bins for p in plans}
    for _ in range(reps):
        for p, text in plans.items():
            for b in bins:
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                subprocess.run([b, model, "--threads", "2"], input=text.encode(), capture_output=True, check=True)
                wall[(b, p)].append(time.perf_counter() - t)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[(b, p)].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    print("| plan | binary | wall median (min) s | cpu median (min) s |")
    print("|---|---|---|---|")
    for p in plans:
        for b in bins:
            w, c = wall[(b, p)], cpu[(b, p)]
            print(f"| {p} | {b} | {statistics.median(w):.3f} ({min(w):.3f}) | {statistics.median(c):.3f} "
                  f"({min(c):.3f}) |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("NXD_MODEL"))
    ap.add_argument("--only", help="comma-separated substrings of the configuration names to run")
    ap.add_argument("--bench", help="comma-separated nx-eval binaries to time instead")
    ap.add_argument("--reps", type=int, default=5, help="--bench runs per binary and plan")
    a = ap.parse_args()
    if not a.model:
        sys.exit("set NXD_MODEL or pass --model (scripts/fetch-model prints the path)")
    if a.bench:
        bench(a.model, a.bench.split(","), a.reps)
    else:
        study(a.model, a.only)


if __name__ == "__main__":
    main()
