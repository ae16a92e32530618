"""Where the page gets a model from: the catalog, a public Hugging Face repo, or text the user sent.

Never from the server's disk. The CLI's ``resolve_model`` also opens local paths and uses the local
Hugging Face cache and login, which is right for a person at their own terminal and wrong for a page
anyone on the network can call. So the page resolves names itself, in order:

1. a catalog id or alias (package data shipped with tuneplan);
2. a Hugging Face id ``org/name``, fetched ANONYMOUSLY (``token=False``: no operator token, no login)
   into a temporary folder made for that one fetch and removed after it, so the server's own Hugging
   Face cache is neither read nor written; the file's size is checked before it is downloaded;
3. a pasted or uploaded config.json (text), parsed with the size, depth and range limits of
   ``tuneplan.web.limits``.

Anything else (a path, ``~user``, ``../x``) is refused with the same message whether or not such a file
exists, because nothing is looked up on the server's disk.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections import OrderedDict
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.model import ModelSpec
from tuneplan.web import limits

ACCEPTED_NAME = "a catalog name or a public Hugging Face id (org/name); or paste / upload the config.json"
# Hugging Face repo ids (huggingface_hub.utils.validate_repo_id): letters, digits, "-", "_", "."; no
# "--" or ".."; at most 96 characters each side; the page asks for the org/name form.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HF_ID = re.compile(rf"{_PART}/{_PART}")
HUB_TIMEOUT_S = 10.0
HUB_CACHE_SIZE = 64  # fetched configs kept in memory: a few KiB each, 32 MiB at the very most

_hub_texts: OrderedDict[str, str] = OrderedDict()
_hub_lock = threading.Lock()


def _warned(fn: Any, *args: Any, **kw: Any) -> tuple[Any, tuple[str, ...]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, tuple(str(w.message) for w in caught)


def model_from_text(text: str, default_name: str = "pasted config.json") -> tuple[ModelSpec, tuple[str, ...]]:
    """A config.json's text -> (ModelSpec, warnings), every limit checked before the model is built."""
    from tuneplan.specs.model import model_from_config

    cfg = limits.parse_json(text)
    if not isinstance(cfg, dict):
        raise TuneplanError(f"config.json holds a JSON {type(cfg).__name__}, not an object", field="config",
                            accepted=limits.ACCEPTED_CONFIG)
    limits.check_config(cfg)
    name = cfg.get("_name_or_path")
    name = name[: limits.NAME_MAX_CHARS] if isinstance(name, str) and name.strip() else default_name
    try:
        return _warned(model_from_config, cfg, name=name)
    except TuneplanError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as exc:
        # a value of the wrong kind inside a known field: the builders assume types the checks above
        # do not cover, and the page must answer with a message, not fail the request
        raise TuneplanError(f"cannot read this config.json ({type(exc).__name__}: {exc})", field="config",
                            accepted=limits.ACCEPTED_CONFIG) from None


def catalog_model(name: str) -> ModelSpec | None:
    """The catalog entry ``name`` (an HF id or alias, any case), or None."""
    from tuneplan.catalog.models import _load_entry_config, _lookup
    from tuneplan.specs.model import model_from_config

    entry = _lookup().get(name.lower())
    return None if entry is None else model_from_config(_load_entry_config(entry.file), name=entry.hf_id)


def resolve_name(name: str) -> tuple[ModelSpec, tuple[str, ...]]:
    """A model name typed on the page -> (ModelSpec, warnings). Raises TuneplanError (field model)."""
    from tuneplan.catalog.models import suggestions

    name = name.strip()
    if not name:
        raise TuneplanError("choose a model", field="model", accepted=ACCEPTED_NAME)
    if len(name) > limits.NAME_MAX_CHARS:
        raise TuneplanError(f"the name is {len(name):,} characters long", field="model",
                            accepted=ACCEPTED_NAME)
    spec, notes = _warned(catalog_model, name)
    if spec is not None:
        return spec, notes
    if HF_ID.fullmatch(name) and ".." not in name and "--" not in name:
        return model_from_text(hub_config_text(name), default_name=name)
    if any(c in name for c in "/\\~:") or name.startswith(".") or name.endswith(".json"):
        raise TuneplanError(f"{name!r} is not a catalog name or a Hugging Face id; the page does not "
                            "read files on the server", field="model", accepted=ACCEPTED_NAME)
    near = suggestions(name)
    raise TuneplanError(f"unknown model {name!r}" + (f"; did you mean {', '.join(near)}?" if near else ""),
                        field="model", accepted=ACCEPTED_NAME)


def hub_config_text(repo_id: str) -> str:
    """The config.json of a public Hub repo, fetched anonymously (kept in memory, never on disk)."""
    with _hub_lock:
        if repo_id in _hub_texts:
            _hub_texts.move_to_end(repo_id)
            return _hub_texts[repo_id]
    text = _fetch_anonymously(repo_id)
    with _hub_lock:
        _hub_texts[repo_id] = text
        while len(_hub_texts) > HUB_CACHE_SIZE:
            _hub_texts.popitem(last=False)
    return text


def _hub_error(repo_id: str, why: str) -> TuneplanError:
    return TuneplanError(f"{repo_id!r} is not in the catalog and {why}", field="model",
                         accepted=ACCEPTED_NAME)


def _fetch_anonymously(repo_id: str) -> str:
    """Download ``repo_id``'s config.json with no token into a folder made for this fetch alone."""
    import shutil
    import tempfile
    from pathlib import Path

    from tuneplan.catalog.models import _hub_reachable

    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        raise _hub_error(repo_id, "the Hugging Face client is not installed on this server") from None
    if not _hub_reachable():
        raise _hub_error(repo_id, "the Hugging Face Hub cannot be reached from this server (offline)")
    private = tempfile.mkdtemp(prefix="tuneplan-web-hub-")
    try:
        meta = get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), token=False, timeout=HUB_TIMEOUT_S)
        if meta.size is not None and meta.size > limits.PASTE_MAX_BYTES:
            raise _hub_error(repo_id, f"its config.json is {meta.size:,} bytes; a model config is a few KiB")
        path = hf_hub_download(repo_id, "config.json", token=False, cache_dir=private,
                               etag_timeout=HUB_TIMEOUT_S)
        data = Path(path).read_bytes()[: limits.PASTE_MAX_BYTES + 1]
    except TuneplanError:
        raise
    except GatedRepoError:
        raise _hub_error(repo_id, "it is gated on the Hub; the page fetches anonymously, so paste or upload "
                                  "its config.json") from None
    except RepositoryNotFoundError:
        raise _hub_error(repo_id, "there is no public repo of that name on the Hugging Face Hub") from None
    except EntryNotFoundError:
        raise _hub_error(repo_id, "its repo on the Hub has no config.json") from None
    except Exception as exc:  # noqa: BLE001 - timeouts, DNS, HTTP errors: huggingface_hub raises many types
        raise _hub_error(repo_id, "its config.json could not be fetched from the Hub "
                         f"({type(exc).__name__})") from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _hub_error(repo_id, "its config.json on the Hub is not UTF-8 text") from None
