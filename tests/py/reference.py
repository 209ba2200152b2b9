"""reference.py - an independent float64 llama / qwen2 / qwen3 / qwen3moe / phi3 / smollm3 (and, in GemmaReference, gemma / gemma2 / gemma3) forward pass in numpy, the ground truth for the engine.

Written from the Hugging Face models (modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py,
modeling_phi3.py, modeling_smollm3.py): RMSNorm, SwiGLU, grouped-query attention; qwen2's Q/K/V biases;
qwen3's RMSNorm of each head of Q and K before RoPE; RoPE on pairs (i, i + rope_dim/2) (rotate_half) for
qwen2/qwen3/phi3, and on (2i, 2i+1) for llama and smollm3, whose Q/K rows llama.cpp's converter permutes
so that the two are the same computation. phi3: qkv_proj (attn_qkv: Q's rows, K's, V's) and
gate_up_proj (ffn_up: chunk(2), gate first), rotate_half on the first rope_dim dims of each head
(partial_rotary_factor), LongRoPE (hf_rope "longrope") and the sliding-window mask (kv > q - window).
smollm3: no RoPE in the layers its config's no_rope_layers marks 0 (by default every 4th:
(i + 1) % no_rope_layer_interval == 0).

Mixture-of-experts FFNs (modeling_mixtral.py's MixtralSparseMoeBlock, modeling_qwen3_moe.py's
Qwen3MoeSparseMoeBlock, modeling_qwen2_moe.py's Qwen2MoeSparseMoeBlock): router logits, softmax over all
experts, the top num_experts_per_tok probabilities, divided by their sum when norm_topk_prob (Mixtral
always), each chosen expert's SwiGLU MLP weighted by its probability and summed; qwen2moe (qwen2's
attention, biases included) adds its shared expert, a SwiGLU MLP whose output is multiplied by
sigmoid(shared_expert_gate(x)). Like rope_scaling, norm_topk_prob is the Hugging Face
config's, given by the caller, not read from the GGUF.

RoPE and its scaling follow Hugging Face's modeling_rope_utils.py (hf_rope), given the config's
rope_scaling, not the GGUF keys nxd reads.

Reads the GGUF with gguf.GGUFReader and dequantizes every tensor with
gguf.quants.dequantize (never with the engine's code), then computes in float64:
no activation quantization, K/V kept in float64. Each sequence is computed
alone, all positions at once under a causal mask.

Reference(path, emulate=True) additionally rounds values where the engine's
design stores them in a narrower format - the input of every matmul with a
quantized weight to that weight's activation type (Q8_0 for the 32-blocks,
Q8_K for the k-quants and IQ4_XS, Q8_0 for IQ4_NL: GGUF's block formats; Q8_0 for a k-quant matrix the
engine packs for its tile kernels, named in `packed`), in two parts as the engine does
(hi = Q(x), lo = x - hi in float32 in finer levels: Q8_K's own, Q8_0's at hi's
scale / 128; the matmul sees hi + lo), and K/V to
f16 - so the remaining difference to the engine is float32 arithmetic only,
and a tight tolerance can catch small mistakes that the rounding noise would
hide. With one_part=True too, the matmul sees hi alone, as the engine with
one-part activations does (nxd --activations fast).

Reference(path, kv="q8_0") is the model with an 8-bit K/V cache (nxd --kv-type
q8_0): K (after RoPE) and V rounded through Q8_0 blocks of 32 along each head
(round_kv_q8_0, from the format's definition), everything else as above - with
or without emulate.
"""
import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

_Q8_0_ACT = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL}
_Q8_K_ACT = {QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS}


