"""The user's tuneplan config folder and the hardware file found there.

``$TUNEPLAN_CONFIG_DIR`` when set, else ``$XDG_CONFIG_HOME/tuneplan`` or ``~/.config/tuneplan``; the
hardware file in it is ``hardware.toml``, ``hardware.yaml`` or ``hardware.yml``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from tuneplan.catalog.hardware_file import load_hardware_file
from tuneplan.env_read import env
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator

HARDWARE_FILE_NAMES = ("hardware.toml", "hardware.yaml", "hardware.yml")


def hardware_file_candidates() -> list[str]:
    """Where the user's hardware file may be, in the order looked at (:func:`user_hardware_file`).

    ``$TUNEPLAN_CONFIG_DIR`` wins when set (and is the only place looked at, so tests and CI can point
    it at an empty directory); otherwise ``$XDG_CONFIG_HOME/tuneplan`` or ``~/.config/tuneplan``.
    """
    return list(_candidates(env("TUNEPLAN_CONFIG_DIR"), env("XDG_CONFIG_HOME"), env("HOME")))


@lru_cache(maxsize=8)
def _candidates(config_dir: str | None, xdg: str | None, home: str | None) -> tuple[str, ...]:
    """:func:`hardware_file_candidates` for these environment values (``~`` is ``$HOME``)."""
    d = config_dir or os.path.join(xdg or os.path.join(os.path.expanduser("~"), ".config"), "tuneplan")
    return tuple(os.path.join(d, n) for n in HARDWARE_FILE_NAMES)


def user_hardware_file() -> Path | None:
    """The user's hardware file from the config directory, if one exists
    (:func:`hardware_file_candidates`)."""
    for p in hardware_file_candidates():
        if os.path.isfile(p):
            return Path(p)
    return None


def config_dir() -> Path:
    """The user's tuneplan config directory: ``$TUNEPLAN_CONFIG_DIR`` when set, else
    ``$XDG_CONFIG_HOME/tuneplan`` or ``~/.config/tuneplan`` (it may not exist)."""
    env = os.environ
    return Path(env.get("TUNEPLAN_CONFIG_DIR") or os.path.join(
        env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "tuneplan"))


def config_folder_cards() -> dict[str, Accelerator]:
    """The cards of the config folder's hardware file; a file that cannot be used is a warning naming it
    and its problem, and its cards are left out: a file the user did not name on this command line must
    not break every command (``--hardware-file`` given explicitly stays an error, exit 2)."""
    user = user_hardware_file()
    if user is None:
        return {}
    try:
        return load_hardware_file(user)
    except TuneplanError as exc:
        import warnings

        # stacklevel 3: the warning points at the caller of catalog.accelerators.accelerators()
        warnings.warn(f"the hardware file of the config folder is ignored: {exc.message}"
                      + (f" (accepted: {exc.accepted})" if exc.accepted else ""), stacklevel=3)
        return {}
