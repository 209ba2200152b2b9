"""test_quant.py - our tensor type kernels (libnx.so via ctypes) against gguf-py, an independent implementation.

Dequantization must equal gguf.quants.dequantize bit for bit: both compute each
element with the same float32 operations in the same order (e.g. Q4_K:
(d*sc)*q - dmin*m, Q4_1: q*d + m), and kern/quant_ref.c is compiled without
fused multiply-add, so there is no rounding difference to allow for.

Quantization must equal gguf.quants.quantize byte for byte where gguf-py
implements it (gguf 0.19.0: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; its
Q8_0/Q4_0/... are ports of ggml's reference quantizers). For the k-quants and
IQ4_NL / IQ4_XS, which gguf-py only dequantizes, our blocks dequantized by gguf-py must be
within the same error bounds as in tests/c/test_quant.c, and on a fixed input
they must hash to what llama.cpp's own reference quantizer produced.

Dots are checked against numpy's float64 dot of the gguf-dequantized weight
with our dequantized activation, which pins our dot's reading of each layout
to gguf-py's.
"""
import ctypes
import hashlib

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from conftest import build_dir

# struct nx_type_traits in kern/quant.h; the kernels are read as plain pointers.
class Traits(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("blck", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("dequant", ctypes.c_void_p),
        ("quant", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("dot", ctypes.c_void_p),
    ]


DEQUANT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
QUANT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
DOT_FN = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

WEIGHT_TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K,
                QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS]
# The types gguf-py only dequantizes: ours are checked against llama.cpp's blocks.
SEARCHED_TYPES = [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS]
Q8_K = 15  # not in gguf-py's enum: an activation-only type

# Byte offsets of the f16 scale fields in each block (kern/quant.h, ggml-common.h).
F16_FIELDS = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208], QT.Q2_K: [80, 82], QT.Q3_K: [108],
    QT.IQ4_NL: [0], QT.IQ4_XS: [0],
}

# rms error bound of quantize -> dequantize relative to the data's rms, gaussian data (as test_quant.c).
REL_RMS_BOUND = {
    QT.F32: 0.0, QT.F16: 3e-4, QT.BF16: 2e-3, QT.Q8_0: 0.0065, QT.Q4_0: 0.10, QT.Q4_1: 0.092,
    QT.Q5_0: 0.05, QT.Q5_1: 0.045, QT.Q4_K: 0.085, QT.Q5_K: 0.043, QT.Q6_K: 0.021,
    QT.Q2_K: 0.36, QT.Q3_K: 0.18, QT.IQ4_NL: 0.092, QT.IQ4_XS: 0.093,
}


class Lib:
    def __init__(self, path):
        self.so = ctypes.CDLL(str(path))
        for fn in ("nx_type_ref", "nx_type_get"):
            getattr(self.so, fn).restype = ctypes.POINTER(Traits)
            getattr(self.so, fn).argtypes = [ctypes.c_int]
        self.so.nx_type_name.restype = ctypes.c_char_p
        self.so.nx_type_name.argtypes = [ctypes.c_uint32]
        self.so.nx_type_supported.restype = ctypes.c_bool
        self.so.nx_type_supported.argtypes = [ctypes.c_uint32]
        self.so.nx_row_size.restype = ctypes.c_int64
        self.so.nx_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    def traits(self, t):
        p = self.so.nx_type_ref(int(t))
        return p.contents if p else None

    def dequant(self, t, blocks, n):
        tr = self.traits(t)
        src = np.ascontiguousarray(blocks, dtype=np.uint8)
        assert src.size == self.so.nx_row_size(int(t), n)
        out = np.empty(n, dtype=np.float32)
        DEQUANT_FN(tr.dequant)(src.ctypes.data, out.ctypes.data, n)
        return out

    def quant(self, t, x):
        tr = self.traits(t)
        x = np.ascontiguousarray(x, dtype=np.float32)
        size = self.so.nx_row_size(int(t), x.size)
        assert size >= 0
        out = np.zeros(size + 64, dtype=np.uint8)  # 64 guard bytes
        QUANT_FN(tr.quant)(x.ctypes.data, out.ctypes.data, x.size)
        assert not out[size:].any(), "quantize wrote past the row"
        return out[:size]

    def dot(self, t, w, a, n):
        tr = self.traits(t)
        return DOT_FN(tr.dot)(w.ctypes.data, a.ctypes.data, n)


