"""The accelerator catalog shipped with the package (``accelerators.json``, built by
``tools/build_accelerators.py``), read once per process."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from tuneplan.specs.hardware import Accelerator


@lru_cache(maxsize=1)
def shipped_cards() -> dict[str, Accelerator]:
    """The package's cards by id; callers copy before changing the mapping."""
    text = resources.files("tuneplan.catalog").joinpath("accelerators.json").read_text(encoding="utf-8")
    return {d["id"]: Accelerator.from_dict(d) for d in json.loads(text)}
