"""tuneplan's web page (optional extra ``web``: ``pip install tuneplan[web]``).

``tuneplan.web.app`` is the page, a ``gradio.Blocks`` built on first access (so ``import tuneplan.web``
stays free of gradio): deploy it as a Hugging Face Space (``from tuneplan.web import app; app.launch()``)
or run ``tuneplan serve``. The page's answers come from the same core as the CLI.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

__all__ = ["app", "build_app", "launch"]

_APP: Any = None


def require_gradio() -> None:
    """Raise a TuneplanError saying how to install the extra when gradio cannot be imported."""
    # Set before gradio reads them (a user's own values win). A local tool sends no usage reports.
    # Gradio 6 re-summarises up to 10,000 past events with pandas after every event for its
    # monitoring view (queueing.py, GRADIO_ANALYTICS_CACHE_FREQUENCY=1): measured here 2 ms of CPU
    # per event at 100 past events, 14 ms at 10,000 (benchmarks/web_load.md); summarise rarely.
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
    try:
        import gradio  # noqa: F401
    except ImportError as exc:
        from tuneplan.errors import TuneplanError

        raise TuneplanError(f"the web page needs gradio, which cannot be imported ({exc})", field="web",
                            accepted="pip install 'tuneplan[web]'") from None


def build_app() -> Any:
    """A new page (``gradio.Blocks``), not launched."""
    require_gradio()
    from tuneplan.web.page import build_app as build

    return build()


def launch(host: str = "127.0.0.1", port: int | None = 7860, *, block: bool = True,
           quiet: bool = False) -> Any:
    """Serve the page on ``host:port`` (loopback by default). Returns the Blocks once started.

    Sized for a small server that strangers may reach (``tuneplan.web.limits``): at most SESSIONS_MAX
    sessions kept in memory (the oldest go first), at most QUEUE_MAX requests waiting, uploads at most
    PASTE_MAX_BYTES, request bodies at most ``http.BODY_MAX_BYTES``, security headers on every response
    (``tuneplan.web.http``), and Gradio's temporary files in a folder of this process's own.
    """
    import shutil
    import tempfile

    from tuneplan.web import limits
    from tuneplan.web.http import middleware
    from tuneplan.web.page import gradio_major, theme

    if "GRADIO_TEMP_DIR" not in os.environ:  # not the shared /tmp/gradio another user may have planted
        os.environ["GRADIO_TEMP_DIR"] = own = tempfile.mkdtemp(prefix="tuneplan-web-gradio-")
        atexit.register(shutil.rmtree, own, True)
    demo = build_app()
    demo.queue(default_concurrency_limit=limits.WORKERS, max_size=limits.QUEUE_MAX)
    kw: dict[str, Any] = {"server_name": host, "server_port": port, "prevent_thread_lock": not block,
                          "quiet": quiet, "show_error": False, "state_session_capacity": limits.SESSIONS_MAX,
                          "max_file_size": limits.PASTE_MAX_BYTES, "app_kwargs": {"middleware": middleware()}}
    if gradio_major() >= 6:
        kw["theme"] = theme()
    demo.launch(**kw)
    return demo


def __getattr__(name: str) -> Any:
    global _APP
    if name == "app":
        if _APP is None:
            _APP = build_app()
        return _APP
    raise AttributeError(name)
