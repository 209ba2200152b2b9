"""test_model_refusals.py - every GGUF key and tensor that changes the arithmetic is implemented or refused at load, by name.

Each test writes a tiny model (tests/fixtures/make_tiny.py) with one key or
tensor added under the name llama.cpp's converter gives it, and checks that
nx-eval (model/model.c: nx_model_bind, what nxd loads through) refuses it with
an error naming the key or tensor and its value - or, for a value that changes
nothing, accepts it. See docs/models.md for the whole list.
"""
import subprocess

import numpy as np
import pytest

import make_tiny
from conftest import tool


def load(tmp_path, mutate, arch="llama", name="m", **kw):
    """(returncode, stderr) of nx-eval loading a tiny model edited by mutate and running one token."""
    path = make_tiny.build(tmp_path / f"{name}.gguf", arch=arch, wtype="Q8_0", mutate=mutate, **kw)
    p = subprocess.run([str(tool("nx-eval")), str(path)], input=b"seq 0 1\nstep 0:0:1\n", capture_output=True,
                       timeout=60)
    return p.returncode, p.stderr.decode()


def refused(tmp_path, mutate, *fragments, **kw):
    rc, err = load(tmp_path, mutate, **kw)
    assert rc != 0, "the model was accepted"
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    return err


def accepted(tmp_path, mutate, **kw):
    rc, err = load(tmp_path, mutate, **kw)
    assert rc == 0, err


def add_keys(**keys):
    """A mutate adding {arch}.KEY (dots for '__') = (kind, value)."""
    def mutate(meta, t):
        arch = next(k for k in meta if k.endswith(".block_count")).split(".")[0]
        for k, kv in keys.items():
            meta[f"{arch}.{k.replace('__', '.')}"] = kv
    return mutate


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_soft_capping_is_refused(tmp_path, arch):
    refused(tmp_path, add_keys(attn_logit_softcapping=("f32", 50.0)), f"key '{arch}.attn_logit_softcapping' = 50",
            "soft-capping", arch=arch)
    refused(tmp_path, add_keys(final_logit_softcapping=("f32", 30.0)), f"key '{arch}.final_logit_softcapping' = 30",
            "soft-capping", arch=arch)


def test_sliding_window_is_refused_unless_no_position_can_leave_it(tmp_path):
    refused(tmp_path, add_keys(attention__sliding_window=("u32", 1024)),
            "key 'llama.attention.sliding_window' = 1024", "sliding-window attention")
    accepted(tmp_path, add_keys(attention__sliding_window=("u32", 4096)))  # = context_length


def test_rope_scaling_types_nxd_does_not_implement_are_refused(tmp_path):
    refused(tmp_path, add_keys(rope__scaling__type=("str", "longrope")), "key 'llama.rope.scaling.type' = \"longrope\"")
    accepted(tmp_path, add_keys(rope__scaling__type=("str", "none")))
    refused(tmp_path, add_keys(rope__scaling__yarn_log_multiplier=("f32", 0.1)),
            "key 'llama.rope.scaling.yarn_log_multiplier' = 0.1")
    refused(tmp_path, add_keys(rope__freq_base_swa=("f32", 10000.0)), "key 'llama.rope.freq_base_swa' = 10000")


def test_experts_are_refused(tmp_path):
    # qwen2 has no experts (qwen2moe's are: test_forward_qwen2moe.py); llama's are read (test_forward_moe.py)
    refused(tmp_path, add_keys(expert_count=("u32", 8), expert_used_count=("u32", 2)),
            "key 'qwen2.expert_count' = 8", "mixture-of-experts", arch="qwen2")
    accepted(tmp_path, add_keys(expert_count=("u32", 0)), arch="qwen2")
    # llama with expert_count reads the experts' tensors: without them the file is refused, naming one
    refused(tmp_path, add_keys(expert_count=("u32", 8), expert_used_count=("u32", 2)),
            "tensor 'blk.0.ffn_gate_inp.weight' is missing")
    accepted(tmp_path, add_keys(expert_count=("u32", 0)))


def test_unknown_key_is_refused(tmp_path):
    refused(tmp_path, add_keys(attention__temperature_scale=("f32", 0.5)),
            "key 'llama.attention.temperature_scale' = 0.5", "not a key nxd knows")
    # Keys of other namespaces are not the architecture's: ignored.
    accepted(tmp_path, lambda meta, t: meta.update({"qwen2.attn_logit_softcapping": ("f32", 50.0)}))


