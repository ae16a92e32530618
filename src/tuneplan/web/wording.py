"""The page's names for the setup fields, and core messages reworded with them.

The core's errors speak the CLI's language (``use --method qlora``, ``accepted: --zero 0 with --fsdp``);
on the page there are no flags, only labelled fields. ``page_words`` swaps each known flag (and a leading
field name) for the label the page shows, so a message points at a widget the user can see.
"""

from __future__ import annotations

import re

from tuneplan.specs.fields import web_labels

# The setup fields' labels come from the field table (specs/fields.py); the rest are the page's own.
LABELS: dict[str, str] = {
    "model": "Model",
    **web_labels(),
    "gpu": "GPU",
    "samples": "Samples",
    "avg_tokens": "Avg tokens per sample",
    "epochs": "Epochs",
    "packing": "Packing",
}
# CLI spellings that are not the field name with dashes (cli/options.py)
_ALIASES = {"cutoff_len": "seq"}
_FLAG = re.compile(r"--(no-)?([a-z][a-z0-9-]*)")


def page_words(text: str) -> str:
    """``text`` with CLI flags replaced by the page's field labels (unknown flags are left as they are)."""

    def label(m: re.Match[str]) -> str:
        name = m.group(2).replace("-", "_")
        name = _ALIASES.get(name, name)
        if name not in LABELS:
            return m.group(0)
        return f"“{LABELS[name]}” off" if m.group(1) else f"“{LABELS[name]}”"

    out = _FLAG.sub(label, text)
    field, sep, rest = out.partition(": ")
    if sep and field in LABELS:  # TuneplanError's "field: message" prefix
        out = f"{LABELS[field]}: {rest}"
    return out
