"""test_gguf_files.py - the C GGUF reader (through gguf-dump) against gguf-py's writer and reader on real and generated files."""
import re
import struct
import subprocess

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V

from conftest import tool

# gguf-dump's names for GGUF value types, indexed by GGUFValueType.
VTYPE = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"]

KV_RE = re.compile(r"^  (\S+): (\w+) = (.*)$")
TENSOR_RE = re.compile(r"^\s+(\d+) (.+?)\s+(\w+)\s+\[([\d, ]+)\] offset (\d+) size (\d+)$")
HEAD_RE = re.compile(r"^GGUF version (\d+), (\d+) bytes, alignment (\d+), data at (\d+)$")


def dump(path):
    p = subprocess.run([str(tool("gguf-dump")), str(path)], capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def parse_dump(out):
    lines = out.splitlines()
    m = HEAD_RE.match(lines[0])
    assert m, lines[0]
    head = dict(zip(("version", "size", "alignment", "data_offset"), map(int, m.groups())))
    kvs, tensors = {}, []
    for line in lines[1:]:
        if m := KV_RE.match(line):
            kvs[m.group(1)] = (m.group(2), m.group(3))
        elif m := TENSOR_RE.match(line):
            i, name, typ, shape, off, size = m.groups()
            assert int(i) == len(tensors)
            tensors.append((name, typ, [int(x) for x in shape.split(", ")], int(off), int(size)))
    return head, kvs, tensors


def check_against_reader(path):
    """Everything gguf-dump prints agrees with gguf-py's reader of the same file."""
    rc, out, err = dump(path)
    assert rc == 0, err
    head, kvs, tensors = parse_dump(out)
    r = gguf.GGUFReader(str(path))
    assert head["version"] == int(r.fields["GGUF.version"].contents())
    assert head["size"] == path.stat().st_size
    assert head["alignment"] == r.alignment
    assert head["data_offset"] == r.data_offset

    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(kvs) == list(fields)
    for key, f in fields.items():
        typ, text = kvs[key]
        assert typ == VTYPE[f.types[0]], key
        val = f.contents()
        if f.types[0] == V.ARRAY and f.types[1] == V.ARRAY:
            # gguf-py flattens nested arrays: only the element type is comparable
            assert text.startswith("[array x "), (key, text)
        elif f.types[0] == V.ARRAY:
            assert text.startswith(f"[{VTYPE[f.types[1]]} x {len(val)}]"), (key, text)
        elif f.types[0] == V.STRING:
            if val.isascii() and val.isprintable() and '"' not in val and "\\" not in val and len(val) <= 120:
                assert text == f'"{val}"', key
        elif f.types[0] == V.BOOL:
            assert text == ("true" if val else "false"), key
        elif f.types[0] in (V.FLOAT32, V.FLOAT64):
            assert float(text) == pytest.approx(float(val), rel=1e-7), key
        else:
            assert int(text) == int(val), key

    assert len(tensors) == len(r.tensors)
    for (name, typ, shape, off, size), t in zip(tensors, r.tensors):
        assert name == t.name
        assert typ == t.tensor_type.name.lower()
        assert shape == [int(x) for x in t.shape]
        assert r.data_offset + off == t.data_offset
        assert size == t.n_bytes
    return head, kvs, tensors


def write_every_kind(path, endian=gguf.GGUFEndian.LITTLE, alignment=None):
    """A file with every value type, nested arrays and one tensor of each supported layout."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch="llama", endianess=endian)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.125)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "plain text")
    w.add_string("t.utf8", "héllo \"quoted\"\n")
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", -1e300)
    w.add_array("a.str", ["x", "", "yz", "é"])
    w.add_array("a.i32", [1, -2, 3])
    w.add_array("a.f32", [0.5, -0.25])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_array("a.nested_str", [["p", "qq"], ["r"]])
    w.add_tensor("f32", rng.standard_normal((3, 32), dtype=np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 16)).astype(np.float16))
    for t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16):
        w.add_tensor(t.name.lower(), gguf.quants.quantize(rng.standard_normal((2, 64), dtype=np.float32), t), raw_dtype=t)
    for t in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # gguf-py cannot quantize these: raw blocks
        _, tsize = gguf.GGML_QUANT_SIZES[t]
        w.add_tensor(t.name.lower(), rng.integers(0, 256, (2, tsize), dtype=np.uint8), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64, 1])
def test_generated_file_matches_reader(tmp_path, alignment):
    path = tmp_path / "every.gguf"
    write_every_kind(path, alignment=alignment)
    head, kvs, tensors = check_against_reader(path)
    assert head["alignment"] == (alignment or 32)
    assert kvs["t.utf8"] == ("string", '"héllo \\"quoted\\"\\n"')
    assert kvs["a.nested"][1] == "[array x 2] [[i32 x 2] [1, 2], [i32 x 1] [3]]"
    assert kvs["a.nested_str"][1] == '[array x 2] [[string x 2] ["p", "qq"], [string x 1] ["r"]]'
    assert [t[1] for t in tensors] == ["f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "q4_k", "q5_k", "q6_k"]


def test_real_model_matches_reader(model_path):
    _, kvs, tensors = check_against_reader(model_path)
    assert len(tensors) == 272
    assert kvs["llama.block_count"] == ("u32", "30")


def test_vocab_files_match_reader(vocab_dir):
    files = sorted(vocab_dir.glob("*.gguf"))
    assert files
    for f in files:
        check_against_reader(f)


def test_big_endian_file_refused(tmp_path):
    path = tmp_path / "be.gguf"
    write_every_kind(path, endian=gguf.GGUFEndian.BIG)
    rc, out, err = dump(path)
    assert rc == 1
    assert "big-endian/byte-swapped GGUF not supported" in err
    assert out == ""


@pytest.mark.parametrize(
    "offset,fmt,value,message",
    [
        (0, "<4s", b"GGML", "bad magic"),
        (4, "<I", 1, "version 1 is not supported"),
        (8, "<Q", 2**64 - 1, "n_tensors 18446744073709551615 exceeds what a"),
        (16, "<Q", 2**63 - 1, "n_kv 9223372036854775807 exceeds what a"),
        (24, "<Q", 2**40, "key 0 of 19: key length 1099511627776 runs past end of file"),
    ],
)
def test_corrupt_file_refused(tmp_path, offset, fmt, value, message):
    path = tmp_path / "bad.gguf"
    write_every_kind(path)
    b = bytearray(path.read_bytes())
    struct.pack_into(fmt, b, offset, value)
    path.write_bytes(bytes(b))
    rc, out, err = dump(path)
    assert rc == 1
    assert err.startswith(f"{path}: gguf: ")
    assert message in err
    assert err.count("\n") == 1  # one line


def test_truncated_file_refused(tmp_path):
    path = tmp_path / "every.gguf"
    write_every_kind(path)
    full = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in (1, 23, 100, len(full) // 2, len(full) - 100):  # the writer pads the end
        cut.write_bytes(full[:n])
        rc, _, err = dump(cut)
        assert rc == 1, n
        assert "gguf: " in err and ("truncated" in err or "past end" in err or "exceeds" in err), err


def test_not_a_regular_file(tmp_path):
    rc, _, err = dump(tmp_path)
    assert rc == 1 and "is a directory, not a regular file" in err
    rc, _, err = dump("/dev/null")
    assert rc == 1 and "is a character device, not a regular file" in err
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    rc, _, err = dump(empty)
    assert rc == 1 and "is an empty file" in err