def test_per_layer_arrays_are_refused(tmp_path):
    """llama.cpp allows head_count / feed_forward_length per layer, as arrays."""
    refused(tmp_path, add_keys(attention__head_count_kv=("arr", [2, 4])), "llama.attention.head_count_kv", "array")


def test_non_causal_attention_is_refused(tmp_path):
    refused(tmp_path, add_keys(attention__causal=("bool", False)), "key 'llama.attention.causal' = false")
    accepted(tmp_path, add_keys(attention__causal=("bool", True)))


@pytest.mark.parametrize("tensor", ["blk.1.attn_q_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.0.attn_output.bias",
                                    "output.bias"])
def test_unknown_tensor_is_refused(tmp_path, tensor):
    def add(meta, t):
        t[tensor] = (np.ones(256 if "gate_inp" not in tensor else (8, 256), np.float32), None)
    refused(tmp_path, add, f"tensor '{tensor}' is not one nxd's llama reads")


def test_qwen2_tensor_llama_does_not_read_is_refused(tmp_path):
    """A bias on a llama file is not silently skipped (qwen2 reads it, llama does not)."""
    def bias(meta, t):
        t["blk.0.attn_q.bias"] = (np.zeros(256, np.float32), None)
    refused(tmp_path, bias, "tensor 'blk.0.attn_q.bias' is not one nxd's llama reads")


def test_value_heads_of_another_size_are_refused(tmp_path):
    refused(tmp_path, add_keys(attention__key_length=("u32", 64), attention__value_length=("u32", 128)),
            "llama.attention.value_length = 128, key_length = 64")


def freqs(meta, t):
    t["rope_freqs.weight"] = (np.ones(32, np.float32), None)


def test_rope_scaling_nxd_cannot_grade_is_refused(tmp_path):
    """Combinations and variants Hugging Face and llama.cpp would compute differently."""
    def freqs_and_linear(meta, t):
        freqs(meta, t)
        add_keys(rope__scaling__type=("str", "linear"), rope__scaling__factor=("f32", 4.0))(meta, t)
    refused(tmp_path, freqs_and_linear, "tensor 'rope_freqs.weight' together with RoPE scaling")
    refused(tmp_path, add_keys(rope__scaling__type=("str", "yarn"), rope__scaling__factor=("f32", 4.0),
                               rope__scaling__yarn_attn_factor=("f32", 1.0)),
            "key 'llama.rope.scaling.yarn_attn_factor' = 1", "explicit attention factor")
    refused(tmp_path, add_keys(rope__scaling__type=("str", "yarn"), rope__scaling__factor=("f32", 0.5)),
            "key 'llama.rope.scaling.type' = \"yarn\" with factor 0.5")
    refused(tmp_path, add_keys(rope__scaling__type=("str", "none"), rope__scaling__factor=("f32", 2.0)),
            "key 'llama.rope.scaling.type' = \"none\" with factor 2: contradictory")
    refused(tmp_path, add_keys(rope__scaling__type=("str", "linear"), rope__scaling__factor=("f32", -1.0)),
            "key 'llama.rope.scaling.factor' = -1")


def test_rope_frequency_factors_are_checked(tmp_path):
    def zero(meta, t):
        t["rope_freqs.weight"] = (np.array([1.0] * 31 + [0.0], np.float32), None)
    refused(tmp_path, zero, "tensor 'rope_freqs.weight': element 31 is 0")

    def short(meta, t):
        t["rope_freqs.weight"] = (np.ones(16, np.float32), None)
    refused(tmp_path, short, "tensor 'rope_freqs.weight' has shape [16], expected [32]")
    # qwen2 has no place for them in llama.cpp either.
    refused(tmp_path, freqs, "tensor 'rope_freqs.weight' is not one nxd's qwen2 reads", arch="qwen2")


def test_qwen3_needs_its_head_norms_and_has_no_biases(tmp_path):
    def no_norm(meta, t):
        del t["blk.1.attn_k_norm.weight"]
    refused(tmp_path, no_norm, "tensor 'blk.1.attn_k_norm.weight' is missing", arch="qwen3")

    def bias(meta, t):
        t["blk.0.attn_q.bias"] = (np.zeros(256, np.float32), None)
    refused(tmp_path, bias, "tensor 'blk.0.attn_q.bias' is not one nxd's qwen3 reads", arch="qwen3")

    def wide(meta, t):
        t["blk.0.attn_q_norm.weight"] = (np.ones(256, np.float32), None)  # over the whole row, not per head
    refused(tmp_path, wide, "tensor 'blk.0.attn_q_norm.weight' has shape [256], expected [64]", arch="qwen3")
