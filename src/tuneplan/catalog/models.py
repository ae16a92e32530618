"""The model catalog: real config.json files shipped as package data, and name resolution.

A name resolves, in order, as: a path to a local ``config.json`` or model folder; an exact Hugging Face
id in the catalog (case-insensitive); a catalog alias (``qwen2.5-7b``); an HF id fetched with
``huggingface_hub`` (config.json only, cached by the hub library). Offline or gated, the error says so
and names the nearest catalog entries.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tuneplan.errors import ConfigError, TuneplanError, UnknownNameError
from tuneplan.safe_read import user_path
from tuneplan.specs.limits import MAX_NAME_CHARS
from tuneplan.specs.model import ModelSpec, model_from_config


@dataclass(frozen=True)
class CatalogEntry:
    hf_id: str
    file: str
    aliases: tuple[str, ...]
    family: str
    params_published: int | None
    params_transformers: int | None
    config_source: str
    gated: bool
    notes: str


def _models_dir() -> Any:
    return resources.files("tuneplan.catalog").joinpath("models")


@lru_cache(maxsize=1)
def catalog_entries() -> tuple[CatalogEntry, ...]:
    try:
        raw = json.loads(_models_dir().joinpath("index.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ()
    out = []
    for d in raw:
        out.append(CatalogEntry(
            hf_id=d["hf_id"], file=d["file"], aliases=tuple(a.lower() for a in d.get("aliases", [])),
            family=d.get("family", ""), params_published=d.get("params_published"),
            params_transformers=d.get("params_transformers"), config_source=d.get("config_source", ""),
            gated=bool(d.get("gated", False)), notes=d.get("notes", ""),
        ))
    return tuple(out)


@lru_cache(maxsize=1)
def _lookup() -> dict[str, CatalogEntry]:
    """Every catalog name (id, short name, aliases) to its entry: built once, read only."""
    idx: dict[str, CatalogEntry] = {}
    for e in catalog_entries():
        idx.setdefault(e.hf_id.lower(), e)
        idx.setdefault(e.hf_id.split("/")[-1].lower(), e)
        for a in e.aliases:
            idx.setdefault(a, e)
    return idx


@lru_cache(maxsize=256)
def _load_entry_config(file: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(_models_dir().joinpath(file).read_text(encoding="utf-8"))
    return config


def suggestions(name: str, n: int = 5) -> list[str]:
    idx = _lookup()
    close = difflib.get_close_matches(name.lower(), list(idx), n=n * 2, cutoff=0.4)
    seen: dict[str, None] = {}
    for c in close:
        seen.setdefault(idx[c].hf_id, None)
    return list(seen)[:n]


def hub_offline() -> bool:
    """Offline mode as huggingface_hub itself reads it (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``
    1 / on / yes / true, any case; ``constants.HF_HUB_OFFLINE``), so that tuneplan never goes online where
    the hub client would not, nor the other way round."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return True
    return bool(constants.HF_HUB_OFFLINE)


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Fail fast offline instead of waiting through the hub client's retries."""
    import os
    import socket

    if hub_offline():
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("//")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_config_file(path: Path) -> dict[str, Any]:
    """A config.json (or the one in a model folder), read within the limits of :mod:`tuneplan.safe_read`."""
    from tuneplan.safe_read import parse_json, path_exists, read_text

    try:
        p = path / "config.json" if path.is_dir() else path
    except (OSError, ValueError):
        p = path
    if not path_exists(p):
        raise ConfigError(f"no config.json at {p}", field="model")
    try:
        data = parse_json(read_text(p, "model", accepted="a config.json file"), "model", str(p))
    except ConfigError:
        raise
    except TuneplanError as exc:
        raise ConfigError(exc.message, field="model", accepted=exc.accepted) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a JSON object", field="model")
    return data


def _fetch_hub_config(repo_id: str) -> dict[str, Any]:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        raise UnknownNameError(f"{repo_id!r} is not in the catalog and huggingface_hub is not installed",
                               field="model", suggestions=suggestions(repo_id)) from None
    try:
        path = hf_hub_download(repo_id, "config.json", local_files_only=not _hub_reachable())
    except GatedRepoError:
        raise UnknownNameError(
            f"{repo_id!r} is gated on the Hugging Face Hub: accept its licence and `huggingface-cli login`, "
            "or pass a local config.json path", field="model", suggestions=suggestions(repo_id)) from None
    except RepositoryNotFoundError:
        raise UnknownNameError(f"{repo_id!r} is neither in the catalog nor on the Hugging Face Hub",
                               field="model", suggestions=suggestions(repo_id)) from None
    except Exception as exc:  # offline, DNS, timeouts: huggingface_hub raises many types
        raise UnknownNameError(
            f"{repo_id!r} is not in the catalog and its config.json could not be fetched from the Hub "
            f"({type(exc).__name__}; offline?); pass a local config.json path", field="model",
            suggestions=suggestions(repo_id)) from None
    return load_config_file(Path(path))


def resolve_model(name: str, *, allow_network: bool = True) -> ModelSpec:
    """A model name, HF id or path -> ModelSpec."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownNameError("empty model name", field="model",
                               accepted="a catalog name, HF id or config.json path")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise UnknownNameError(f"a model name of {len(name)} characters names nothing", field="model",
                               accepted="a catalog name (`tuneplan models`), an HF id, "
                               "or a path to config.json")
    try:
        p: Path | None = user_path(name, "model")
    except TuneplanError:
        if name.startswith("~"):
            raise
        p = None  # a name no file system accepts (a component over 255 bytes) is no path
    try:
        is_path = p is not None and (name.endswith(".json") or p.is_dir() or (p.exists() and p.is_file()))
    except (OSError, ValueError):
        is_path = False
    if p is not None and is_path:
        return model_from_config(load_config_file(p), name=str(p))
    entry = _lookup().get(name.lower())
    if entry is not None:
        return model_from_config(_load_entry_config(entry.file), name=entry.hf_id)
    if "/" in name and allow_network:
        return model_from_config(_fetch_hub_config(name), name=name)
    raise UnknownNameError(f"unknown model {name!r}", field="model", suggestions=suggestions(name),
                           accepted="a catalog name (`tuneplan models`), an HF id, or a path to config.json")
