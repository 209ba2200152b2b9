"""test_lora_phi3.py - LoRA adapters of smollm3 and phi3 models: PEFT q/k rows in the GGUF's order (smollm3), fused matrices refused (phi3).

llama.cpp's converter permutes smollm3's Q and K rows as it does llama's
(SmolLM3Model is a LlamaModel), and convert_lora_to_gguf.py permutes an
adapter's lora_B of q_proj / k_proj alike; nxd must do the same for a PEFT
adapter (lora/adapter.c: permute_qk), or the delta would land on the wrong
rows. The PEFT form and the GGUF form of one adapter load to the same floats.
"""
import subprocess

import make_lora
import make_tiny_phi3
from conftest import tool


def info(model, adapter):
    p = subprocess.run([str(tool("nx-lora")), "info", str(model), str(adapter)], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().splitlines()[1:]


def test_peft_and_gguf_forms_agree(tmp_path):
    model, _ = make_tiny_phi3.build_smollm3(tmp_path / "smollm3.gguf", wtype="Q8_0", seed=340)
    weights, arch, (n_head, n_head_kv) = make_lora.model_weights(model)
    assert arch == "smollm3"
    ab = make_lora.random_adapter(weights, rank=4, alpha=8, seed=2, storage="F16")
    make_lora.write_peft(tmp_path / "peft", ab, rank=4, alpha=8, dtype="F32")
    permuted = {(il, w): (a, make_lora.llama_permute(b, n_head if w == "attn_q" else n_head_kv)
                          if w in ("attn_q", "attn_k") else b) for (il, w), (a, b) in ab.items()}
    make_lora.write_gguf_lora(tmp_path / "a.gguf", "smollm3", permuted, alpha=8, dtype="F16")
    peft, gg = info(model, tmp_path / "peft"), info(model, tmp_path / "a.gguf")
    assert len(peft) == 4 * 7 and peft == gg


def test_a_phi3_adapter_of_the_fused_matrices_is_refused(tmp_path):
    """phi3's gate_up_proj (ffn_up: 2 n_ff rows) and qkv_proj are single matrices in Hugging Face's model: an
    adapter of them is not one of the parts nxd binds, and is refused rather than applied to a part."""
    import numpy as np
    model, _ = make_tiny_phi3.build_phi3(tmp_path / "phi3.gguf", wtype="Q8_0", seed=341)
    rng = np.random.default_rng(0)
    ab = {(0, "ffn_up"): (rng.standard_normal((4, 256)).astype(np.float32),
                          rng.standard_normal((512, 4)).astype(np.float32))}  # even of up's n_ff rows
    make_lora.write_gguf_lora(tmp_path / "up.gguf", "phi3", ab, alpha=8, dtype="F32")
    p = subprocess.run([str(tool("nx-lora")), "info", str(model), str(tmp_path / "up.gguf")], capture_output=True,
                       timeout=120)
    assert p.returncode != 0 and "phi3's blk.0.ffn_up.weight is part of a fused matrix" in p.stderr.decode(), \
        p.stderr.decode()
