"""test_lora.py - LoRA fold and runtime delta (libnx.so via ctypes, tools/nx-lora) against numpy float64.

The exact adapted weight is W_exact = dequant(W) + s * B @ A in float64, with
dequant by gguf-py (an independent implementation). Checked:
- fold to f32 equals float32(W_exact) (f64 accumulation, one rounding);
- fold to the tensor's own type is gguf-py's quantizer applied to float32(W_exact)
  where gguf-py has one, and within the type's quantization error bound (rows'
  relative RMS error, as tests/py/test_quant.py's bounds) for all types;
- fold to f16 is closer to W_exact than fold to q4_1 (measured on every base type);
- banded folds equal the whole fold, and the base bytes are never written
  (checksums before and after: unfold is putting the base back);
- the runtime delta (f32) against float64 within its f32 accumulation bound;
- the same adapter in PEFT and GGUF form loads to identical floats;
- nx-lora fold writes a merged GGUF whose folded tensors match W_exact and whose
  other tensors are the base's bytes; nx-lora report's numbers are sane;
- the "visible" adapter (make_lora.py) raises its token's logit by the designed
  amount through the real forward pass (via a fold into the F32 tiny model).
"""
import ctypes
import hashlib
import json
import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import make_lora
import make_tiny
from conftest import build_dir, tool


class Wt(ctypes.Structure):  # struct nx_wt (model/model.h)
    _fields_ = [("type", ctypes.c_int), ("n_in", ctypes.c_int64), ("n_out", ctypes.c_int64),
                ("row_bytes", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class LoraT(ctypes.Structure):  # struct nx_lora_t (lora/adapter.h)
    _fields_ = [("layer", ctypes.c_int), ("which", ctypes.c_int), ("rank", ctypes.c_int),
                ("n_in", ctypes.c_int64), ("n_out", ctypes.c_int64), ("scale", ctypes.c_float),
                ("dtype", ctypes.c_int), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("bt", ctypes.c_void_p)]


class Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 512)]


TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q5_K, QT.Q6_K,
         QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS]
KQUANTS = {QT.Q4_K, QT.Q5_K, QT.Q6_K}
GGUF_QUANTIZES = {QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1}  # gguf-py 0.19 can quantize these
# Relative RMS error of one quantization of gaussian-like rows (tests/py/test_quant.py), with 1.5x headroom
# for rows of 512 (fewer blocks per row than there) and the k-quant test weights' flatter distribution.
REL_RMS_BOUND = {QT.F32: 1e-7, QT.F16: 3e-4, QT.BF16: 2e-3, QT.Q8_0: 0.0065, QT.Q4_0: 0.10, QT.Q4_1: 0.092,
                 QT.Q5_0: 0.05, QT.Q5_1: 0.045, QT.Q4_K: 0.085, QT.Q5_K: 0.043, QT.Q6_K: 0.021,
                 QT.Q2_K: 0.36, QT.Q3_K: 0.18, QT.IQ4_NL: 0.092, QT.IQ4_XS: 0.093}


