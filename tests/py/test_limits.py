"""test_limits.py - the real nxd keeps the limits docs/protocol.md documents, at the value and one past it."""
import pytest

from nxd_helpers import Client, Daemon



@pytest.fixture(scope="module")
def daemon(model_path, tmp_path_factory):
    d = Daemon(model_path, tmp_path_factory.mktemp("nxd"), workers=2, args=["--ctx", "512", "--slots", "2"])
    with d:
        yield d


def test_stop_string_of_256_bytes(daemon):
    """A stop string of the documented maximum (256 bytes) is held back and
    matched across tokens; 257 bytes is out of range."""
    greedy = dict(prompt="Write a long story about a lighthouse keeper.", temperature=0, max_tokens=160,
                  ignore_eos=True)
    with Client(daemon.sock) as c:
        _, text, done = c.generate(rid=1, **greedy)
        assert done["event"] == "done", done
        raw = text.encode()
        assert len(raw) >= 40 + 256, text
        def boundary(i):
            return i == len(raw) or (raw[i] & 0xC0) != 0x80
        # whole characters: the protocol takes UTF-8 strings only
        start = next(i for i in range(40, len(raw) - 255) if boundary(i) and boundary(i + 256))
        stop = raw[start:start + 256]
        _, cut, done = c.generate(rid=2, stop=[stop.decode()], **greedy)
        assert done["event"] == "done" and done["reason"] == "stop", done
        assert cut.encode() == raw[:start]
        ev = c.request({"op": "generate", "id": 3, "prompt": "x", "stop": ["s" * 257]})
        assert ev["event"] == "error" and ev["code"] == "out_of_range", ev
        assert ev["message"] == "field 'stop[0]' must be 1..256 bytes long, got 257", ev
