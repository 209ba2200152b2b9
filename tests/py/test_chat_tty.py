"""test_chat_tty.py - nxctl chat as a person uses it: a real terminal (tmux), the real nxd, keys typed and the screen read.

tmux runs nxctl in a pane (send-keys types, capture-pane reads what the
terminal shows), so line editing, history, multi-line input, Ctrl-C and
Ctrl-D are those of a real terminal, and the daemon is the real one on a
small context so that a conversation outgrows it in a few turns.
"""
import shlex
import shutil
import subprocess
import time

import pytest

from conftest import build_dir
from nxd_helpers import Daemon

pytestmark = pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed (scripts/deps installs it)")

CTX = 256


@pytest.fixture(scope="module")
def daemon(model_path, tmp_path_factory):
    with Daemon(model_path, tmp_path_factory.mktemp("chat"), workers=2, args=["--ctx", str(CTX), "--slots", "2"]) as d:
        yield d


class Pane:
    """One tmux server of its own (never the user's), one pane running cmd."""

    def __init__(self, tmp_path, cmd, env, lang="C.UTF-8"):
        self.sock = str(tmp_path / f"tmux{time.monotonic_ns()}.sock")
        envs = " ".join(f"{k}={v}" for k, v in env.items())
        locale = f"LANG={lang}" if lang else "-u LANG -u LC_ALL -u LC_CTYPE"
        # the exit status stays on the screen; sleep keeps the pane open to read it
        shell = f"env {locale} {envs} {cmd}; echo EXIT=$?; sleep 60"
        assert self.tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", "t", shell).returncode == 0

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.sock, "-f", "/dev/null"] + list(args), capture_output=True,
                              text=True, timeout=10)

    def type(self, text):
        self.tmux("send-keys", "-t", "t", "-l", text)

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "t", *keys)

    def screen(self):
        """Everything the pane showed, scrollback included, wrapped lines joined."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t").stdout

    def wait(self, pred, timeout=60, what=""):
        end = time.time() + timeout
        while time.time() < end:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.1)
        raise AssertionError(f"not on the screen after {timeout} s: {what}\n{self.screen()}")

    def wait_for(self, text, count=1, timeout=60):
        return self.wait(lambda s: s.count(text) >= count, timeout, repr(text))

    def prompts(self, n, timeout=60):
        """Waits for the n-th "> " prompt line: the answer before it is complete."""
        return self.wait(lambda s: sum(1 for l in s.splitlines() if l.startswith(">")) >= n, timeout,
                         f"{n} prompts")

    def close(self):
        self.tmux("kill-server")


@pytest.fixture
def chat(daemon, tmp_path):
    panes = []

    def start(*args, state=None, lang="C.UTF-8"):
        env = {"XDG_STATE_HOME": state or tmp_path / "state", "NXD_SOCKET": daemon.sock}
        p = Pane(tmp_path, shlex.join([str(build_dir() / "nxctl"), "chat"] + list(args)), env, lang)
        panes.append(p)
        p.prompts(1, timeout=15)
        return p

    yield start
    for p in panes:
        p.close()


def test_history_and_editing(chat, tmp_path):
    """The history outlives the session (in $XDG_STATE_HOME/nxctl/history); Up recalls a line, the
    arrows and Home/End edit it instead of printing ^[[A."""
    p = chat("-t", "0", "-n", "8")
    p.type("Name a colour.")
    p.keys("Enter")
    p.prompts(2)
    p.keys("C-d")
    p.wait_for("EXIT=0")
    hist = (tmp_path / "state" / "nxctl" / "history").read_text()
    assert "Name\\040a\\040colour." in hist, hist
    assert oct((tmp_path / "state" / "nxctl" / "history").stat().st_mode & 0o777) == "0o600"

    p = chat("-t", "0", "-n", "8")
    p.keys("Up")
    p.wait_for("> Name a colour.")
    p.keys("Home")
    p.type("Please ")
    p.keys("End", "BSpace")
    p.type("!")
    p.keys("Left")
    p.type("s")
    p.keys("Enter")
    s = p.prompts(2)
    assert "> Please Name a colours!" in s, s
    assert "^[" not in s and "~" not in s, s
    p.keys("C-d")
    p.wait_for("EXIT=0")
    assert "Please\\040Name\\040a\\040colours!" in (tmp_path / "state" / "nxctl" / "history").read_text()


@pytest.mark.parametrize("lang", [None, "C", "xx_XX.UTF-8"])  # none, the C locale, one not installed
def test_non_ascii_input_without_a_utf8_locale(chat, lang):
    """In a terminal without a UTF-8 locale (a container, an ssh session) the line is still edited as
    UTF-8 characters: libedit in the C locale dropped or repeated the bytes of every non-ASCII one."""
    p = chat("-t", "0", "-n", "4", lang=lang)
    p.type("Straße café 東京")
    p.keys("Left", "BSpace")  # one character, not one byte
    p.keys("Enter")
    s = p.prompts(2)
    assert "> Straße café 京" in s, s
    p.keys("C-d")
    p.wait_for("EXIT=0")


def test_multiline_and_commands(chat):
    """A \"\"\" block is one message; /help and /stats answer in nxctl; /bye leaves."""
    p = chat("-t", "0", "-n", "8")
    p.type('"""Repeat these two words:')
    p.keys("Enter")
    p.wait_for("... ")
    p.type('apple banana"""')
    p.keys("Enter")
    s = p.prompts(2)
    time.sleep(0.5)
    lines = p.screen().splitlines()
    # both lines went as one message: one answer, then the next prompt
    assert lines[1] == '... apple banana"""' and sum(1 for l in lines if l.startswith(">")) == 2, lines
    p.type("/help")
    p.keys("Enter")
    p.wait_for("/lora [NAME[:SCALE]...|off]")
    p.type("/stats")
    p.keys("Enter")
    s = p.wait_for("tokens/s")
    assert "answer:  " in s and "prompt:  " in s and "seed:    " in s, s
    p.type("/bye")
    p.keys("Enter")
    s = p.wait_for("EXIT=0")
    assert "unknown command" not in s


def test_ctrl_c_cancels_the_answer_ctrl_d_leaves(chat):
    """Ctrl-C during an answer stops it and the chat goes on; Ctrl-C at the prompt drops the line;
    Ctrl-D leaves with status 0."""
    p = chat("-t", "0", "-n", "200", "--ignore-eos")
    p.type("Tell me a very long story about a lighthouse keeper.")
    p.keys("Enter")
    p.wait(lambda s: len(s.split("lighthouse keeper.", 1)[-1].strip()) > 20, what="answer streaming")
    p.keys("C-c")
    s = p.wait_for("(cancelled)")
    p.prompts(2)
    p.type("half a line")
    p.keys("C-c")
    p.wait_for("(Ctrl-D or /bye leaves)")
    p.type("Say yes.")
    p.keys("Enter")
    p.prompts(4)
    p.keys("C-d")
    s = p.wait_for("EXIT=0")
    assert "EXIT=130" not in s


def test_conversation_longer_than_the_context_goes_on(chat):
    """Past the context the oldest turns go (one dim line says so) and every turn is answered,
    none with context_overflow."""
    p = chat("-t", "0", "-n", "24", "--ignore-eos", "--system", "You are terse.")
    q = "Here is a sentence to remember, with many words in it: the quick brown fox jumps over the lazy dog, number {}."
    for i in range(6):
        p.type(q.format(i))
        p.keys("Enter")
        p.prompts(i + 2)
    p.type("/stats")
    p.keys("Enter")
    s = p.wait_for("tokens/s")
    assert "oldest turn" in s and f"dropped to fit the context of {CTX} tokens" in s, s
    assert "context_overflow" not in s and "nxctl:" not in s, s
    assert "the context of 256 tokens is full" not in s, s  # room was made before, not after
    assert "answer:  24 tokens" in s, s
    prompt_tokens = int(s.split("prompt:  ")[-1].split()[0])
    assert prompt_tokens + 24 <= CTX
    p.keys("C-d")
    p.wait_for("EXIT=0")


def test_chat_lives_through_a_daemon_restart(model_path, tmp_path):
    """nxd restarted between two turns: the next message connects again and the conversation, which
    nxctl holds, goes on (it used to end the chat with 'Broken pipe')."""
    d = Daemon(model_path, tmp_path, workers=1, args=["--ctx", str(CTX), "--slots", "1"]).start()
    p = Pane(tmp_path, shlex.join([str(build_dir() / "nxctl"), "chat", "-t", "0", "-n", "4"]),
             {"XDG_STATE_HOME": tmp_path / "state", "NXD_SOCKET": d.sock})
    try:
        p.prompts(1, timeout=15)
        p.type("Name a colour.")
        p.keys("Enter")
        p.prompts(2)
        d.stop()
        d = Daemon(model_path, tmp_path, workers=1, args=["--ctx", str(CTX), "--slots", "1"]).start()
        p.type("And another.")
        p.keys("Enter")
        s = p.prompts(3)
        assert "(connected to nxd again)" in s and "cannot send" not in s, s
        # the second turn carried the first: its prompt holds both questions and the first answer
        p.type("/stats")
        p.keys("Enter")
        s = p.wait_for("tokens/s")
        p.keys("C-d")
        p.wait_for("EXIT=0")
    finally:
        p.close()
        d.stop()
