"""What one request to the page may ask for: sizes checked before any estimate runs.

The page may be served to people the operator does not know, so every input has a ceiling and work
per request stays bounded: measured here, with every size field at its ceiling at once, the verdict
update took 0.6 s, the best-config search 0.1 s and the ranking of all cards 1.1 s on a shared 2-CPU
machine; ``tests/test_web_fuzz.py`` fails any handler call over 5 s. The ceilings sit far above any
real model or run, so a real config is not refused (a test runs every catalog config through them):

- layers 1,024: Llama 3.1 405B has 126. Work grows with the layer count in the planner's searches: a
  pasted config with 10^6 layers took 13-31 s in the best-config search, 10^9 layers over 90 s.
- experts 4,096 (Kimi K2 has 384); every other size (hidden 131,072, MLP width 1,048,576, vocabulary
  4,194,304, context 2^28 tokens, ...) is the CLI's own range from ``specs/limits.py``.

The config sizes are the CLI's own table (``specs/limits.py``) with the two ceilings above lowered.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.limits import MODEL_INT_ALIASES, MODEL_INT_RANGES

PASTE_MAX_BYTES = 512 * 1024  # a config.json is a few KiB; the largest in the catalog is under 10 KiB
JSON_MAX_DEPTH = 32  # real configs nest 3 deep (text_config -> rope_scaling -> ...)
NAME_MAX_CHARS = 200  # a Hugging Face id is at most 96 + 1 + 96 characters
INT_MAX_DIGITS = 20  # no config field needs a number wider than 64 bits

# The page takes the CLI's ranges (specs/limits.py: the field names, their spellings, and why each bound
# is sane) and lowers the ceilings where a larger value makes one request slow: the planner's searches walk
# the layers (10^6 layers took 13-31 s in the best-config search) and the MoE experts.
LAYERS, EXPERTS = 1024, 4096
PAGE_CEILINGS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "moe_layer_freq", "decoder_sparse_step", "first_k_dense_replace"),
                    LAYERS),
    **dict.fromkeys(("num_experts", "num_experts_per_tok", "n_shared_experts"), EXPERTS),
}


def _page_range(name: str) -> tuple[int, int]:
    low, high, _why = MODEL_INT_RANGES[name]
    return low, min(high, PAGE_CEILINGS.get(name, high))


# config.json keys whose size drives the work or the figures: key -> (minimum, maximum).
CONFIG_RANGES: dict[str, tuple[int, int]] = {
    **{name: _page_range(name) for name in MODEL_INT_RANGES},
    **{alias: _page_range(name) for alias, name in MODEL_INT_ALIASES.items()},
}

# Form numbers: field -> largest accepted (the smallest is each field's own rule in form.whole).
FORM_MAX: dict[str, int] = {
    "rank": 65_536, "batch": 65_536, "seq": 2**20, "grad_accum": 65_536, "gpus": 4096, "nodes": 4096,
    "zero": 3, "num_labels": 1_000_000, "samples": 10**12, "global_batch": 2**20, "context": 2**24,
    "concurrency": 65_536, "bits": 8,
}
EPOCHS_MAX = 10_000.0
AVG_TOKENS_MAX = float(2**20)

# Serving: sessions kept in memory (Gradio keeps a copy of the page's ~90 widget configs per session,
# about 217 KiB each: benchmarks/web_load.md), how long idle state lives, how many requests may wait.
SESSIONS_MAX = 256
SESSION_TTL_S = 3600.0
QUEUE_MAX = 64
WORKERS = 2  # requests computed at once per event (each is CPU-bound; the estimate has its own 8)

_SPECIAL = re.compile(r'[\\"\[\]{}]')
ACCEPTED_CONFIG = "a Hugging Face config.json"


def _refuse(message: str) -> TuneplanError:
    return TuneplanError(message, field="config", accepted=ACCEPTED_CONFIG)


def check_text(text: str) -> None:
    """Size and nesting depth of a pasted config, checked before the JSON parser sees it.

    Depth is counted over the brackets outside strings, so ``[[[[...`` 100,000 deep is refused in a
    linear scan instead of exhausting the parser's recursion.
    """
    size = len(text.encode("utf-8", errors="replace"))
    if size > PASTE_MAX_BYTES:
        raise _refuse(f"config.json is {size:,} bytes; a model config is a few KiB (at most "
                      f"{PASTE_MAX_BYTES // 1024} KiB here)")
    if _deeper_than(text, JSON_MAX_DEPTH):
        raise _refuse(f"config.json nests deeper than {JSON_MAX_DEPTH} levels; a model config nests 3")


def _deeper_than(text: str, most: int) -> bool:
    """Whether brackets outside strings nest deeper than ``most``: one pass over the special characters.

    A hand-rolled scan, not a regular expression for strings: ``"\\"\\"\\...`` (an unclosed string at
    every quote) makes a string pattern rescan the rest of the text from each quote, quadratic time.
    """
    depth, in_string, escaped_at = 0, False, -1
    for m in _SPECIAL.finditer(text):
        i, c = m.start(), m.group()
        if i == escaped_at:
            continue
        if in_string:
            if c == "\\":
                escaped_at = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > most:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _bounded_int(digits: str) -> int | float:
    # wider than any config field: kept as infinity, so check_finite names the key that holds it
    return math.inf if len(digits.lstrip("-")) > INT_MAX_DIGITS else int(digits)


def parse_json(text: str) -> Any:
    """``json.loads`` with the size/depth check first; NaN, Infinity and huge integers refused by key."""
    import json

    check_text(text)
    try:
        cfg = json.loads(text, parse_constant=float, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise _refuse(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:  # unreachable after check_text; kept so no parser limit becomes a crash
        raise _refuse(f"config.json nests deeper than {JSON_MAX_DEPTH} levels") from None
    check_finite(cfg)
    return cfg


def check_finite(cfg: Any, where: str = "") -> None:
    """No NaN, Infinity or number wider than INT_MAX_DIGITS digits anywhere in ``cfg`` (named by key)."""
    items = cfg.items() if isinstance(cfg, dict) else enumerate(cfg) if isinstance(cfg, list) else ()
    for key, value in items:
        path = f"{where}{key}" if isinstance(cfg, dict) else f"{where.rstrip('.')}[{key}]"
        if isinstance(value, float) and not math.isfinite(value):
            raise TuneplanError(f"{path} is not a finite number (NaN, Infinity or more than {INT_MAX_DIGITS} "
                                "digits)", field="config", accepted=f"{path} as a number JSON allows")
        if isinstance(value, (dict, list)):
            check_finite(value, f"{path}.")


def check_config(cfg: Any, where: str = "") -> None:
    """Every size field of ``cfg`` (and of configs nested in it) finite and inside CONFIG_RANGES."""
    if isinstance(cfg, list):
        for item in cfg:
            check_config(item, where)
        return
    if not isinstance(cfg, dict):
        return
    for key, value in cfg.items():
        path = f"{where}{key}"
        if key in CONFIG_RANGES and isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = CONFIG_RANGES[key]
            if not math.isfinite(value) or not lo <= value <= hi:
                raise TuneplanError(f"{path} is {value}; this page accepts {lo:,}..{hi:,}", field="config",
                                    accepted=f"{path} from {lo:,} to {hi:,}")
        elif isinstance(value, (dict, list)):
            check_config(value, f"{path}.")


def check_form_number(name: str, value: int | float) -> None:
    """The page's ceiling for a form number (``FORM_MAX``); larger values are refused, naming the field."""
    hi = FORM_MAX.get(name)
    if hi is not None and value > hi:
        raise TuneplanError(f"{value:,} is more than this page computes", field=name,
                            accepted=f"an integer up to {hi:,}")