def round_q8_0(x):
    """x (..., n) through Q8_0 blocks of 32 (gguf-py's quantizer) and back."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    return gguf.quants.dequantize(gguf.quants.quantize(x32, QT.Q8_0), QT.Q8_0).astype(np.float64)


def round_kv_q8_0(x):
    """x (..., n), n a multiple of 32, through Q8_0 blocks of 32 along the last axis and back, as ggml
    defines the q8_0 K/V cache: per block d = amax / 127, q = round(x / d) with ties away from zero
    (roundf), |q| <= 127 by construction; d is stored as f16 and the value read back is f16(d) * q.
    In float64 (the engine computes d and x / d in float32: a value within that rounding of a level's
    boundary may land on the next level)."""
    x = np.asarray(x, dtype=np.float64)
    b = x.reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d > 0, b / np.where(d > 0, d, 1), 0.0)
    q = np.trunc(r + np.copysign(0.5, r))
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


def round_q8_k(x):
    """x (..., n) through Q8_K blocks of 256 and back: d = max/-127 (max: the
    element of largest magnitude, with its sign), q = min(127, round(x/d)), float32 d."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, 256)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(len(b)), idx]
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0)).astype(np.float32)
    q = np.minimum(127, np.rint(b * iscale[:, None]))
    d = np.where(iscale != 0, np.float32(1) / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
    return (q * d[:, None]).astype(np.float32).astype(np.float64).reshape(np.shape(x))


def _levels(v):
    """roundf(v) (ties away from zero) of float32 v, clamped as a stored int8 level; exact in float64."""
    v = np.asarray(v, dtype=np.float32).astype(np.float64)
    return np.clip(np.trunc(v + np.copysign(0.5, v)), -128, 127)


def round_q8_0_two_part(x, lo=True):
    """x (..., n) through the engine's two-part Q8_0 activation (kern/quant.h, quant2) and back: per
    32-block, hi = Q8_0(x) except that a scale d = amax / 127 below 2^-7 is rounded up to a multiple
    of 2^-17; lo = x - hi (in float32) in levels of hi's f16 scale / 128. Returns hi + lo (hi alone
    without lo: the one-part activation). Finite x."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    small = d < np.float32(2.0 ** -7)
    d = np.where(small, np.ceil(d * np.float32(2.0 ** 17)) * np.float32(2.0 ** -17), d).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = lambda s: np.where(s == 0, np.float32(0), np.float32(1) / s).astype(np.float32)  # noqa: E731
        qh = _levels(b * inv(d))
        dh = d.astype(np.float16).astype(np.float32)
        if not lo:
            return (qh * dh.astype(np.float64)).reshape(np.shape(x))
        r = b - (qh.astype(np.float32) * dh)  # the product is exact (8-bit level, 11-bit scale)
        dl = dh / np.float32(128)
        ql = _levels(r * inv(dl))
    return (qh * dh.astype(np.float64) + ql * dl.astype(np.float64)).reshape(np.shape(x))


def round_hi_lo(x, rnd):
    """x through the engine's two-part activation (model/forward.c, prep_act): hi = rnd(x),
    lo = rnd(x - hi) with the difference taken in float32; returns hi + lo."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    hi = rnd(x32).astype(np.float32)
    return hi.astype(np.float64) + rnd(x32 - hi)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(key)
        return default
    return f.contents()


def hf_rope(base, dim, rope_scaling=None, seq_len=None):
    """(inverse frequencies (dim/2,), attention factor) of RoPE over dim dimensions, as Hugging Face's
    modeling_rope_utils.py defines them for rope_scaling (the config's dict; None: unscaled): linear,
    llama3 (Llama 3.1's smooth blend), yarn and longrope (in float64 here). For longrope the dict also
    carries the config's max_position_embeddings and original_max_position_embeddings, and seq_len is
    the sequence length the rotary embedding sees (longrope_frequency_update: its largest position + 1)."""
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind in ("longrope", "su"):  # _compute_longrope_parameters
        orig = rs.get("original_max_position_embeddings")
        if orig:
            factor = rs["max_position_embeddings"] / orig
        else:
            factor, orig = rs["factor"], rs["max_position_embeddings"]
        att = rs.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1.0 else np.sqrt(1 + np.log(factor) / np.log(orig))
        ext = np.asarray(rs["long_factor"] if seq_len and seq_len > orig else rs["short_factor"], np.float64)
        # (the factors as float32, as torch.tensor(..., dtype=float32) holds them)
        ext = ext.astype(np.float32).astype(np.float64)
        return 1.0 / (ext * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)), att
    factor = rs["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
        wl = 2 * np.pi / inv
        out = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        return np.where(medium, (1 - smooth) * out / factor + smooth * out, out), 1.0
    if kind == "yarn":
        orig = rs["original_max_position_embeddings"]
        att = rs.get("attention_factor") or (0.1 * np.log(factor) + 1.0 if factor > 1 else 1.0)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot):
            return dim * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(base))
        low, high = max(np.floor(corr_dim(beta_fast)), 0), min(np.ceil(corr_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrap = 1 - ramp
        return (inv / factor) * (1 - extrap) + inv * extrap, att
    raise ValueError(f"rope type {kind!r}")


class Reference:
    def __init__(self, path, emulate=False, packed=(), one_part=False, rope_scaling=None, sliding_window=None,
                 no_rope_layers=None, rope_seq_len=None, norm_topk_prob=None, kv="f16"):
        """rope_scaling: the Hugging Face config's rope_scaling the file was converted from (the GGUF
        keeps only what llama.cpp's converter writes: for llama3, per-dimension factors).
        sliding_window: the config's sliding_window (phi3; None: none). no_rope_layers: the config's
        (smollm3; None: SmolLM3Config's default). rope_seq_len: for longrope, the sequence length the
        rotary embedding sees (None: each sequence's own). kv: the K/V cache's type, "f16" (exact K/V
        unless emulate) or "q8_0" (K/V through round_kv_q8_0)."""
        if kv not in ("f16", "q8_0"):
            raise ValueError(f"kv type {kv!r}")
        self.kv = kv
        self.emulate = emulate
        self.one_part = one_part
        self.packed = set(packed)
        r = gguf.GGUFReader(str(path))
        self.arch = _field(r, "general.architecture")
        a = self.arch
        self.n_layer = int(_field(r, f"{a}.block_count"))
        self.dim = int(_field(r, f"{a}.embedding_length"))
        self.n_head = int(_field(r, f"{a}.attention.head_count"))
        self.n_head_kv = int(_field(r, f"{a}.attention.head_count_kv", self.n_head))
        self.head_dim = int(_field(r, f"{a}.attention.key_length", self.dim // self.n_head))
        self.rope_dim = int(_field(r, f"{a}.rope.dimension_count", self.head_dim))
        self.rope_base = float(_field(r, f"{a}.rope.freq_base", 10000.0))
        scaled = f"{a}.rope.scaling.type" in r.fields or any(t.name == "rope_freqs.weight" for t in r.tensors)
        if scaled and rope_scaling is None:
            raise ValueError(f"{path} scales RoPE: give the rope_scaling it was converted from")
        if a == "phi3" and any(t.name == "rope_factors_long.weight" for t in r.tensors) and rope_scaling is None:
            raise ValueError(f"{path} has LongRoPE factors: give the rope_scaling it was converted from")
        self.rope_scaling, self.rope_seq_len = rope_scaling, rope_seq_len
        self.inv_freq, self.rope_att = hf_rope(self.rope_base, self.rope_dim, rope_scaling, rope_seq_len)
        self.eps = float(_field(r, f"{a}.attention.layer_norm_rms_epsilon"))
        self.neox = a in ("qwen2", "qwen3", "qwen3moe", "phi3", "qwen2moe")
        self.window = sliding_window
        if no_rope_layers is None:  # SmolLM3Config: no_rope_layer_interval = 4
            no_rope_layers = [int((i + 1) % 4 != 0) if a == "smollm3" else 1 for i in range(self.n_layer)]
        self.use_rope = [bool(u) for u in no_rope_layers]
        self.n_expert = int(_field(r, f"{a}.expert_count", 0))
        if self.n_expert:
            self.top_k = int(_field(r, f"{a}.expert_used_count"))
            if a == "llama":
                norm_topk_prob = True  # Mixtral: softmax, top-k, renormalised
            if norm_topk_prob is None:
                raise ValueError(f"{path} has experts: give the norm_topk_prob it was converted from")
            self.norm_topk_prob = bool(norm_topk_prob)
        # Qwen2MoeSparseMoeBlock: every layer's shared expert, gated by sigmoid(shared_expert_gate(x))
        self.shared_expert, self.shared_gate = a == "qwen2moe", True
        # Tensors stay float32 (what dequantization yields) and are widened per use.
        self.t = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            [int(n) for n in reversed(t.shape)]) for t in r.tensors}
        self.types = {t.name: t.tensor_type for t in r.tensors}
        self.n_vocab = self.t["token_embd.weight"].shape[0]
        self.out_name = "output.weight" if "output.weight" in self.t else "token_embd.weight"

    def _w(self, name):
        return self.t[name].astype(np.float64)

    def _mm(self, x, name):
        """x @ W.T for weight `name` (n_out, n_in)."""
        if self.emulate:
            ty = self.types[name]
            if ty in _Q8_0_ACT or name in self.packed:
                x = round_q8_0_two_part(x, lo=not self.one_part)
            elif ty in _Q8_K_ACT:
                x = round_q8_k(x) if self.one_part else round_hi_lo(x, round_q8_k)
        return x @ self._w(name).T

    def _mm_expert(self, x, name, e):
        """x @ W[e].T for expert e of the stacked expert weight `name` (n_expert, n_out, n_in)."""
        if self.emulate:
            ty = self.types[name]
            if ty in _Q8_0_ACT or name in self.packed:
                x = round_q8_0_two_part(x, lo=not self.one_part)
            elif ty in _Q8_K_ACT:
                x = round_q8_k(x) if self.one_part else round_hi_lo(x, round_q8_k)
        return x @ self.t[name][e].astype(np.float64).T

    def _moe(self, xn, p):
        """The sparse MoE block of one layer (prefix p) on normed rows xn (T, dim)."""
        logits = self._mm(xn, p + "ffn_gate_inp.weight")  # (T, n_expert)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :self.top_k]  # torch.topk: largest first
        w = np.take_along_axis(probs, top, axis=-1)
        if self.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        out = np.zeros_like(xn)
        for e in range(self.n_expert):
            tok, slot = np.nonzero(top == e)
            if len(tok) == 0:
                continue
            g = self._mm_expert(xn[tok], p + "ffn_gate_exps.weight", e)
            u = self._mm_expert(xn[tok], p + "ffn_up_exps.weight", e)
            y = self._mm_expert(g / (1 + np.exp(-g)) * u, p + "ffn_down_exps.weight", e)
            out[tok] += w[tok, slot][:, None] * y
        if self.shared_expert:  # + sigmoid(shared_expert_gate(x)) * shared_expert(x), a SwiGLU MLP
            g = self._mm(xn, p + "ffn_gate_shexp.weight")
            u = self._mm(xn, p + "ffn_up_shexp.weight")
            y = self._mm(g / (1 + np.exp(-g)) * u, p + "ffn_down_shexp.weight")
            if self.shared_gate:
                y = y / (1 + np.exp(-self._mm(xn, p + "ffn_gate_inp_shexp.weight").reshape(len(xn), 1)))
            out = out + y
        return out

    def _kv(self, x):
        if self.kv == "q8_0":
            return round_kv_q8_0(x)
        return x.astype(np.float16).astype(np.float64) if self.emulate else x

    def _rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        """x (T, heads, head_dim): rotate the first rope_dim dims of each head by pos * inv_freq[i]
        (base^(-2i/rope_dim) unscaled), cos and sin times the attention factor (YaRN's, LongRoPE's; else 1)."""
        half = self.rope_dim // 2
        inv, att = self.inv_freq, self.rope_att
        if self.rope_seq_len is None and (self.rope_scaling or {}).get("rope_type") == "longrope":
            # longrope: the factor set of the sequence's own length
            inv, att = hf_rope(self.rope_base, self.rope_dim, self.rope_scaling, len(pos))
        theta = pos[:, None] * inv[None, :]  # (T, half)
        c, s = att * np.cos(theta)[:, None, :], att * np.sin(theta)[:, None, :]
        x = x.copy()
        if self.neox:
            a, b = x[..., :half].copy(), x[..., half:self.rope_dim].copy()
            x[..., :half], x[..., half:self.rope_dim] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0:self.rope_dim:2].copy(), x[..., 1:self.rope_dim:2].copy()
            x[..., 0:self.rope_dim:2], x[..., 1:self.rope_dim:2] = a * c - b * s, a * s + b * c
        return x

    def hidden(self, tokens):
        """Final-normed hidden states (T, dim) of one sequence starting at position 0."""
        tokens = np.asarray(tokens)
        T, hd, H, Hkv = len(tokens), self.head_dim, self.n_head, self.n_head_kv
        pos = np.arange(T, dtype=np.float64)
        x = self.t["token_embd.weight"][tokens].astype(np.float64)
        causal = np.triu(np.full((T, T), -np.inf), k=1)
        if self.window:  # masking_utils.sliding_window_overlay: kv_idx > q_idx - sliding_window
            causal = causal + np.tril(np.full((T, T), -np.inf), k=-self.window)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            xn = self._rmsnorm(x, self._w(p + "attn_norm.weight"))
            if self.arch == "phi3":  # qkv_proj, split at query_pos and query_pos + kv heads' size
                qkv = self._mm(xn, p + "attn_qkv.weight")
                q, k, v = np.split(qkv, [H * hd, (H + Hkv) * hd], axis=1)
            else:
                q = self._mm(xn, p + "attn_q.weight")
                k = self._mm(xn, p + "attn_k.weight")
                v = self._mm(xn, p + "attn_v.weight")
            if self.arch in ("qwen2", "qwen2moe"):
                q = q + self._w(p + "attn_q.bias")
                k = k + self._w(p + "attn_k.bias")
                v = v + self._w(p + "attn_v.bias")
            q, k = q.reshape(T, H, hd), k.reshape(T, Hkv, hd)
            if self.arch in ("qwen3", "qwen3moe"):  # Qwen3RMSNorm over each head's head_dim, before RoPE
                q = self._rmsnorm(q, self._w(p + "attn_q_norm.weight"))
                k = self._rmsnorm(k, self._w(p + "attn_k_norm.weight"))
            if self.use_rope[il]:
                q, k = self._rope(q, pos), self._rope(k, pos)
            k = self._kv(k)
            v = self._kv(v.reshape(T, Hkv, hd))
            # Query head h reads kv head h // (H / Hkv).
            k = np.repeat(k, H // Hkv, axis=1)
            v = np.repeat(v, H // Hkv, axis=1)
            s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd) + causal  # (H, T, T)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att = np.einsum("htu,uhd->thd", s, v).reshape(T, H * hd)
            x = x + self._mm(att, p + "attn_output.weight")
            xn = self._rmsnorm(x, self._w(p + "ffn_norm.weight"))
            if self.n_expert:
                x = x + self._moe(xn, p)
                continue
            if self.arch == "phi3":  # gate_up_proj, then chunk(2): gate first
                g, u = np.split(self._mm(xn, p + "ffn_up.weight"), 2, axis=1)
            else:
                g = self._mm(xn, p + "ffn_gate.weight")
                u = self._mm(xn, p + "ffn_up.weight")
            x = x + self._mm(g / (1 + np.exp(-g)) * u, p + "ffn_down.weight")
        return self._rmsnorm(x, self._w("output_norm.weight"))

    def logits(self, tokens):
        """Logits (T, n_vocab) float64 of one sequence, every position."""
        return self._mm(self.hidden(tokens), self.out_name)


class GemmaReference(Reference):
    """gemma (Gemma 1), gemma2, gemma3 (text model) in float64, written from Hugging Face's modeling_gemma.py,
    modeling_gemma2.py and modeling_gemma3.py, given the config the file was converted from (hf: its keys
    below), not the GGUF keys nxd reads:

    - the embedding times sqrt(hidden_size);
    - GemmaRMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) - llama.cpp's converter stores 1 + w, so w is the
      GGUF weight minus 1 here;
    - per layer: h += post_attention_layernorm(attn(input_layernorm(h)));
      h += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))), mlp = down(gelu_tanh(gate) * up);
    - attention scores (q . k) * query_pre_attn_scalar^-0.5, soft-capped to cap * tanh(s / cap) when
      attn_logit_softcapping is set (gemma2), then the causal mask, and in sliding layers also every key
      at sliding_window or more positions back (q - kv >= sliding_window);
    - gemma2: layer i slides when i is even; gemma3: when (i + 1) % sliding_window_pattern != 0, and then
      rotates with rope_local_base_freq unscaled, the global layers with rope_theta and rope_scaling;
    - gemma3: Gemma3RMSNorm of each head of Q and K (q_norm, k_norm) before RoPE;
    - RoPE by rotate_half (pairs i, i + head_dim/2);
    - the logits soft-capped by final_logit_softcapping when set;
    - gemma (Gemma 1): none of the post-norms, soft-caps, windows, Q/K norms: h += attn(input_layernorm(h));
      h += mlp(post_attention_layernorm(h)) (the GGUF's attn_norm, ffn_norm); scores times head_dim^-0.5,
      mlp's activation hidden_activation (gelu_pytorch_tanh).
    hf keys: query_pre_attn_scalar, sliding_window, attn_logit_softcapping, final_logit_softcapping,
    rope_theta, rope_scaling, rope_local_base_freq, sliding_window_pattern (gemma3); head_dim,
    hidden_activation (gemma).

    embd_scale and norm_offset (sqrt(hidden_size), GemmaRMSNorm's 1) are attributes so that a test can take
    them out."""

    def __init__(self, path, hf, emulate=False, packed=(), one_part=False):
        super().__init__(path, emulate=emulate, packed=packed, one_part=one_part,
                         rope_scaling=hf.get("rope_scaling") or {"rope_type": "default"})
        assert self.arch in ("gemma", "gemma2", "gemma3"), self.arch
        self.hf = hf
        self.embd_scale, self.norm_offset = np.sqrt(self.dim), 1.0
        self.neox = True
        self.global_rope = hf_rope(hf["rope_theta"], self.rope_dim, hf.get("rope_scaling"))
        self.local_rope = hf_rope(hf.get("rope_local_base_freq", hf["rope_theta"]), self.rope_dim, None) \
            if self.arch == "gemma3" else self.global_rope

    def is_sliding(self, il):
        if self.arch == "gemma" or self.hf.get("sliding_window") is None:
            return False
        if self.arch == "gemma2":
            return il % 2 == 0
        return (il + 1) % self.hf["sliding_window_pattern"] != 0

    def _gnorm(self, x, name):
        w = self._w(name) - 1.0  # the converter's + 1 undone: HF's own weight
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * (self.norm_offset + w)

    def _act(self, g):
        if self.hf.get("hidden_activation", "gelu_pytorch_tanh") == "silu":
            return g / (1 + np.exp(-g))
        return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))

    def hidden(self, tokens):
        tokens = np.asarray(tokens)
        T, hd, H, Hkv, hf = len(tokens), self.head_dim, self.n_head, self.n_head_kv, self.hf
        pos = np.arange(T, dtype=np.float64)
        x = self.t["token_embd.weight"][tokens].astype(np.float64) * self.embd_scale
        gemma1 = self.arch == "gemma"
        qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
        causal = np.where(ki > qi, -np.inf, 0.0)
        window = hf.get("sliding_window")
        sliding = np.where((ki > qi) | (qi - ki >= (window or T + 1)), -np.inf, 0.0)
        scaling = hf["head_dim"] ** -0.5 if gemma1 else hf["query_pre_attn_scalar"] ** -0.5
        cap = None if gemma1 else hf.get("attn_logit_softcapping")
        for il in range(self.n_layer):
            p = f"blk.{il}."
            self.inv_freq, self.rope_att = self.local_rope if self.is_sliding(il) else self.global_rope
            xn = self._gnorm(x, p + "attn_norm.weight")
            q = self._mm(xn, p + "attn_q.weight").reshape(T, H, hd)
            k = self._mm(xn, p + "attn_k.weight").reshape(T, Hkv, hd)
            v = self._mm(xn, p + "attn_v.weight").reshape(T, Hkv, hd)
            if self.arch == "gemma3":
                q = self._gnorm(q, p + "attn_q_norm.weight")
                k = self._gnorm(k, p + "attn_k_norm.weight")
            q = self._rope(q, pos)
            k = self._kv(self._rope(k, pos))
            v = self._kv(v)
            k = np.repeat(k, H // Hkv, axis=1)
            v = np.repeat(v, H // Hkv, axis=1)
            s = np.einsum("thd,uhd->htu", q, k) * scaling
            if cap is not None:
                s = np.tanh(s / cap) * cap
            s = s + (sliding if self.is_sliding(il) else causal)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att = np.einsum("htu,uhd->thd", s, v).reshape(T, H * hd)
            o = self._mm(att, p + "attn_output.weight")
            x = x + (o if gemma1 else self._gnorm(o, p + "post_attention_norm.weight"))
            xn = self._gnorm(x, p + "ffn_norm.weight")
            g = self._mm(xn, p + "ffn_gate.weight")
            u = self._mm(xn, p + "ffn_up.weight")
            d = self._mm(self._act(g) * u, p + "ffn_down.weight")
            x = x + (d if gemma1 else self._gnorm(d, p + "post_ffw_norm.weight"))
        return self._gnorm(x, "output_norm.weight")

    def logits(self, tokens):
        out = self._mm(self.hidden(tokens), self.out_name)
        cap = None if self.arch == "gemma" else self.hf.get("final_logit_softcapping")
        return out if cap is None else np.tanh(out / cap) * cap
