"""test_limits.py - the real nxd keeps the limits docs/protocol.md documents, at the value and one past it."""
import pytest

from nxd_helpers import Client, Daemon

MAX_LINE = 1 << 20  # docs/protocol.md: a request line may be at most 1 MiB, not counting the line end
STATUS = b'{"op":"status","id":1}'


@pytest.fixture(scope="module")
def daemon(model_path, tmp_path_factory):
    # the default --max-line: the documented value itself
    d = Daemon(model_path, tmp_path_factory.mktemp("nxd"), workers=2, args=["--ctx", "512", "--slots", "2"])
    with d:
        yield d


def padded(body_len, end):
    """A status request padded with spaces to body_len bytes, then the line end."""
    return STATUS + b" " * (body_len - len(STATUS)) + end


@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_line_limit_either_line_end(daemon, end):
    with Client(daemon.sock) as c:
        c.send(padded(MAX_LINE, end))
        ev = c.recv()
        assert ev["event"] == "status" and ev["id"] == 1, ev
        c.send(padded(MAX_LINE + 1, end))
        ev = c.recv()
        assert ev["event"] == "error" and ev["code"] == "too_large" and ev["id"] is None, ev
        assert "limit of 1048576 bytes" in ev["message"], ev
        # the oversized line is skipped whole; the next one is served
        ev = c.request({"op": "status", "id": "after"})
        assert ev["event"] == "status" and ev["id"] == "after", ev


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


def test_tokens_ids_and_max_tokens(daemon):
    """A tokens prompt must leave room to generate (at most n_ctx - 1 ids);
    max_tokens past n_ctx is taken as n_ctx; an id is at most 255 bytes of JSON text."""
    n_ctx = 512
    with Client(daemon.sock) as c:
        _, _, done = c.generate(rid=1, tokens=[100] * (n_ctx - 1), max_tokens=1)
        assert done["event"] == "done" and done["usage"]["prompt_tokens"] == n_ctx - 1, done
        ev = c.request({"op": "generate", "id": 2, "tokens": [100] * n_ctx})
        assert ev["event"] == "error" and ev["code"] == "context_overflow", ev
        ev = c.request({"op": "generate", "id": 3, "tokens": [100] * (n_ctx + 1)})
        assert ev["event"] == "error" and ev["code"] == "context_overflow", ev

        c.send({"op": "generate", "id": 4, "prompt": "Count:", "max_tokens": n_ctx})
        ev = c.recv()
        assert ev["event"] == "token" and ev["id"] == 4, ev
        c.send({"op": "cancel", "id": 5, "target": 4})
        assert [e["event"] for e in c.events(4)][-1] == "done"
        # past n_ctx is capped, not refused: the context ends it (reason length)
        c.send({"op": "generate", "id": 6, "tokens": [100] * (n_ctx - 3), "max_tokens": 2 ** 40,
                "ignore_eos": True, "stream": False})
        done = list(c.events(6))[-1]
        # 3 positions left, and the last token drawn needs none
        assert (done["event"], done["reason"], done["usage"]["completion_tokens"]) == ("done", "length", 4), done

        rid = "i" * 253  # 255 bytes with its quotes
        ev = c.request({"op": "status", "id": rid})
        assert ev["event"] == "status" and ev["id"] == rid, ev
        ev = c.request({"op": "status", "id": rid + "i"})
        assert ev["code"] == "out_of_range" and ev["id"] is None, ev
        assert ev["message"] == "field 'id' must be at most 255 bytes as JSON text, got 256", ev
