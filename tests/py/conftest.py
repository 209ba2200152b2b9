"""conftest.py - shared pytest helpers: where the build, the default model and the shared test data are."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Let tests import tests/py helpers (reference.py) and tests/fixtures generators (make_tiny.py).
for _p in (ROOT / "tests" / "py", ROOT / "tests" / "fixtures"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def build_dir():
    """$NX_BUILD (default "build"), relative to the repo root unless absolute."""
    b = Path(os.environ.get("NX_BUILD", "build"))
    return b if b.is_absolute() else ROOT / b


def tool(name):
    """Path of a built program, e.g. tool("nx-eval"); fails (not skips) when it was not built."""
    p = build_dir() / name
    if not p.is_file():
        pytest.fail(f"{p} is missing: build it with `make B={build_dir().name}`")
    return p


@pytest.fixture(scope="session")
def build():
    return build_dir()


@pytest.fixture(scope="session")
def model_path():
    """The default model ($NXD_MODEL, see scripts/fetch-model); skips when not set or absent."""
    m = os.environ.get("NXD_MODEL")
    if not m:
        pytest.skip("NXD_MODEL is not set (make test-py sets it from scripts/fetch-model)")
    if not Path(m).is_file():
        pytest.skip(f"NXD_MODEL={m} does not exist")
    return Path(m)


@pytest.fixture(scope="session")
def shared_data():
    """../shared/data relative to the repo root; skips when absent."""
    d = ROOT.parent / "shared" / "data"
    if not d.is_dir():
        pytest.skip(f"{d} is absent")
    return d


@pytest.fixture(scope="session")
def vocab_dir(shared_data):
    """GGUF vocab-only files with tokenizer test inputs/outputs (llama.cpp's models/ggml-vocab-*)."""
    d = shared_data / "vocab"
    if not d.is_dir():
        pytest.skip(f"{d} is absent")
    return d


# Measurements tests want to show (error bounds met, timings): printed after the run.
_REPORT = []


@pytest.fixture(scope="session")
def report():
    """report(line): adds a line to the "nx report" section printed at the end of the run."""
    return _REPORT.append


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("nx report")
        for line in _REPORT:
            terminalreporter.write_line(line)