@pytest.fixture(scope="module")
def lib():
    path = build_dir() / "libnx.so"
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `make B={build_dir().name} {build_dir().name}/libnx.so`")
    return Lib(path)


def finite_f16(rng, shape, max_exp=None):
    """Random f16 bit patterns with every finite value possible (subnormals, both
    signs), or with the exponent field capped at max_exp to keep products small."""
    h = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    e = (h >> 10) & 0x1F
    cap = 30 if max_exp is None else max_exp
    e = np.where(e > cap, e % (cap + 1), e).astype(np.uint16)
    return (h & 0x83FF) | (e << 10)


def random_blocks(rng, t, nblocks):
    """Random bytes for nblocks blocks of t, with the f16 scales made finite."""
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    for off in F16_FIELDS.get(t, []):
        raw[:, off:off + 2] = finite_f16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    return raw


def weight_like(rng, n):
    """Gaussian data plus the awkward cases: a zero block, a constant block,
    small and huge blocks (much smaller ones underflow the f16 scales: a limit
    of the formats), an offset block with an outlier, ties at .5."""
    x = rng.standard_normal(n).astype(np.float32)
    x[0:256] = 0
    x[256:512] = -0.75
    x[512:768] *= np.float32(1e-2)
    x[768:1024] *= np.float32(1e4)
    x[1024:1280] = x[1024:1280] * np.float32(0.02) + np.float32(0.01)
    x[1100] = 0.3
    x[1280:1536] = np.round(x[1280:1536] * 4) / 2 + 0.5
    # exact ties for Q8_0's rounding (half away from zero): amax 127 makes d = 1
    ties = (rng.integers(-127, 127, size=256) + 0.5).astype(np.float32)
    ties[::32] = 127
    x[1536:1792] = ties
    return x


# ---------------------------------------------------------------- the type table


def test_type_table_matches_gguf(lib):
    for t, (blck, size) in gguf.GGML_QUANT_SIZES.items():
        tr = lib.traits(int(t))
        assert tr is not None, f"{t.name} missing from our table"
        assert tr.name.decode() == t.name.lower(), t.name
        assert lib.so.nx_type_name(int(t)).decode() == t.name.lower()
        if t == QT.Q8_1:
            # gguf-py 0.19 still lists the old 40-byte q8_1 (float d, float s);
            # ggml's block_q8_1 is two halves and 32 int8 (static_assert in ggml-common.h)
            size = 2 + 2 + 32
        assert (tr.blck, tr.type_size) == (blck, size), t.name
        assert lib.so.nx_row_size(int(t), 4 * blck) == 4 * size
        assert lib.so.nx_row_size(int(t), 4 * blck + 1) == (5 * size if blck == 1 else -1)
        assert lib.so.nx_type_supported(int(t)) == (t in WEIGHT_TYPES), t.name
    assert lib.so.nx_type_name(4) == b"?"
    assert not lib.so.nx_type_supported(Q8_K)
    assert lib.traits(Q8_K).blck == 256 and lib.traits(Q8_K).type_size == 292


def test_vec_dot_types(lib):
    want = {QT.F32: 0, QT.F16: 0, QT.BF16: 0, QT.Q8_0: 8, QT.Q4_0: 8, QT.Q4_1: 8, QT.Q5_0: 8,
            QT.Q5_1: 8, QT.Q4_K: Q8_K, QT.Q5_K: Q8_K, QT.Q6_K: Q8_K, QT.Q2_K: Q8_K, QT.Q3_K: Q8_K,
            QT.IQ4_NL: 8, QT.IQ4_XS: Q8_K}
    for t, a in want.items():
        assert lib.traits(t).vec_dot_type == a, t.name
        g = lib.so.nx_type_get(int(t)).contents
        assert g.vec_dot_type == a and g.blck == lib.traits(t).blck


# ---------------------------------------------------------------- dequantize


