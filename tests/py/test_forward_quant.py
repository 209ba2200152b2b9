"""test_forward_quant.py - the low-bit weight types (Q2_K, Q3_K, IQ4_NL, IQ4_XS) through the whole forward pass.

Tiny random models (tests/fixtures/make_tiny.py) in each type, llama, qwen2 and
qwen3, and models mixing types as llama-quantize's Q2_K, Q3_K_M and IQ4_XS
files do, graded exactly as tests/py/test_forward.py grades the other types:
bit-identical logits under every batching plan and 1-3 threads, within the
two-part-activation bounds of the float64 reference (weights dequantized by
gguf-py, never by nxd), and closer still to the reference emulating the
engine's rounding points. IQ4_NL dots take Q8_0 activations, the others Q8_K
(kern/quant_ref.c), and a matrix packed for the tile kernels (all four with
AVX-512) Q8_0.
"""
import ctypes
import os
import zlib

import numpy as np
import pytest

import make_tiny
from conftest import build_dir
from gguf import GGMLQuantizationType as QT
from reference import Reference
from test_forward import SEQ_LENS, grade, grade_one_part, logits_every_plan, packed_matrices

FAMILY = {"F16": "float", "Q8_0": "q8_0", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k",
          "Q2_K": "q8_k", "Q3_K": "q8_k", "IQ4_NL": "q8_0", "IQ4_XS": "q8_k"}
ORDER = ["float", "q8_0", "q8_k"]

VARIANTS = {}
for _i, _ty in enumerate(make_tiny.LOW_BIT_TYPES):
    for _j, _arch in enumerate(("llama", "qwen2")):
        _tied = (_i + _j) % 2 == 0
        VARIANTS[f"{_arch}-{_ty.lower()}-{'tied' if _tied else 'untied'}"] = dict(
            arch=_arch, wtype=_ty, tied=_tied, seed=300 + 2 * _i + _j)
VARIANTS["qwen3-q3_k-untied"] = dict(arch="qwen3", wtype="Q3_K", seed=310, head_dim=128, n_head=8, n_head_kv=2)
VARIANTS["qwen3-iq4_xs-tied"] = dict(arch="qwen3", wtype="IQ4_XS", seed=311, tied=True, head_dim=128, n_head=8,
                                     n_head_kv=2)
# What llama-quantize's mixes put where (llama_tensor_get_type): Q2_K files keep
# attn_v / ffn_down at Q3_K-Q4_K and the output at Q6_K; Q3_K_M puts attn_v and
# ffn_down at Q4_K/Q5_K; IQ4_XS files keep the output at Q6_K and fall back to
# IQ4_NL for rows that are no multiple of 256.
VARIANTS["llama-q2_k-mix"] = dict(arch="llama", wtype="Q2_K", seed=320,
                                  types=dict(embd="Q2_K", output="Q6_K", v="Q4_K", down="Q3_K"))
VARIANTS["llama-q3_k_m-mix"] = dict(arch="llama", wtype="Q3_K", seed=321,
                                    types=dict(embd="Q3_K", output="Q6_K", v="Q5_K", down="Q4_K"))
VARIANTS["qwen2-iq4_xs-mix"] = dict(arch="qwen2", wtype="IQ4_XS", seed=322,
                                    types=dict(embd="IQ4_XS", output="Q6_K", k="IQ4_NL", v="IQ4_NL", down="IQ4_NL"))


def family(kw):
    types = [kw.get("wtype", "Q8_0"), *kw.get("types", {}).values()]
    return max((FAMILY[t] for t in types), key=ORDER.index)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_quant")
    return {name: make_tiny.build(d / f"{name}.gguf", **kw) for name, kw in VARIANTS.items()}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_reference(tiny, name, report):
    model, kw = tiny[name], VARIANTS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = Reference(model)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}

    base = logits_every_plan(model, seqs)
    emu = Reference(model, emulate=True, packed=packed_matrices(ref))
    grade(f"{name:22s}", family(kw), seqs, base, ref, emu, report)


@pytest.mark.parametrize("name", ["llama-q2_k-tied", "qwen2-iq4_nl-untied", "llama-q3_k_m-mix", "qwen2-iq4_xs-mix"])
def test_fast_activations_match_one_part_reference(tiny, name, report):
    """nxd --activations fast (hi alone) against the reference rounding each matmul input to hi alone."""
    model = tiny[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ref = Reference(model)
    seqs = {s: rng.integers(0, ref.n_vocab, n) for s, n in SEQ_LENS.items()}
    base = logits_every_plan(model, seqs, ("--activations", "fast"), ("alone", "decode"), (1, 2))
    emu = Reference(model, emulate=True, packed=packed_matrices(ref), one_part=True)
    grade_one_part(f"{name:22s}", seqs, base, ref, emu, report)


@pytest.mark.parametrize("name", [n for n in VARIANTS if "q2_k" in n or "q3_k" in n])
def test_low_bit_k_quants_take_the_tile_kernels(tiny, name):
    """Where the CPU has the k-quants' tile kernels (nx_pack_fast(Q4_K)), every Q2_K and Q3_K matrix
    of whole 16-row groups is packed, so the forward tests above grade the packed kernels."""
    if os.environ.get("NX_PACK") == "0":
        pytest.skip("NX_PACK=0: nothing is packed")
    so = ctypes.CDLL(str(build_dir() / "libnx.so"))
    so.nx_pack_fast.restype = ctypes.c_bool
    so.nx_pack_fast.argtypes = [ctypes.c_int]
    if not so.nx_pack_fast(int(QT.Q4_K)):
        pytest.skip("no SIMD tile kernels for the k-quants on this CPU (or NX_KERN): the plain dots run")
    assert so.nx_pack_fast(int(QT.Q2_K)) and so.nx_pack_fast(int(QT.Q3_K))
    ref = Reference(tiny[name])
    low = {n for n, w in ref.t.items() if w.ndim == 2 and ref.types[n] in (QT.Q2_K, QT.Q3_K) and w.shape[0] % 16 == 0}
    assert low, "the variant has no Q2_K / Q3_K matrix of whole 16-row groups"
    missing = low - packed_matrices(ref)
    assert not missing, f"not packed: {sorted(missing)}"
