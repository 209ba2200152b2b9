"""test_model_refusals_phi3.py - what nxd's phi3 and smollm3 do not implement is refused at load, by name.

Each test writes a tiny model as llama.cpp's converter does (tests/fixtures/make_tiny_phi3.py), edits
one key or tensor, and checks that nx-eval (model/model.c: nx_model_bind) refuses it with an error
naming the key or tensor - or, for a value that changes nothing, accepts it. docs/models.md lists them.
"""
import subprocess

import numpy as np
import pytest

import make_tiny
import make_tiny_phi3
from conftest import tool


def load(path):
    p = subprocess.run([str(tool("nx-eval")), str(path)], input=b"seq 0 1\nstep 0:0:1\n", capture_output=True,
                       timeout=60)
    return p.returncode, p.stderr.decode()


def phi3(tmp_path, mutate=None, **kw):
    return make_tiny_phi3.build_phi3(tmp_path / "phi3.gguf", mutate=mutate, **kw)[0]


def smollm3(tmp_path, mutate=None, **kw):
    return make_tiny_phi3.build_smollm3(tmp_path / "smollm3.gguf", mutate=mutate, **kw)[0]


def refused(path, *fragments):
    rc, err = load(path)
    assert rc != 0, "the model was accepted"
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"


def accepted(path):
    rc, err = load(path)
    assert rc == 0, err


def test_the_converters_files_load(tmp_path):
    accepted(phi3(tmp_path, long_rope=True, orig_ctx=64, window=16))
    accepted(smollm3(tmp_path))


def test_phi3_needs_the_fused_qkv(tmp_path):
    def unfused(meta, t):  # attn_q / attn_k / attn_v, as a llama file has them
        qkv, raw = t.pop("blk.0.attn_qkv.weight")
        t["blk.0.attn_q.weight"], t["blk.0.attn_k.weight"], t["blk.0.attn_v.weight"] = (
            (a, raw) for a in np.split(qkv, [256, 384]))
    refused(phi3(tmp_path, unfused), "tensor 'blk.0.attn_qkv.weight' is missing")


def test_phi3_gate_up_is_one_tensor_of_both(tmp_path):
    def half(meta, t):  # ffn_up of n_ff rows: a gate and up of their own would be needed
        a, raw = t["blk.1.ffn_up.weight"]
        t["blk.1.ffn_up.weight"] = (a[:512], raw)
    refused(phi3(tmp_path, half), "tensor 'blk.1.ffn_up.weight' has shape [256, 512], expected [256, 1024]")

    def extra_gate(meta, t):
        t["blk.0.ffn_gate.weight"] = make_tiny.weight(np.random.default_rng(0), 512, 256, "Q8_0", 0.06)
    refused(phi3(tmp_path, extra_gate), "tensor 'blk.0.ffn_gate.weight' is not one nxd's phi3 reads")


@pytest.mark.parametrize("name", ["blk.0.attn_qkv.bias", "blk.1.ffn_up.bias", "blk.0.attn_output.bias"])
def test_phi3_biases_are_refused(tmp_path, name):
    n = {"blk.0.attn_qkv.bias": 512, "blk.1.ffn_up.bias": 1024, "blk.0.attn_output.bias": 256}[name]

    def bias(meta, t):
        t[name] = (np.zeros(n, np.float32), None)
    refused(phi3(tmp_path, bias), f"tensor '{name}' is not one nxd's phi3 reads")


def test_longrope_needs_both_factor_sets(tmp_path):
    def only_long(meta, t):
        del t["rope_factors_short.weight"]
    refused(phi3(tmp_path, only_long, long_rope=True, orig_ctx=64),
            "tensor 'rope_factors_long.weight' without 'rope_factors_short.weight'")


def test_longrope_factors_are_checked(tmp_path):
    def short_one(meta, t):
        t["rope_factors_long.weight"] = (t["rope_factors_long.weight"][0][:16], None)
    refused(phi3(tmp_path, short_one, long_rope=True, orig_ctx=64),
            "tensor 'rope_factors_long.weight' has shape [16], expected [32]")

    def zero(meta, t):
        t["rope_factors_short.weight"][0][3] = 0
    refused(phi3(tmp_path, zero, long_rope=True, orig_ctx=64), "element 3", "expected positive numbers")


def test_longrope_with_a_scaling_type_is_refused(tmp_path):
    def linear(meta, t):
        meta["phi3.rope.scaling.type"] = ("str", "linear")
        meta["phi3.rope.scaling.factor"] = ("f32", 4.0)
    refused(phi3(tmp_path, linear, long_rope=True, orig_ctx=64),
            "LongRoPE factors (rope_factors_long.weight) together with RoPE scaling")


def test_longrope_needs_the_original_context(tmp_path):
    def no_orig(meta, t):
        del meta["phi3.rope.scaling.original_context_length"]
    refused(phi3(tmp_path, no_orig, long_rope=True, orig_ctx=64), "phi3.rope.scaling.original_context_length")

    def past_ctx(meta, t):
        meta["phi3.rope.scaling.original_context_length"] = ("u32", 8192)
    refused(phi3(tmp_path, past_ctx, long_rope=True, orig_ctx=64),
            "key 'phi3.rope.scaling.original_context_length' = 8192")


def test_attention_factor_without_longrope_is_refused(tmp_path):
    def factor(v):
        def mutate(meta, t):
            meta["phi3.rope.scaling.attn_factor"] = ("f32", v)
        return mutate
    refused(phi3(tmp_path, factor(1.19)), "key 'phi3.rope.scaling.attn_factor' = 1.19 without LongRoPE factors")
    accepted(phi3(tmp_path, factor(1.0)))


def test_a_window_of_zero_is_none_and_any_other_is_read(tmp_path):
    accepted(phi3(tmp_path, window=None))  # the converter's 0 (Phi-4)
    accepted(phi3(tmp_path, window=3))


def test_a_phi3_file_that_does_not_say_its_window_is_refused(tmp_path):
    def no_window(meta, t):  # what converters before the key wrote (Phi-3-mini-4k's window is 2047)
        del meta["phi3.attention.sliding_window"]
    refused(phi3(tmp_path, no_window), "key 'phi3.attention.sliding_window' is missing")


def test_unknown_phi3_key_is_refused(tmp_path):
    def key(meta, t):
        meta["phi3.attention.sliding_window_pattern"] = ("u32", 2)
    refused(phi3(tmp_path, key), "key 'phi3.attention.sliding_window_pattern' = 2")


def test_smollm3_refuses_what_llama_cpp_would_add(tmp_path):
    def freqs(meta, t):  # Llama 3.1's factors are llama's, not smollm3's (the converter writes none)
        t["rope_freqs.weight"] = (np.ones(32, np.float32), None)
    refused(smollm3(tmp_path, freqs), "tensor 'rope_freqs.weight' is not one nxd's smollm3 reads")

    def bias(meta, t):  # attention_bias: llama.cpp's graph would add it
        t["blk.0.attn_q.bias"] = (np.zeros(256, np.float32), None)
    refused(smollm3(tmp_path, bias), "tensor 'blk.0.attn_q.bias' is not one nxd's smollm3 reads")

    def window(meta, t):  # SmolLM3's use_sliding_window is not in the converter's keys; llama.cpp ignores one
        meta["smollm3.attention.sliding_window"] = ("u32", 1024)
    refused(smollm3(tmp_path, window), "key 'smollm3.attention.sliding_window' = 1024", "sliding-window attention")
