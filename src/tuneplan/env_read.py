"""Environment variables read on an estimate's hot path.

``os.environ.get`` encodes the name, looks it up and decodes the value on every call, and a name that is
not set costs a raised and caught ``KeyError`` (about 0.6 us; 0.2 us for one that is set). An estimate
reads up to eight of them (the calibration store's path, the config folder's hardware files, the hub
settings of a model name) to notice a change the user made between two calls, which measured about 3 us
of a repeated ``tuneplan.estimate()`` (benchmarks/estimator_speed.py). On POSIX ``os.environ`` keeps its
values in a dict of bytes (``os.environ._data``, which every ``os.environ[...] = ...``, ``del`` and
``monkeypatch.setenv`` updates), so :func:`env` reads that dict directly with the name encoded once and
the value decoded as ``os.environ`` decodes it (``os.fsdecode``): the same answer, at each call, in a
tenth of the time. Elsewhere (Windows keys its dict by upper-cased ``str``) it is ``os.environ.get``.
"""

from __future__ import annotations

import os

_ENVIRON = os.environ
_RAW: dict[bytes, bytes] | None = (getattr(_ENVIRON, "_data", None)
                                   if os.name == "posix" and os.supports_bytes_environ else None)
if not isinstance(_RAW, dict):
    _RAW = None
_KEYS: dict[str, bytes] = {}


def env(name: str) -> str | None:
    """``os.environ.get(name)``, read now (never kept: a change between two calls is seen). A mapping put
    in place of ``os.environ`` (a test's patch) is read through its own ``get``."""
    environ = os.environ
    raw = _RAW
    if raw is None or environ is not _ENVIRON:
        return environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = os.fsencode(name)
    value = raw.get(key)
    return None if value is None else os.fsdecode(value)

_STAMP_KEYS: dict[tuple[str, ...], tuple[bytes, ...]] = {}


def env_stamp(names: tuple[str, ...]) -> tuple[bytes | str | None, ...]:
    """A key that changes whenever one of ``names``' values does, read now: their raw values as
    ``os.environ`` holds them (bytes on POSIX, not decoded; :func:`env`'s fallback elsewhere). What is
    derived from those variables alone (a path) can be kept per stamp: equal stamps are equal values, and
    the stamp costs a dict look-up per name, with no decoding."""
    environ = os.environ
    raw = _RAW
    if raw is None or environ is not _ENVIRON:
        return tuple(map(environ.get, names))
    keys = _STAMP_KEYS.get(names)
    if keys is None:
        keys = _STAMP_KEYS[names] = tuple(map(os.fsencode, names))
    return tuple(map(raw.get, keys))