@pytest.mark.parametrize("t", [t for t in WEIGHT_TYPES if t not in (QT.F32,)], ids=lambda t: t.name)
def test_dequant_equals_gguf(lib, t):
    rng = np.random.default_rng(1000 + int(t))
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    nblocks = 4096 if bs == 1 else max(64, 65536 // bs)
    if t in (QT.F16, QT.BF16):
        raw = rng.integers(0, 1 << 16, size=nblocks, dtype=np.uint16)
        raw[:16] = [0, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF,
                    0x3C00, 0x7F80, 0xFF80, 0x7FC0, 0x0080]
        raw = raw.view(np.uint8)
    else:
        raw = random_blocks(rng, t, nblocks)
    n = nblocks * bs
    ours = lib.dequant(t, raw, n)
    theirs = gguf.quants.dequantize(raw, t).reshape(-1)
    assert theirs.dtype == np.float32 and theirs.size == n
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan)
    diff = np.flatnonzero(ours[~nan].view(np.uint32) != theirs[~nan].view(np.uint32))
    assert diff.size == 0, f"{t.name}: {diff.size} of {n} differ, first at {diff[0]}: {ours[~nan][diff[0]]!r} vs {theirs[~nan][diff[0]]!r}"


def test_dequant_f32_is_identity(lib):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 1 << 32, size=1000, dtype=np.uint32)
    assert np.array_equal(lib.dequant(QT.F32, x.view(np.uint8), 1000).view(np.uint32), x)


# ---------------------------------------------------------------- quantize


def test_f16_quant_equals_numpy(lib):
    """numpy's float32 -> float16 cast is IEEE round-to-nearest-even; NaN payloads
    are kept differently, so NaNs are only checked to stay NaN."""
    rng = np.random.default_rng(7)
    u = rng.integers(0, 1 << 32, size=1 << 21, dtype=np.uint32)
    # every float near the f16 range's edges and ties: exponents 101..143, low mantissa bits at the rounding point
    e = rng.integers(101, 144, size=1 << 20, dtype=np.uint32)
    m = (rng.integers(0, 1 << 10, size=1 << 20, dtype=np.uint32) << 13) | rng.choice(
        np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF], dtype=np.uint32), size=1 << 20)
    s = rng.integers(0, 2, size=1 << 20, dtype=np.uint32) << 31
    u = np.concatenate([u, s | (e << 23) | (m & 0x7FFFFF)])
    x = u.view(np.float32)
    ours = lib.quant(QT.F16, x).view(np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):  # numpy warns on casts to inf
        theirs = gguf.quants.quantize(x, QT.F16).view(np.uint16)
    nan = np.isnan(x)
    assert np.all((ours[nan] & 0x7C00) == 0x7C00) and np.all((ours[nan] & 0x03FF) != 0)
    bad = np.flatnonzero(ours[~nan] != theirs[~nan])
    assert bad.size == 0, f"{bad.size} differ, e.g. {x[~nan][bad[0]]!r}: {ours[~nan][bad[0]]:#06x} vs {theirs[~nan][bad[0]]:#06x}"


def test_bf16_quant_equals_gguf(lib):
    rng = np.random.default_rng(8)
    u = rng.integers(0, 1 << 32, size=1 << 21, dtype=np.uint32)
    u[:8] = [0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7F7FFFFF, 0x3F808000, 0x3F818000, 0x00008000, 0x80000000]
    x = u.view(np.float32)
    ours = lib.quant(QT.BF16, x)
    theirs = gguf.quants.quantize(x, QT.BF16).view(np.uint8).reshape(-1)
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("t", [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1], ids=lambda t: t.name)
def test_quant_equals_gguf(lib, t):
    rng = np.random.default_rng(2000 + int(t))
    x = weight_like(rng, 1 << 16)
    ours = lib.quant(t, x)
    theirs = gguf.quants.quantize(x.reshape(-1, 256), t).reshape(-1)
    if not np.array_equal(ours, theirs):
        ts = gguf.GGML_QUANT_SIZES[t][1]
        blk = np.flatnonzero((ours.reshape(-1, ts) != theirs.reshape(-1, ts)).any(axis=1))
        pytest.fail(f"{t.name}: {blk.size} blocks differ, first {blk[0]}: {ours.reshape(-1, ts)[blk[0]]} vs {theirs.reshape(-1, ts)[blk[0]]}")