class Lib:
    def __init__(self, path):
        so = self.so = ctypes.CDLL(str(path))
        so.nx_fold_size.restype = ctypes.c_int64
        so.nx_fold_size.argtypes = [ctypes.POINTER(Wt), ctypes.c_int]
        so.nx_fold_work_size.restype = ctypes.c_size_t
        so.nx_fold_work_size.argtypes = [ctypes.POINTER(Wt)]
        so.nx_fold_check.restype = ctypes.c_int
        so.nx_fold_check.argtypes = [ctypes.POINTER(Wt), ctypes.POINTER(LoraT), ctypes.c_int, ctypes.POINTER(Err)]
        so.nx_fold_rows.restype = None
        so.nx_fold_rows.argtypes = [ctypes.POINTER(Wt), ctypes.POINTER(LoraT), ctypes.c_float, ctypes.c_int,
                                    ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        so.nx_lora_delta.restype = None
        so.nx_lora_delta.argtypes = [ctypes.POINTER(LoraT), ctypes.c_float, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_void_p]

    def fold(self, wbytes, wtype, n_in, n_out, a, b, s, out_type, bands=None):
        """Folded tensor bytes (n_out, row bytes of out_type); bands: list of (r0, r1) in the order to run."""
        wbytes = np.ascontiguousarray(wbytes, np.uint8)
        a = np.ascontiguousarray(a, np.float32)
        b = np.ascontiguousarray(b, np.float32)
        w = Wt(int(wtype), n_in, n_out, wbytes.nbytes // n_out, wbytes.ctypes.data)
        t = LoraT(0, 0, a.shape[0], n_in, n_out, 1.0, 0, a.ctypes.data, b.ctypes.data, None)  # f32, no tiles
        err = Err()
        if self.so.nx_fold_check(ctypes.byref(w), ctypes.byref(t), int(out_type), ctypes.byref(err)):
            raise ValueError(err.msg.decode())
        size = self.so.nx_fold_size(ctypes.byref(w), int(out_type))
        out = np.zeros(size + 64, np.uint8)  # 64 guard bytes
        work = np.zeros(self.so.nx_fold_work_size(ctypes.byref(w)) // 8 + 1, np.float64)
        for r0, r1 in bands or [(0, n_out)]:
            self.so.nx_fold_rows(ctypes.byref(w), ctypes.byref(t), s, int(out_type), out.ctypes.data, r0, r1,
                                 work.ctypes.data)
        assert not out[size:].any(), "fold wrote past the tensor"
        return out[:size].reshape(n_out, -1)

    def delta(self, a, b, s, x, y, r0, r1):
        a = np.ascontiguousarray(a, np.float32)
        b = np.ascontiguousarray(b, np.float32)
        x = np.ascontiguousarray(x, np.float32)
        assert y.dtype == np.float32 and y.flags.c_contiguous
        t = LoraT(0, 0, a.shape[0], a.shape[1], b.shape[0], 1.0, 0, a.ctypes.data, b.ctypes.data, None)
        u = np.zeros(x.shape[0] * a.shape[0], np.float32)
        self.so.nx_lora_delta(ctypes.byref(t), s, x.ctypes.data, x.shape[1], x.shape[0], y.ctypes.data,
                              y.shape[1], r0, r1, u.ctypes.data)


@pytest.fixture(scope="module")
def lib():
    path = build_dir() / "libnx.so"
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `make B={build_dir().name} {build_dir().name}/libnx.so`")
    return Lib(path)


def deq(blocks, t):
    return gguf.quants.dequantize(np.asarray(blocks), t).astype(np.float64)


def quantized_weight(rng, t, n_out, n_in, std):
    """(blocks as uint8 (n_out, row bytes), float64 dequantized (n_out, n_in))."""
    blocks, raw = make_tiny.weight(rng, n_out, n_in, t.name, std)
    if raw is None:  # F32
        blocks = blocks.view(np.uint8).reshape(n_out, -1)
    blocks = np.ascontiguousarray(blocks).view(np.uint8).reshape(n_out, -1)
    return blocks, deq(blocks, t).reshape(n_out, n_in)


def exact_fold(wd, a, b, s):
    """dequant(W) + s * B @ A in float64, B @ A summed over the rank in order k = 0, 1, ...
    as lora/fold.c does, so float32(result) is what a correct fold to f32 must give bit for bit."""
    acc = np.zeros(wd.shape)
    for k in range(a.shape[0]):
        acc += b[:, k, None].astype(np.float64) * a[None, k, :].astype(np.float64)
    return wd + float(s) * acc


def rel_rms(err, ref, axis=None):
    return np.sqrt(np.mean(err ** 2, axis=axis) / np.mean(ref ** 2, axis=axis))


# ---------------------------------------------------------------- fold arithmetic (ctypes)

N_OUT, N_IN, RANK = 48, 512, 8


def lora_pair(rng, w, rank=RANK, rel=0.05, s=2.0):
    """A (rank, n_in), B (n_out, rank) float32 with rms(s B A) = rel * rms(W)."""
    n_out, n_in = w.shape
    a = (rng.uniform(-1, 1, (rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
    sb = rel * np.sqrt(np.mean(w ** 2)) / (s * np.sqrt(rank / (3 * n_in)))
    b = (rng.standard_normal((n_out, rank)) * sb).astype(np.float32)
    return a, b


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_fold_matches_float64(lib, t, report):
    rng = np.random.default_rng(int(t) + 100)
    blocks, wd = quantized_weight(rng, t, N_OUT, N_IN, 0.05)
    a, b = lora_pair(rng, wd)
    s = np.float32(2.0)
    exact = exact_fold(wd, a, b, s)
    base_hash = hashlib.sha256(blocks.tobytes()).hexdigest()

    # f32: one rounding of the float64 result.
    f32 = lib.fold(blocks, t, N_IN, N_OUT, a, b, s, QT.F32).view(np.float32).reshape(N_OUT, N_IN)
    assert np.array_equal(f32, exact.astype(np.float32)), np.abs(f32 - exact).max()

    # keep: the tensor's own type, within its quantization bound per row ...
    keep = lib.fold(blocks, t, N_IN, N_OUT, a, b, s, t)
    keep_err = rel_rms(deq(keep, t).reshape(N_OUT, N_IN) - exact, exact, axis=1)
    assert keep_err.max() <= 1.5 * REL_RMS_BOUND[t], f"{t.name}: worst row rel rms {keep_err.max():.4g}"
    # ... and, where gguf-py can quantize, exactly its quantizer applied to float32(W_exact).
    if t in GGUF_QUANTIZES:
        ref = gguf.quants.quantize(exact.astype(np.float32), t).view(np.uint8).reshape(N_OUT, -1)
        same = np.all(ref == keep, axis=1).mean()
        assert same >= 0.99, f"{t.name}: only {same:.3f} of the rows equal gguf-py's quantization"

    # f16 is closer to exact than q4_1, measured.
    e16 = rel_rms(deq(lib.fold(blocks, t, N_IN, N_OUT, a, b, s, QT.F16), QT.F16).reshape(N_OUT, N_IN) - exact, exact)
    e41 = rel_rms(deq(lib.fold(blocks, t, N_IN, N_OUT, a, b, s, QT.Q4_1), QT.Q4_1).reshape(N_OUT, N_IN) - exact,
                  exact)
    assert e16 < e41, (e16, e41)
    assert e16 <= REL_RMS_BOUND[QT.F16]
    report(f"lora fold {t.name:5s} -> keep rel rms {rel_rms(deq(keep, t).reshape(N_OUT, N_IN) - exact, exact):.2e}"
           f"  f16 {e16:.2e}  q4_1 {e41:.2e}")

    # Unfold = the base: the fold never wrote it.
    assert hashlib.sha256(blocks.tobytes()).hexdigest() == base_hash


@pytest.mark.parametrize("t", [QT.Q4_1, QT.Q6_K, QT.F16], ids=lambda t: t.name)
def test_fold_bands(lib, t):
    rng = np.random.default_rng(7)
    blocks, wd = quantized_weight(rng, t, N_OUT, N_IN, 0.05)
    a, b = lora_pair(rng, wd)
    whole = lib.fold(blocks, t, N_IN, N_OUT, a, b, 1.5, QT.Q8_0)
    banded = lib.fold(blocks, t, N_IN, N_OUT, a, b, 1.5, QT.Q8_0, bands=[(30, 48), (0, 1), (1, 30)])
    assert np.array_equal(whole, banded)


def test_fold_scale_zero_is_requantization(lib):
    """s = 0 folds nothing: to f32 it is dequant(W) itself."""
    rng = np.random.default_rng(8)
    blocks, wd = quantized_weight(rng, QT.Q4_K, N_OUT, N_IN, 0.05)
    a, b = lora_pair(rng, wd)
    f32 = lib.fold(blocks, QT.Q4_K, N_IN, N_OUT, a, b, 0.0, QT.F32).view(np.float32).reshape(N_OUT, N_IN)
    assert np.array_equal(f32, wd.astype(np.float32))


def test_fold_rejects_bad_targets(lib):
    rng = np.random.default_rng(9)
    blocks, wd = quantized_weight(rng, QT.Q8_0, 4, 96, 0.05)
    a, b = lora_pair(rng, wd, rank=2)
    with pytest.raises(ValueError, match="rows of 96 elements do not fit q4_k blocks of 256"):
        lib.fold(blocks, QT.Q8_0, 96, 4, a, b, 1.0, QT.Q4_K)
    with pytest.raises(ValueError, match="cannot produce type"):
        lib.fold(blocks, QT.Q8_0, 96, 4, a, b, 1.0, 16)  # iq2_xxs: no quantizer


# ---------------------------------------------------------------- runtime delta (ctypes)

def test_delta_matches_float64(lib, report):
    rng = np.random.default_rng(10)
    n_tok, n_in, n_out, rank, s = 5, 576, 1536, 64, np.float32(0.7)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    a = (rng.uniform(-1, 1, (rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
    b = (rng.standard_normal((n_out, rank)) * 0.02).astype(np.float32)
    y0 = rng.standard_normal((n_tok, n_out)).astype(np.float32)
    A, B, X = a.astype(np.float64), b.astype(np.float64), x.astype(np.float64)
    exact = y0 + float(s) * (X @ A.T) @ B.T

    # One band: rows outside it stay exactly as they were.
    y = y0.copy()
    lib.delta(a, b, s, x, y, 100, 700)
    assert np.array_equal(y[:, :100], y0[:, :100]) and np.array_equal(y[:, 700:], y0[:, 700:])
    # All rows in two bands.
    lib.delta(a, b, s, x, y, 0, 100)
    lib.delta(a, b, s, x, y, 700, n_out)

    # f32 accumulation bound: each sum of m terms is off by at most m * 2^-24 * sum |terms|,
    # so |err| <= s * ((n_in + rank + 2) * 2^-24) * |B| @ (|A| @ |x|) + 2^-24 |y| (final add).
    u = 2.0 ** -24
    bound = float(s) * (n_in + rank + 2) * u * (np.abs(X) @ np.abs(A).T) @ np.abs(B).T + u * np.abs(exact)
    err = np.abs(y - exact)
    assert (err <= bound).all(), (err / bound).max()
    delta = exact - y0
    rel = rel_rms(y - exact, delta)
    assert rel < 1e-6, rel  # typical f32 rounding (~sqrt(n) * 2^-24)
    report(f"lora runtime delta (f32, n_in {n_in}, rank {rank}): rel rms error vs float64 {rel:.2e}, "
           f"max abs {err.max():.2e}")


# ---------------------------------------------------------------- adapters and the tool

@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    make_lora.build_tiny(d)
    return d


def run(*args, ok=True):
    p = subprocess.run([str(tool("nx-lora")), *map(str, args)], capture_output=True, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr.decode()
    else:
        assert p.returncode != 0, "nx-lora accepted a bad input"
    return p.stdout.decode(), p.stderr.decode()


def info_lines(model, adapter):
    out, _ = run("info", model, adapter)
    lines = out.splitlines()
    return lines[0], lines[1:]


def test_formats_agree(fx):
    """PEFT (F32) and GGUF (F16) forms of the same adapter load to the same floats."""
    head_p, peft = info_lines(fx / "tiny-q4_1.gguf", fx / "tiny-r4")
    head_g, gg = info_lines(fx / "tiny-q4_1.gguf", fx / "tiny-r4.gguf")
    assert peft == gg and len(peft) == 14
    assert "rank 4 alpha 8" in head_p and "rank 4 alpha 8" in head_g
    assert all("scale 2 " in line for line in peft)
    # The .safetensors path works as well as its directory.
    assert info_lines(fx / "tiny-q4_1.gguf", fx / "tiny-r4" / "adapter_model.safetensors")[1] == peft


def test_wrong_model_rejected(fx):
    _, err = run("info", fx / "tiny-qwen2.gguf", fx / "tiny-r4.gguf", ok=False)
    assert "architecture 'llama', the model is 'qwen2'" in err
    # visible/ adapts ffn_down of layer 1 with n_ff 512 inputs: fine for tiny-f32, not for a 1-layer model.
    one = make_tiny.build(fx / "one-layer.gguf", wtype="F32", n_layer=1, seed=3)
    _, err = run("info", one, fx / "visible", ok=False)
    assert "layer 1 is out of range" in err and "1 layers" in err


def test_report_tiny(fx, report):
    out, _ = run("report", fx / "tiny-q4_1.gguf", fx / "tiny-r4", "--type", "keep,f16,q8_0", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    tot = rows[-1]["total"]
    assert tot["tensors"] == 14 and len(rows) == 15
    for r in rows[:-1] + [tot]:
        keep, f16, q8 = (f["rel_rms"] for f in r["fold"])
        assert 0.02 < r["effect"] < 0.1  # the fixture's 5% delta, seen through the probes
        assert 2e-5 < f16 < 1e-3         # f16 rounding of the weights: present, and small
        assert f16 < q8 < keep           # more bits, less fold error
        assert r["delta"]["rel_rms"] < 1e-6
        assert 0.03 < r["noise"]["rel_rms"] < 0.2  # q4_1's own quantization error
    assert [f["type"] for f in rows[0]["fold"]] == ["q4_1", "f16", "q8_0"]
    report(f"lora report tiny q4_1 rank 4: effect {tot['effect']:.2e}, fold keep {tot['fold'][0]['rel_rms']:.2e}, "
           f"f16 {tot['fold'][1]['rel_rms']:.2e}, q8_0 {tot['fold'][2]['rel_rms']:.2e}, "
           f"delta {tot['delta']['rel_rms']:.2e}, q4_1 noise {tot['noise']['rel_rms']:.2e}")
    # The table form prints the same tensors and a total.
    out, _ = run("report", fx / "tiny-q4_1.gguf", fx / "tiny-r4.gguf", "--layers", "1")
    assert sum(line.startswith("blk.1.") for line in out.splitlines()) == 7
    assert "total (7 tensors)" in out and "synthetic" in out


def gguf_tensors(path):
    r = gguf.GGUFReader(str(path))
    return {t.name: t for t in r.tensors}


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("out_type", ["f16", "keep"])
def test_fold_tool_writes_merged_gguf(fx, tmp_path, out_type):
    model, adapter = fx / "tiny-q4_1.gguf", fx / "tiny-r4"
    before = sha(model)
    merged = tmp_path / f"merged-{out_type}.gguf"
    run("fold", model, adapter, "--type", out_type, "--out", merged, "--scale", "0.5")
    assert sha(model) == before  # the base file is only read
    base, new = gguf_tensors(model), gguf_tensors(merged)
    assert list(base) == list(new)
    r = gguf.GGUFReader(str(adapter.parent / "tiny-r4.gguf"))
    ab = {t.name: t.data.astype(np.float64).reshape([int(n) for n in reversed(t.shape)]) for t in r.tensors}
    s = 0.5 * 8 / 4  # user scale * alpha / r
    folded = 0
    for name, t in base.items():
        nt = new[name]
        if name + ".lora_a" not in ab:
            assert nt.tensor_type == t.tensor_type and np.array_equal(np.asarray(nt.data), np.asarray(t.data)), name
            continue
        folded += 1
        shape = [int(n) for n in reversed(t.shape)]
        exact = exact_fold(deq(t.data, t.tensor_type).reshape(shape), ab[name + ".lora_a"], ab[name + ".lora_b"], s)
        got = deq(nt.data, nt.tensor_type).reshape(shape)
        if out_type == "f16":
            assert nt.tensor_type == QT.F16
            assert np.array_equal(got, exact.astype(np.float32).astype(np.float16).astype(np.float64)), name
        else:
            assert nt.tensor_type == QT.Q4_1
            ref = gguf.quants.quantize(exact.astype(np.float32), QT.Q4_1).view(np.uint8).reshape(shape[0], -1)
            same = np.all(ref == np.asarray(nt.data).reshape(shape[0], -1), axis=1).mean()
            assert same >= 0.99, (name, same)
    assert folded == 14
    # The merged model runs.
    p = subprocess.run([str(tool("nx-eval")), str(merged)], input=b"seq 0 1 2 3\nstep 0:0:3\n", capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    assert np.isfinite(np.frombuffer(p.stdout, np.float32)).all()


def eval_last_logits(model, prompt):
    text = f"seq 0 {' '.join(map(str, prompt))}\nstep 0:0:{len(prompt)}\n"
    p = subprocess.run([str(tool("nx-eval")), str(model)], input=text.encode(), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return np.frombuffer(p.stdout, np.float32).reshape(len(prompt), -1)[-1].astype(np.float64)


def test_visible_adapter(fx, tmp_path, report):
    """The visible adapter's designed effect, through the engine's forward pass.

    Until the forward pass applies adapters at run time, the adapter is folded
    into the F32 tiny model (fold to f32 is exact to one f32 rounding), and the
    merged model's logits are compared with the base model's."""
    info = json.loads((fx / "visible.json").read_text())
    model = fx / "tiny-f32.gguf"
    merged = {}
    for form in ("visible", "visible.gguf"):
        merged[form] = tmp_path / f"merged-{form}.gguf"
        run("fold", model, fx / form, "--type", "f32", "--out", merged[form])
    assert sha(merged["visible"]) == sha(merged["visible.gguf"])  # both forms fold to the same bytes
    base = eval_last_logits(model, info["prompt"])
    new = eval_last_logits(merged["visible"], info["prompt"])
    tok = info["token"]
    # Engine vs float64 reference: the F32 model's logits agree to ~1e-3 (test_forward.py's "float" bound).
    assert np.abs(base - np.array(info["base_logits"])).max() < 0.02
    assert np.abs(new - np.array(info["adapted_logits"])).max() < 0.02
    rise = new[tok] - base[tok]
    assert abs(rise - info["rise"]) < 0.02, rise
    assert int(np.argmax(new)) == tok != int(np.argmax(base))
    report(f"lora visible adapter: token {tok} logit {base[tok]:+.3f} -> {new[tok]:+.3f} "
           f"(designed rise {info['rise']}, measured {rise:.4f}), now the argmax")


# ---------------------------------------------------------------- the default model

@pytest.fixture(scope="module")
def smol(model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("smol-lora")
    make_lora.build_model_adapters(d, model_path)
    return d


def test_default_model_adapters(model_path, smol, fx, report):
    for rank in (8, 64):
        head_p, peft = info_lines(model_path, smol / f"smol-r{rank}")
        head_g, gg = info_lines(model_path, smol / f"smol-r{rank}.gguf")
        assert peft == gg and len(peft) == 30 * 7, rank
        assert f"rank {rank}" in head_p
    for rank in (8, 64):
        out, _ = run("report", model_path, smol / f"smol-r{rank}", "--layers", "0,29", "--probes", "8",
                     "--type", "keep,f16,q8_0", "--json")
        tot = json.loads(out.splitlines()[-1])["total"]
        keep, f16, q8 = (f["rel_rms"] for f in tot["fold"])
        assert f16 < q8 < keep and f16 < 1e-3
        assert tot["delta"]["rel_rms"] < 1e-5
        report(f"lora report SmolLM2 q4_1 rank {rank} (layers 0, 29; synthetic probes): effect {tot['effect']:.2e}, "
               f"fold keep {keep:.2e}, f16 {f16:.2e}, q8_0 {q8:.2e}, delta {tot['delta']['rel_rms']:.2e}, "
               f"q4_1 noise {tot['noise']['rel_rms']:.2e}, fold {tot['fold_ms']:.0f} ms for 14 tensors")
    # 576-wide rows cannot be k-quants.
    _, err = run("fold", model_path, smol / "smol-r8", "--type", "q4_k", "--out", smol / "x.gguf", ok=False)
    assert "rows of 576 elements do not fit q4_k blocks of 256" in err
    # An adapter for another hidden size (the tiny models' 256).
    _, err = run("info", model_path, fx / "tiny-r4.gguf", ok=False)
    assert "expected [576, 4]" in err and "hidden size" in err
