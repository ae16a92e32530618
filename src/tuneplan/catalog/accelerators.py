"""The accelerators a command sees, and the one entry point that resolves a card name.

The shipped catalog (``shipped.py``), then the config folder's hardware file (``config_folder.py``),
then a file or mapping the command names (``hardware_file.py``); a loose name resolves over them all
(``card_names.py``). The faces import what they use from here: the names of those modules and of
``cloud_hosts.py`` are re-exported.
"""

from __future__ import annotations

import os
from dataclasses import fields

from tuneplan.catalog.card_names import ALIASES, VARIANT_WORDS, resolve_named_in
from tuneplan.catalog.card_names import memory_families as _memory_families
from tuneplan.catalog.cloud_hosts import HOST_DEFAULT_MIN_GIB, HOST_DEFAULT_TEXT, cloud_host
from tuneplan.catalog.config_folder import (
    HARDWARE_FILE_NAMES,
    config_dir,
    config_folder_cards,
    hardware_file_candidates,
    user_hardware_file,
)
from tuneplan.catalog.hardware_file import load_hardware_file
from tuneplan.catalog.shipped import shipped_cards
from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator

__all__ = [
    "ACCELERATOR_FIELDS", "ALIASES", "HARDWARE_FILE_NAMES", "HOST_DEFAULT_MIN_GIB", "HOST_DEFAULT_TEXT",
    "VARIANT_WORDS", "accelerators", "catalog_accelerators", "cloud_host", "config_dir",
    "hardware_file_candidates", "load_hardware_file", "memory_families", "resolve_accelerator",
    "resolve_named", "user_hardware_file",
]

ACCELERATOR_FIELDS = tuple(f.name for f in fields(Accelerator))

Extra = dict[str, Accelerator] | str | os.PathLike[str] | None


def catalog_accelerators() -> dict[str, Accelerator]:
    """The shipped catalog only (no user files)."""
    return dict(shipped_cards())


def accelerators(extra: Extra = None) -> dict[str, Accelerator]:
    """Catalog + the user's config-dir hardware file + ``extra`` (a dict, or a hardware file path)."""
    cat = dict(shipped_cards())
    cat.update(config_folder_cards())
    if extra:
        cat.update(extra if isinstance(extra, dict) else load_hardware_file(extra))
    return cat


def memory_families() -> dict[str, list[str]]:
    """The card models the shipped catalog sells in several memory sizes (a bare name is refused), with
    their card ids: ``{"v100": ["v100-pcie-16gb", ...], "a100": [...]}``."""
    return _memory_families(shipped_cards())


def resolve_accelerator(name: str, extra: Extra = None) -> Accelerator:
    """A catalog (or user) accelerator from a loose name; ``extra`` adds cards (dict or hardware file)."""
    return resolve_named(name, extra)[0]


def resolve_named(name: str, extra: Extra = None) -> tuple[Accelerator, str | None]:
    """:func:`resolve_accelerator` and the choice a face prints beside the card when ``name`` also names
    other boards of the same memory ("a100-80gb read as a100-80gb-sxm4, not a100-80gb-pcie"), else
    None."""
    if not isinstance(name, str) or not name.strip():
        raise TuneplanError("empty accelerator name", field="gpu",
                            accepted="a catalog id, e.g. rtx-4090, a100-80gb")
    return resolve_named_in(name, accelerators(extra))