@pytest.mark.parametrize("t", SEARCHED_TYPES, ids=lambda t: t.name)
def test_kquant_through_gguf(lib, t):
    """gguf-py cannot quantize the k-quants and iq4 types (if a later version can, the blocks
    must then be identical): our blocks, read back by gguf-py, are within the bound."""
    rng = np.random.default_rng(3000 + int(t))
    x = rng.standard_normal(1 << 16).astype(np.float32)
    ours = lib.quant(t, x)
    try:
        theirs = gguf.quants.quantize(x, t).reshape(-1)
    except NotImplementedError:
        theirs = None
    if theirs is not None:
        assert np.array_equal(ours, theirs)
    y = gguf.quants.dequantize(ours, t).reshape(-1)
    err = np.sqrt(np.mean((x.astype(np.float64) - y) ** 2) / np.mean(x.astype(np.float64) ** 2))
    assert err <= REL_RMS_BOUND[t], f"{t.name}: rel rms {err:.5f}"
    assert np.array_equal(lib.dequant(t, ours, x.size), y)
    # the awkward blocks (zero, constant, small, huge) quantize without NaN and close
    w = weight_like(rng, 1 << 12)
    yw = gguf.quants.dequantize(lib.quant(t, w), t).reshape(-1)
    assert np.all(np.isfinite(yw))
    assert np.all(yw[0:256] == 0)
    assert np.allclose(yw[256:512], -0.75, atol=0.01)
    for lo in (512, 768):
        blk = slice(lo, lo + 256)
        assert np.sqrt(np.mean((w[blk] - yw[blk]) ** 2) / np.mean(w[blk] ** 2)) < 2 * REL_RMS_BOUND[t]


