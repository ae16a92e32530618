"""Exit statuses a script can trust, from real processes: a reader that leaves early, Ctrl-C, a stdout
that cannot be written, an encoding that cannot show every character, and text a terminal would act on.

Each case runs ``python -m tuneplan`` (what the console script runs) in a fresh process, because what is
tested is the process's own behaviour: its signal, its file descriptors, its stream encoding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import TINY_LLAMA

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def tuneplan(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneplan", *args], capture_output=True, timeout=120,
                          env=env or ENV, **kw)


# ---- a reader that leaves: `tuneplan models | head -1` -------------------------------------------------
@pytest.mark.parametrize("args", [("models",), ("models", "--json"), ("accelerators",), ("--help",),
                                  ("estimate", "qwen2.5-3b", "--gpu", "l4")])
def test_a_closed_pipe_ends_the_command_quietly_with_0(args):
    """The reader closes its end before the command writes a byte: every write is EPIPE."""
    p = subprocess.Popen([sys.executable, "-m", "tuneplan", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert err == b"", err  # no "aborted", no "Exception ignored", no traceback


def test_head_reads_one_line_and_the_command_exits_0():
    """What the shell does: `tuneplan models | head -1`, the exit status of the left side."""
    out = subprocess.run(["bash", "-c", f"{sys.executable} -m tuneplan models | head -1 >/dev/null; "
                          "echo ${PIPESTATUS[0]}"], capture_output=True, text=True, timeout=120, env=ENV)
    assert out.stdout.strip() == "0" and out.stderr == ""


# ---- Ctrl-C -----------------------------------------------------------------------------------------------
BLOCKING = {  # a command whose core call is replaced by a sleep, so the signal lands while it runs
    "estimate": ("tuneplan.api", "estimate"),  # built with click directly
    "models": ("tuneplan.catalog.models", "catalog_entries"),  # built with typer
}


@pytest.mark.parametrize("command", sorted(BLOCKING))
def test_ctrl_c_is_130_in_every_command(command, tmp_path):
    module, name = BLOCKING[command]
    script = tmp_path / "blocking.py"
    script.write_text(
        "import sys, time, importlib\n"
        f"mod = importlib.import_module({module!r})\n"
        "def slow(*a, **k):\n"
        "    print('running', file=sys.stderr, flush=True)\n"
        "    time.sleep(60)\n"
        f"setattr(mod, {name!r}, slow)\n"
        "from tuneplan.cli.app import main\n"
        "main()\n")
    args = [command, "qwen2.5-3b"] if command == "estimate" else [command]
    p = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=ENV, text=True)
    assert p.stderr is not None
    assert p.stderr.readline().strip() == "running"
    p.send_signal(signal.SIGINT)
    code = p.wait(timeout=60)
    err = p.stderr.read()
    assert code == 130, err
    assert "Traceback" not in err and "Aborted" not in err and err.strip() == "interrupted"


# ---- a stdout that cannot be written --------------------------------------------------------------------
needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux /dev/full")


@needs_dev_full
@pytest.mark.parametrize("args", [("models",), ("models", "--json"), ("estimate", "qwen2.5-3b"),
                                  ("estimate", "qwen2.5-3b", "--json"), ("--help",), ("estimate", "--help")])
def test_stdout_on_a_full_disk_is_one_clear_line_and_exit_2(args):
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "tuneplan", *args], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=120, env=ENV)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "error: cannot write the output (stdout): No space left on device\n"


# ---- encodings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("args", [("estimate", "qwen2.5-3b", "--gpu", "l4"), ("models",), ("accelerators",),
                                  ("fit", "qwen2.5-0.5b", "--gpu", "t4")])
def test_text_on_a_stream_that_cannot_show_every_character_falls_back_to_ascii(encoding, args):
    out = tuneplan(*args, env={**ENV, "PYTHONIOENCODING": encoding})
    assert out.returncode in (0, 1), out.stderr.decode(errors="replace")
    assert out.stderr == b""
    text = out.stdout.decode(encoding)  # strict: raises on a byte the encoding does not have
    assert len(text.splitlines()) > 2
    if args[0] == "estimate":  # the setup line's separator: latin-1 has the middle dot, ASCII spells it
        assert ("  ·  engine analytic" if encoding == "latin-1" else "  |  engine analytic") in text


def test_the_c_locale_is_read_as_python_reads_it():
    """LANG=C: Python itself writes UTF-8 there (PEP 538 / PEP 540); the command works and exits 0."""
    env = {k: v for k, v in ENV.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING", "PYTHONUTF"))}
    out = tuneplan("estimate", "qwen2.5-3b", "--gpu", "l4", env={**env, "LANG": "C", "LC_ALL": "C"})
    assert out.returncode == 0 and out.stderr == b""
    assert "engine analytic" in out.stdout.decode("utf-8")


# ---- text a terminal would act on ------------------------------------------------------------------------
def test_escape_codes_from_a_config_never_reach_the_terminal(tmp_path):
    cfg = {**TINY_LLAMA, "model_type": "\x1b[2J\x1b]0;owned\x07llamaX\x1b[31m\u202e"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = tuneplan("estimate", str(path), "--gpu", "l4")
    both = out.stdout + out.stderr
    assert out.returncode == 0, out.stderr
    assert b"\x1b" not in both and b"\x07" not in both and "\u202e".encode() not in both
    # the warning is one line of tuneplan's own, with the text the config gave (controls removed)
    assert out.stderr.decode().startswith("warning: model_type 'llamaX' is not a known family")
    assert b"UserWarning" not in out.stderr


def test_the_sanitiser_keeps_text_and_drops_controls():
    from tuneplan.cli.render import for_terminal

    assert for_terminal("a\tb\nc é · 日本") == "a\tb\nc é · 日本"
    assert for_terminal("x\x1b[1;31my\x1b[0m z") == "xy z"
    assert for_terminal("t\x1b]0;title\x07u \x1b]8;;http://x\x1b\\v") == "tu v"
    assert for_terminal("a\x07\x08\x7f\x9b\u202e\u2066b\rc") == "abc"
    assert for_terminal("\x1b") == "" and for_terminal("\x1b[") == ""
