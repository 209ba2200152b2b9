"""test_soak.py - a short soak of the real nxd (tests/soak/soak.py, ~60 s): 40 clients on 4 slots with mixed,
cancelled, abandoned, slow, silent and malformed requests; every request ends as its kind must, nothing
leaks (supervisor fds back to the start, RssAnon of the supervisor and workers flat after the warm-up,
slots back to 0), and a reader that never reads does not slow a normal client down. `make soak` runs the
long version."""
import io
import os
import sys

import pytest

from conftest import ROOT, build_dir

sys.path.insert(0, str(ROOT / "tests" / "soak"))
import soak  # noqa: E402


def test_short_soak(model_path, tmp_path):
    nxd = build_dir() / "nxd"
    if not nxd.is_file():
        pytest.fail(f"{nxd} is missing: build it with `make B={build_dir().name}`")
    seconds = float(os.environ.get("NXD_SOAK_TEST_SECONDS", 30))
    r = soak.run(nxd, model_path, seconds=seconds, clients=40, slots=4, log_dir=tmp_path)
    out = io.StringIO()
    soak.print_report(r, out)
    print(out.getvalue())
    assert not r["failures"], out.getvalue()
    # The load really was mixed and past the slots.
    assert r["mem"]["warm"]["slots"]["used"] == 4 and r["mem"]["warm"]["slots"]["queued"] > 0, out.getvalue()
    for kind in ("short", "cancel", "abandon", "malformed", "info"):
        assert r["requests"].get(kind, 0) > 0, (kind, out.getvalue())
    assert any(k.startswith("cancel: done cancelled") for k in r["outcomes"]), out.getvalue()
