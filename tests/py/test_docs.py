"""test_docs.py - the man pages and etc/nxd.conf say what --help says: every option of nxd and nxctl, with its default.

--help is generated from the code's own tables and strings, so it is the
reference: each option it lists must be in nxd(8)'s SYNOPSIS and OPTIONS (or
the nxctl(1) section of its command), and a number it gives as the default
must be the number the page (and nxd.conf, for the options it lists) gives.
"""
import re
import subprocess

import pytest

from conftest import ROOT, tool

OPT = re.compile(r"^\s+(?:(-\w), )?(--[a-z][a-z0-9-]*)(?:[ =]([A-Z][^ ]*))?(?:\s+(\S.*))?$")


def help_text(*args):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def help_options(text):
    """{--name: (short or None, its help text)} from a --help, continuation lines joined."""
    opts, cur = {}, None
    for line in text.splitlines():
        m = OPT.match(line)
        if m:
            cur = m.group(2)
            opts[cur] = [m.group(1), m.group(4) or ""]
        elif cur and line.startswith("      ") and line.strip():
            opts[cur][1] += " " + line.strip()
        else:
            cur = None
    return {k: tuple(v) for k, v in opts.items()}


def default_of(text):
    """The number given as the default in a help or man text, or None."""
    m = re.search(r"\bdefault:? (\d[\d.]*\d|\d)\b", text)
    return m.group(1) if m else None


def roff_text(s):
    """Roff source as plain enough text: -- for \\-\\-, no font changes or quotes."""
    s = s.replace("\\-", "-").replace("\\(dq", '"').replace("\\~", " ")
    s = re.sub(r"\\f[BIRP]", "", s)
    return s.replace('"', "")


def sections(page, level):
    """{title: body} of the .SH (level "SH") or .SS sections of a roff page."""
    out, title = {}, None
    for line in page.splitlines():
        m = re.match(rf"^\.{level} (.*)$", line)
        if m:
            title = roff_text(m.group(1)).strip()
            out[title] = ""
        elif line.startswith(".SH") and level == "SS":
            title = None
        elif title is not None:
            out[title] += line + "\n"
    return out


def man_entries(body):
    """[(header line, text)] of the .TP entries of a section."""
    parts = re.split(r"^\.TP\n", body, flags=re.M)[1:]
    out = []
    for p in parts:
        head, _, text = p.partition("\n")
        out.append((roff_text(head), roff_text(text)))
    return out


def names(line):
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][a-z0-9-]*)", line))


def entry_for(entries, opt):
    for head, text in entries:
        if opt in names(head):
            return head, text
    return None


def check_options(opts, entries, where):
    missing, wrong = [], []
    for opt, (short, text) in opts.items():
        e = entry_for(entries, opt)
        if e is None:
            missing.append(opt)
            continue
        if short and short not in names(e[0]):
            wrong.append(f"{opt}: {short} not in the entry {e[0]!r}")
        d = default_of(text)
        if d is not None and not re.search(rf"\bdefault:? {re.escape(d)}\b", e[1]):
            wrong.append(f"{opt}: --help says default {d}, {where} says {default_of(e[1])!r}: {e[1][:200]!r}")
    assert not missing, f"options of --help missing from {where}: {missing}"
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- nxd

@pytest.fixture(scope="module")
def nxd_opts():
    opts = help_options(help_text(str(tool("nxd")), "--help"))
    assert len(opts) > 20 and "--model" in opts and opts["--model"][0] == "-m", opts
    return opts


def test_nxd_man_page_has_every_option_and_default(nxd_opts):
    page = (ROOT / "docs/nxd.8").read_text()
    sh = sections(page, "SH")
    synopsis = names(roff_text(sh["SYNOPSIS"]))
    lost = [o for o, (short, _) in nxd_opts.items() if o not in synopsis or (short and short not in synopsis)]
    assert not lost, f"nxd(8) SYNOPSIS lacks {lost}"
    check_options(nxd_opts, man_entries(sh["OPTIONS"]), "nxd(8) OPTIONS")


def test_nxd_conf_agrees_with_help(nxd_opts):
    conf = (ROOT / "etc/nxd.conf").read_text()
    listed = re.findall(r"^#\s+(--[a-z][a-z0-9-]*)\b(.*)$", conf, re.M)
    assert len(listed) >= 10
    for opt, text in listed:
        assert opt in nxd_opts, f"etc/nxd.conf lists {opt}, which nxd --help does not know"
        d, want = default_of(text), default_of(nxd_opts[opt][1])
        if d is not None or want is not None:
            assert d == want, f"etc/nxd.conf gives {opt}'s default as {d}, nxd --help as {want}"
    args = re.search(r"^NXD_ARGS=(.*)$", conf, re.M).group(1)
    # the service's workers are the CPUs it may use, as nxd's own default
    assert "--workers" not in args, args


# ---------------------------------------------------------------- nxctl

@pytest.fixture(scope="module")
def nxctl_help():
    return help_text(str(tool("nxctl")), "--help")


def nxctl_commands(text):
    block = text.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in block.splitlines()]


def test_nxctl_man_page_has_every_command_option_and_default(nxctl_help):
    page = (ROOT / "docs/nxctl.1").read_text()
    sh, ss = sections(page, "SH"), sections(page, "SS")
    cmds = nxctl_commands(nxctl_help)
    assert "chat" in cmds and "lora-fold" in cmds
    synopsis = roff_text(sh["SYNOPSIS"])
    for cmd in cmds:
        assert re.search(rf"^\.B {re.escape(cmd)}$", synopsis, re.M), f"nxctl(1) SYNOPSIS lacks {cmd}"
        assert cmd in ss, f"nxctl(1) has no section for {cmd}"
        opts = help_options(help_text(str(tool("nxctl")), cmd, "--help"))
        opts.pop("--help", None)
        entries = man_entries(ss[cmd])
        if cmd == "chat":  # "Takes the sampling options of generate"
            entries += man_entries(ss["generate"])
        check_options(opts, entries, f"nxctl(1) {cmd}")
    check_options(help_options(nxctl_help), man_entries(sh["OPTIONS"]), "nxctl(1) OPTIONS")


def test_nxctl_files_agree_with_the_socket_rule(nxctl_help):
    """--help: $XDG_RUNTIME_DIR/nxd.sock when it exists, else /run/nxd/nxd.sock; FILES says the same."""
    assert "when it exists, else /run/nxd/nxd.sock" in " ".join(nxctl_help.split())
    files = roff_text(sections((ROOT / "docs/nxctl.1").read_text(), "SH")["FILES"])
    sock = files.split("/run/nxd/nxd.sock", 1)[1].split(".TP", 1)[0]
    assert "default only for root" not in sock
    assert "XDG_RUNTIME_DIR/nxd.sock" in sock and "exists" in sock, sock
