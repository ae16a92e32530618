"""Folders for the page's recipe files: one per session, private to this server process.

On a shared machine a fixed path in the temp directory (``/tmp/tuneplan-web-export``) can be planted
beforehand by another user, as a symlink to a folder of theirs or of the victim's. So the page writes
only inside folders it made itself with ``tempfile.mkdtemp`` (a fresh name, mode 0700, created
atomically: never an existing path, never through a link): one root per server process, in it one
folder per browser session, and in that one new folder per export. A session's folder goes when its
tab closes (``end_session``, wired to Gradio's ``unload``); anything this process made and has not used
for ``KEEP_S`` goes at the next export (API callers never close a tab); the root goes at exit. Cleaning
removes only folders recorded here as made by this process; it never walks a shared directory. The
session id comes from the client and is only ever a dictionary key, never part of a path.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

KEEP_S = 3600.0  # a download link stays valid this long; Gradio copies the files when it answers

_lock = threading.Lock()
_root: Path | None = None
_made: dict[Path, float] = {}  # folder -> when it was made or last used (time.monotonic)
_sessions: dict[str, Path] = {}  # Gradio session id -> its folder


def export_root() -> Path:
    """This process's own folder for exports (made on first use, removed at exit)."""
    global _root
    with _lock:
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="tuneplan-web-"))
            atexit.register(shutil.rmtree, _root, True)
        return _root


def current_session() -> str | None:
    """The Gradio session of the request being answered (None outside a request)."""
    if "gradio" not in sys.modules:  # not served by Gradio: no request to belong to (and no import)
        return None
    from gradio.context import LocalContext

    request = LocalContext.request.get(None)
    session = getattr(request, "session_hash", None)
    return session if isinstance(session, str) and session else None


def _session_folder(session: str | None) -> Path:
    root = export_root()
    if session is None:
        return root
    with _lock:
        folder = _sessions.get(session)
        if folder is None:
            folder = _sessions[session] = Path(tempfile.mkdtemp(prefix="session-", dir=root))
        _made[folder] = time.monotonic()  # last used
        return folder


def fresh_folder(session: str | None = None) -> Path:
    """A new empty folder for one export, inside the session's own; stale folders are removed first.

    ``session`` defaults to the Gradio session of the request being answered.
    """
    sweep()
    parent = _session_folder(session or current_session())
    folder = Path(tempfile.mkdtemp(prefix="recipe-", dir=parent))
    with _lock:
        _made[folder] = time.monotonic()
    return folder


def end_session(session: str | None = None) -> Path | None:
    """Remove the folder of ``session`` (default: the current one) and all its exports; returns it."""
    session = session or current_session()
    with _lock:
        folder = _sessions.pop(session, None) if session else None
        if folder is not None:
            for d in [d for d in _made if d == folder or d.is_relative_to(folder)]:
                del _made[d]
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    return folder


def sweep(now: float | None = None) -> list[Path]:
    """Remove the folders this process made (or last used) more than ``KEEP_S`` ago; returns them."""
    now = time.monotonic() if now is None else now
    with _lock:
        old = [d for d, t in _made.items() if now - t > KEEP_S]
        for d in old:
            del _made[d]
        for s, d in list(_sessions.items()):
            if d in old:
                del _sessions[s]
    for d in old:
        # rmtree does not follow a symlink found inside the folder (it unlinks the link itself)
        shutil.rmtree(d, ignore_errors=True)
    return old


def made() -> list[Path]:
    """The export folders this process has made and not yet removed."""
    with _lock:
        return list(_made)
