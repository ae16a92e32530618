"""The page object and `tuneplan serve`, without a browser.

The first two tests need nothing optional: `import tuneplan` must not pull gradio in, and `serve`
without gradio must say how to install it (exit 2). The rest need the ``web`` extra.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ENV = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "GRADIO_ANALYTICS_ENABLED": "False",
       # the tuneplan under test, also where it is not the installed one
       **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}}


def py(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=ENV)


def test_import_tuneplan_and_the_cli_stay_free_of_gradio() -> None:
    r = py("import sys, tuneplan, tuneplan.web, tuneplan.web.callbacks, tuneplan.web.plans, "
           "tuneplan.cli.app\nprint('gradio' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_serve_without_gradio_says_how_to_get_it() -> None:
    # sys.modules[...] = None makes `import gradio` fail as if it were not installed.
    r = py("import sys; sys.modules['gradio'] = None\n"
           "sys.argv = ['tuneplan', 'serve', '--port', '7999']\n"
           "from tuneplan.cli.app import main; main()")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "tuneplan[web]" in r.stderr and "Traceback" not in r.stderr


def test_serve_rejects_a_bad_port() -> None:
    r = py("import sys; sys.argv = ['tuneplan', 'serve', '--port', '70000']\n"
           "from tuneplan.cli.app import main; main()")
    assert r.returncode == 2 and "port" in r.stderr and "Traceback" not in r.stderr


def test_serve_help_defaults_to_loopback() -> None:
    r = py("import sys; sys.argv = ['tuneplan', 'serve', '--help']\n"
           "from tuneplan.cli.app import main; main()")
    assert r.returncode == 0
    assert "--host" in r.stdout and "--port" in r.stdout and "127.0.0.1" in r.stdout


def test_app_is_a_lazily_built_blocks_with_named_endpoints() -> None:
    gr = pytest.importorskip("gradio", reason="the web extra is not installed")
    import tuneplan.web as web

    app = web.app
    assert isinstance(app, gr.Blocks)
    assert web.app is app  # built once
    public = {d["api_name"] for d in app.config["dependencies"]
              if d.get("api_visibility", "public") == "public"}
    assert {"estimate", "fit", "gpus", "export"} <= public


def test_app_is_sized_for_a_small_server() -> None:
    pytest.importorskip("gradio", reason="the web extra is not installed")
    import tuneplan.web as web
    from tuneplan.web import limits

    app = web.app
    state = next(b for b in app.blocks.values() if type(b).__name__ == "State")
    assert state.time_to_live == limits.SESSION_TTL_S == 3600
    assert app.delete_cache == (600, 3600)  # Gradio's copies of uploads and downloads: an hour
    upload = next(b for b in app.blocks.values() if type(b).__name__ == "UploadButton")
    assert upload.type == "binary"  # the callback gets bytes, never a path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_serves_the_page_on_loopback(tmp_path) -> None:
    pytest.importorskip("gradio", reason="the web extra is not installed")
    import httpx

    port = _free_port()
    log = (tmp_path / "serve.log").open("w")  # a file, not a pipe: a chatty server never blocks on it
    proc = subprocess.Popen([sys.executable, "-m", "tuneplan.cli.app", "serve", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert status == 200, (tmp_path / "serve.log").read_text()[-2000:] or "no answer in 90 s"
        # An upload beyond a config.json's size (512 KiB here) is refused before it is stored.
        big = httpx.post(f"http://127.0.0.1:{port}/gradio_api/upload", timeout=30,
                         files={"files": ("config.json", b" " * (600 * 1024), "application/json")})
        small = httpx.post(f"http://127.0.0.1:{port}/gradio_api/upload", timeout=30,
                           files={"files": ("config.json", b"{}", "application/json")})
        assert big.status_code == 413 and small.status_code == 200, (big.text[:200], small.text[:200])
        assert "warning" not in (tmp_path / "serve.log").read_text()  # loopback: nothing exposed
        # A second server on the same port: a message and exit 2, not a traceback.
        r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=120, env=ENV)
        assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the server closes, and exits 130 as every command does
        assert proc.wait(timeout=60) == 130
        assert "Traceback" not in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
