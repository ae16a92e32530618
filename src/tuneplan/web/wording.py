"""The page's names for the setup fields, and how the page words an error.

The core's errors refer to other fields as ``{field}`` / ``{field=value}`` (tuneplan.errors); on the page
there are no flags, only labelled widgets, so ``page_words`` names each by the label the page shows
(“Method” set to qlora, “FSDP full shard” off), and ``page_error`` words a whole error that way.
"""

from __future__ import annotations

from tuneplan.errors import TuneplanError
from tuneplan.specs.fields import BY_NAME, web_labels

# The setup fields' labels come from the field table (specs/fields/); the rest are the page's own.
LABELS: dict[str, str] = {
    "model": "Model",
    **web_labels(),
    "gpu": "GPU",
    "samples": "Samples",
    "avg_tokens": "Avg tokens per sample",
    "epochs": "Epochs",
    "packing": "Packing",
}


def page_words(name: str, value: str | None) -> str | None:
    """A field as the page names it: its label in quotes, with the value (None: no widget of that name)."""
    if name not in LABELS:
        return None
    label = f"“{LABELS[name]}”"
    if value is None:
        return label
    row = BY_NAME.get(name)
    if row is not None and row.is_switch:
        return f"{label} {'off' if value.lower() in ('false', 'off', 'no') else 'on'}"
    return f"{label} set to {value}"


def page_error(err: TuneplanError) -> str:
    """An error as the page shows it: headed by the label of its field, the fields it names in quotes."""
    return err.worded(page_words, LABELS.get)