def golden_input():
    """64 super-blocks from integer arithmetic only (so C and numpy agree on every
    bit): a sum of 4 uniforms per value, blocks scaled by 1/8..8, every 5th
    offset by 0.5, every 11th all zero."""
    n = 256 * 64

    def mix(i):
        u = i * np.uint64(6364136223846793005) + np.uint64(1442695040888963407)
        u ^= u >> np.uint64(33)
        u *= np.uint64(0xFF51AFD7ED558CCD)
        return u ^ (u >> np.uint64(33))

    i = np.arange(n, dtype=np.uint64)
    x = np.zeros(n, dtype=np.float32)
    for k in range(4):
        u = mix(i * np.uint64(4) + np.uint64(k))
        x = x + ((u >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0**-23)
    x = x.reshape(-1, 256)
    for b in range(len(x)):
        x[b] = x[b] * np.float32((1 << (b % 7)) / 8.0)
        if b % 5 == 0:
            x[b] = x[b] + np.float32(0.5)
        if b % 11 == 0:
            x[b] = 0
    return x.reshape(-1)


# sha256 of the blocks llama.cpp's quantize_row_{q4_K,q5_K,q6_K,q2_K,q3_K,iq4_xs}_ref
# and quantize_iq4_nl (no imatrix) produce for golden_input():
# ggml/src/ggml-quants.c as vendored in the llama-cpp-python 0.3.36 sdist,
# compiled with gcc -O2 for x86-64 (no FMA contraction, like kern/quant_ref.c).
# That is what `llama-quantize` writes without an imatrix. (For iq4_nl it is
# quantize_iq4_nl, which searches the scale; quantize_row_iq4_nl_ref does not.)
LLAMA_CPP_KQUANT_SHA256 = {
    QT.Q4_K: "da3f2feb0c4f11580ef07eb68f491a371ef2b70220e6b56abd0fb5cdc9c443a3",
    QT.Q5_K: "2b2efd5bdc484370bf127e9b1dc64f7cabb6206781519752be4fe969fbc5d154",
    QT.Q6_K: "021a66f00b6aaf71ea9775cb778cdead80c3cc15fb02e54be335b98cd062050f",
    QT.Q2_K: "766282378476c46170bc41b2231689df67eaabb8b1f208a76f250518794b64cc",
    QT.Q3_K: "e533dec2dee56a5568f65d46471bd00ff36863c07d98353445287693608cf7ce",
    QT.IQ4_NL: "9873ebbf373b5509eb6d18895fd3eb2f5d9fc8d88133a86199a8a65a9c114284",
    QT.IQ4_XS: "d385a74f41f8947e56a5dff093efec37baf87c7dde496f5d0b6c3ad2c5e327c0",
}


@pytest.mark.parametrize("t", SEARCHED_TYPES, ids=lambda t: t.name)
def test_kquant_equals_llama_cpp(lib, t):
    x = golden_input()
    assert hashlib.sha256(x.tobytes()).hexdigest() == "8f95547e468919945440794366c6fa44cf3e1f690566ce6ac06dcaca9e6241b2"
    assert hashlib.sha256(lib.quant(t, x).tobytes()).hexdigest() == LLAMA_CPP_KQUANT_SHA256[t]


@pytest.mark.parametrize("t", [t for t in WEIGHT_TYPES if t not in SEARCHED_TYPES], ids=lambda t: t.name)
def test_quant_error_bound(lib, t):
    rng = np.random.default_rng(4000 + int(t))
    x = rng.standard_normal(1 << 16).astype(np.float32)
    y = gguf.quants.dequantize(lib.quant(t, x), t).reshape(-1).astype(np.float64)
    err = np.sqrt(np.mean((x - y) ** 2) / np.mean(x.astype(np.float64) ** 2))
    assert err <= REL_RMS_BOUND[t], f"{t.name}: rel rms {err:.5f}"


def q8_k_numpy(x):
    """Q8_K blocks by ggml's rule, in numpy: d = max/-127 where max is the value of
    largest magnitude (first one, with its sign); q = min(127, round-half-even(x/d))
    computed as x * (-127/max) in float32; bsums of 16-groups; a zero block is all zero."""
    b = x.reshape(-1, 256)
    mx = b[np.arange(len(b)), np.abs(b).argmax(axis=1)]
    out = np.zeros(len(b), dtype=[("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
    nz = mx != 0
    iscale = np.float32(-127) / mx[nz]
    q = np.minimum(127, np.rint(b[nz] * iscale[:, None])).astype(np.int8)
    out["qs"][nz] = q
    out["bsums"][nz] = q.reshape(-1, 16, 16).astype(np.int16).sum(axis=2)
    out["d"][nz] = np.float32(1) / iscale
    return out.view(np.uint8).reshape(-1)


def test_q8_k_equals_numpy(lib):
    rng = np.random.default_rng(9)
    x = weight_like(rng, 1 << 14)
    x[-256:] = (rng.integers(-127, 127, size=256) + 0.5).astype(np.float32)  # ties: -127/max = 1
    x[-256] = -127
    ours = lib.quant(Q8_K, x)
    assert np.array_equal(ours, q8_k_numpy(x))
    y = lib.dequant(Q8_K, ours, x.size)
    blocks = ours.view([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
    assert np.array_equal(y, (blocks["qs"] * blocks["d"][:, None]).reshape(-1))


# ---------------------------------------------------------------- dots


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dot_against_gguf_dequant(lib, t):
    """dot(w, a) with random weight blocks = float64 dot of gguf's dequantized w
    with our dequantized activation, up to float32 rounding of the block sums."""
    rng = np.random.default_rng(5000 + int(t))
    n = 4096
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    if t == QT.F32:
        w = rng.standard_normal(n).astype(np.float32).view(np.uint8)
    elif t in (QT.F16, QT.BF16):
        w = gguf.quants.quantize(rng.standard_normal(n).astype(np.float32), t).view(np.uint8).reshape(-1)
    else:
        # scales of ordinary size (exponent field <= 15, values below 2), so no product overflows
        w = random_blocks(rng, t, n // bs)
        for off in F16_FIELDS[t]:
            w[:, off:off + 2] = finite_f16(rng, n // bs, max_exp=15).view(np.uint8).reshape(-1, 2)
        w = w.reshape(-1)
    wf = gguf.quants.dequantize(w, t).reshape(-1).astype(np.float64)
    at = lib.traits(t).vec_dot_type
    x = (rng.standard_normal(n) + 0.3).astype(np.float32)
    a = lib.quant(at, x) if at != 0 else x
    af = lib.dequant(at, a.view(np.uint8), n).astype(np.float64)
    if at == 8:  # Q8_0 activations: gguf-py reads them the same way
        assert np.array_equal(af, gguf.quants.dequantize(a, QT.Q8_0).reshape(-1))
    want = float(np.dot(wf, af))
    mag = float(np.sum(np.abs(wf * af)))
    got = lib.dot(t, w, a, n)
    assert abs(got - want) <= 2e-5 * mag, f"{t.name}: dot {got} vs {want} (sum |w a| {mag})"
    g = lib.so.nx_type_get(int(t)).contents
    assert abs(DOT_FN(g.dot)(w.ctypes.data, a.ctypes.data, n) - want) <= 2e-5 * mag
