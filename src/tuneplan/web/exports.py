"""Folders for the page's recipe files: private to this server process, removed after an hour.

On a shared machine a fixed path in the temp directory (``/tmp/tuneplan-web-export``) can be planted
beforehand by another user, as a symlink to a folder of theirs or of the victim's. So the page writes
only inside folders it made itself with ``tempfile.mkdtemp`` (a fresh name, mode 0700, created
atomically: never an existing path, never through a link): one root per server process and one folder
per export inside it. Cleaning removes only folders this process made and recorded, when they are older
than ``KEEP_S``, and the whole root when the process exits; it never walks a shared directory.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import time
from pathlib import Path

KEEP_S = 3600.0  # a download link stays valid this long; Gradio copies the files when it answers

_lock = threading.Lock()
_root: Path | None = None
_made: dict[Path, float] = {}  # folder -> when it was made (time.monotonic)


def export_root() -> Path:
    """This process's own folder for exports (made on first use, removed at exit)."""
    global _root
    with _lock:
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="tuneplan-web-"))
            atexit.register(shutil.rmtree, _root, True)
        return _root


def fresh_folder() -> Path:
    """A new empty folder for one export; folders older than ``KEEP_S`` made here are removed first."""
    sweep()
    folder = Path(tempfile.mkdtemp(prefix="recipe-", dir=export_root()))
    with _lock:
        _made[folder] = time.monotonic()
    return folder


def sweep(now: float | None = None) -> list[Path]:
    """Remove the folders this process made more than ``KEEP_S`` ago; returns them."""
    now = time.monotonic() if now is None else now
    with _lock:
        old = [d for d, t in _made.items() if now - t > KEEP_S]
        for d in old:
            del _made[d]
    for d in old:
        # rmtree does not follow a symlink found inside the folder (it unlinks the link itself)
        shutil.rmtree(d, ignore_errors=True)
    return old


def made() -> list[Path]:
    """The export folders this process has made and not yet removed."""
    with _lock:
        return list(_made)
