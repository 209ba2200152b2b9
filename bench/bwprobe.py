"""bwprobe.py - runs the memory read bandwidth probe (bench/bw.c) and reads its line; shared by run.py and
llama_side.py, which probes between its decode repetitions."""
import re
import subprocess


def run(argv):
    """argv: the probe's whole command line. Returns {best_gbs, median_gbs, line}."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    m = re.search(r"best ([\d.]+) GB/s median ([\d.]+) GB/s", p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"bw failed: {p.stdout} {p.stderr}")
    return {"best_gbs": float(m.group(1)), "median_gbs": float(m.group(2)), "line": p.stdout.strip()}
