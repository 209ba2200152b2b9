"""llama_side.py - llama.cpp's side of the benchmark, run in .venv-bench as a child process per model file.

    .venv-bench/bin/python bench/llama_side.py < SPEC.json > RESULT.json

SPEC: {"model", "threads", "n_ctx", "n_batch", "flash_attn", "reps", "type_kv": GGML type of K and V | null,
       "decode": {"prompt": [ids], "n": 128} | null, "prefill": {"128": [ids], ...} | null,
       "depth": {"prefix": [ids], "news": [[ids], ...], "n": 128} | null}

Loads the model with llama_cpp.Llama (n_threads = n_threads_batch = threads, n_batch = n_ubatch),
then drives llama.cpp's C API (llama_decode on llama_batch_get_one, logits of the last token only,
argmax in numpy) so both engines time the same thing:
  decode  - prefill the prompt (untimed), sample the first token, then time the remaining n-1
            single-token steps with greedy sampling: (n-1) / seconds; EOS is not checked (ignore_eos)
  prefill - clear the KV cache, time llama_decode over the prompt in n_batch chunks up to the
            last token's logits: prompt tokens / seconds
  depth   - the prefix in the KV cache (untimed, once), then per repetition: time the new tokens
            (prefill at the prefix's depth), then the n-1 decode steps after them, as decode; the
            positions past the prefix are removed before the next one (llama-bench -d's two numbers)
One short untimed warm-up first (it touches the mmap'd weights). Repetitions stop early, after at least
"min_reps", once the next one would pass "budget_s" seconds for this measurement.
"""
import json
import os
import sys
import time

import numpy as np
import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwprobe  # noqa: E402


def pss_kib():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return None


def main():
    spec = json.load(sys.stdin)
    threads, n_batch = spec["threads"], spec["n_batch"]
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=spec["model"], n_threads=threads, n_threads_batch=threads,
                          n_batch=n_batch, n_ubatch=n_batch, n_ctx=spec["n_ctx"],
                          flash_attn=bool(spec.get("flash_attn", False)), type_k=spec.get("type_kv"),
                          type_v=spec.get("type_kv"), verbose=False)
    load_s = time.perf_counter() - t0
    ctx = llm.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    n_vocab = llm.n_vocab()
    sync = getattr(llama_cpp, "llama_synchronize", None)

    def clear():
        llama_cpp.llama_memory_clear(mem, True)

    def feed(tokens):
        """llama_decode the tokens in n_batch chunks; returns the last token's logits (a view)."""
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        for a in range(0, len(tokens), n_batch):
            n = min(n_batch, len(tokens) - a)
            ptr = ctypes_offset(arr, a)
            rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(ptr, n))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        if sync:
            sync(ctx)
        p = llama_cpp.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(p, shape=(n_vocab,))

    out = {"load_s": load_s, "n_vocab": n_vocab, "flash_attn": bool(spec.get("flash_attn", False))}
    reps, min_reps, budget = spec["reps"], spec.get("min_reps", 3), spec.get("budget_s", 1e9)

    def repeat(fn):
        """fn() -> (rate, seconds, extra); the rates and the first extra."""
        rates, first, spent = [], None, 0.0
        while len(rates) < reps:
            r, sec, extra = fn()
            rates.append(r)
            first = extra if first is None else first
            spent += sec
            if len(rates) >= min_reps and spent + sec > budget:
                break
        return rates, first

    if spec.get("decode"):
        prompt, n = spec["decode"]["prompt"], spec["decode"]["n"]

        probe, probes = spec["decode"].get("probe"), []

        def one_decode(n=n, warm=False):
            if probe and not warm:
                probes.append(bwprobe.run(probe))
            clear()
            tok = int(np.argmax(feed(prompt)))
            ids = [tok]
            t = time.perf_counter()
            for _ in range(n - 1):
                tok = int(np.argmax(feed([tok])))
                ids.append(tok)
            sec = time.perf_counter() - t
            return (n - 1) / sec, sec, ids

        one_decode(16, warm=True)
        rates, ids = repeat(one_decode)
        out["decode"] = {"tok_s": rates, "ids": ids, "n": n, "prompt_tokens": len(prompt)}
        if probe:
            probes.append(bwprobe.run(probe))
            out["decode"]["probes_gbs"] = [p["best_gbs"] for p in probes]
            out["decode"]["probes_median_gbs"] = [p["median_gbs"] for p in probes]

    if spec.get("prefill"):
        out["prefill"] = {}
        warm = False
        for key, prompt in spec["prefill"].items():
            if not warm:
                clear()
                feed(prompt[:128])  # warm-up
                warm = True

            def one_prefill(prompt=prompt):
                clear()
                t = time.perf_counter()
                feed(prompt)
                sec = time.perf_counter() - t
                return len(prompt) / sec, sec, None

            rates, _ = repeat(one_prefill)
            out["prefill"][key] = {"tok_s": rates}
    if spec.get("depth"):
        prefix, news, n = spec["depth"]["prefix"], spec["depth"]["news"], spec["depth"]["n"]
        clear()
        feed(prefix)
        pre, dec = [], []
        for new in news[:max(1, reps)]:
            llama_cpp.llama_memory_seq_rm(mem, 0, len(prefix), -1)
            t = time.perf_counter()
            tok = int(np.argmax(feed(new)))
            pre.append(len(new) / (time.perf_counter() - t))
            t = time.perf_counter()
            for _ in range(n - 1):
                tok = int(np.argmax(feed([tok])))
            dec.append((n - 1) / (time.perf_counter() - t))
        out["depth"] = {"prefill_tok_s": pre, "decode_tok_s": dec, "depth": len(prefix)}
    out["pss_kib"] = pss_kib()
    json.dump(out, sys.stdout)


def ctypes_offset(arr, a):
    import ctypes
    return ctypes.cast(ctypes.byref(arr, a * ctypes.sizeof(llama_cpp.llama_token)),
                       ctypes.POINTER(llama_cpp.llama_token))


if __name__ == "__main__":
    # llama.cpp logs to stderr; keep stdout for the JSON result.
    main()
