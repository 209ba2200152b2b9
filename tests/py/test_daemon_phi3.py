"""test_daemon_phi3.py - nxd serving phi3 and smollm3: the chat template it detects, and answers token for token those of nx-eval.

The daemon packs the matrices in place in its workers' memory (daemon/model.c:
nx_model_repack_inplace), phi3's fused ones as their parts; greedy answers
must be the ones nx-eval computes (tests/py/test_forward_phi3.py grades those
against the float64 reference), with LongRoPE's set chosen by --ctx.
"""
import subprocess

import pytest

import make_tiny_phi3
from conftest import tool
from nxd_helpers import Client, Daemon

TEMPLATES = make_tiny_phi3.Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


def greedy_nx_eval(model, prompt, n, ctx):
    p = subprocess.run([str(tool("nx-eval")), str(model), "--ctx", str(ctx), "--generate", str(n), "--prompt-ids",
                        ",".join(map(str, prompt))], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return [int(x) for x in p.stdout.split()]


@pytest.mark.parametrize("arch,ctx", [("phi3", 256), ("phi3", 64), ("smollm3", 256)])
def test_greedy_answers_are_nx_evals(tmp_path, arch, ctx):
    if arch == "phi3":
        tmpl = (TEMPLATES / "phi3.5.jinja").read_text().removesuffix("\n")
        model, _ = make_tiny_phi3.build_phi3(tmp_path / "m.gguf", wtype="Q4_K", seed=330, long_rope=True, orig_ctx=64,
                                             window=6, vocab=True, chat_template=tmpl)
    else:
        model, _ = make_tiny_phi3.build_smollm3(tmp_path / "m.gguf", wtype="Q8_0", seed=331, vocab=True)
    with Daemon(model, tmp_path, workers=2, args=["--slots", "2", "--ctx", str(ctx)]) as d:
        if arch == "phi3":
            assert "chat template phi3" in d.log(), d.log()
            which = "long" if ctx > 64 else "short"
            assert f"rope: LongRoPE's {which} factors ({ctx} positions per slot, original context 64)" in d.log()
        with Client(d.sock) as c:
            if arch == "phi3":
                if ctx > 64:
                    prompt_text = "<|system|>\nBe brief.<|end|>\n<|user|>\nHello there<|end|>\n<|assistant|>\n"
                    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
                else:  # within the short context: Phi-3.5's template leaves the empty system message out
                    prompt_text = "<|user|>\nHi<|end|>\n<|assistant|>\n"
                    msgs = [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]
                toks, _, ev = c.generate(rid="g", messages=msgs, max_tokens=12, temperature=0, ignore_eos=True)
            else:
                prompt_text = "Hello there, how are you today?"
                toks, _, ev = c.generate(rid="g", prompt=prompt_text, raw=True, max_tokens=12, temperature=0,
                                         ignore_eos=True)
            assert ev["event"] == "done", ev
            ids = c.request({"id": "t", "op": "tokenize", "text": prompt_text, "special": True})["tokens"]
    assert ev["usage"]["prompt_tokens"] == len(ids)
    assert toks == greedy_nx_eval(model, ids, len(toks), ctx)
