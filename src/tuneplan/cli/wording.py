"""How the CLI words the core's references to fields (tuneplan.errors): as flags. No rich, so that
``--json`` output is worded without loading it."""

from __future__ import annotations

from typing import Any

from tuneplan.errors import word_texts


def flag_words(name: str, value: str | None) -> str | None:
    """The CLI's wording of a field an error refers to (tuneplan.errors): its flag, with the value.

    A setup field is its flag from the field table (``--method qlora``; a switch is ``--compile`` or
    ``--no-compile``); a setup field without a flag keeps its name (None); any other name is the flag of
    the same name (``from`` -> ``--from``, ``avg_tokens`` -> ``--avg-tokens``).
    """
    from tuneplan.specs.fields import BY_NAME

    if not name[:1].isalpha():  # already a flag
        return None
    row = BY_NAME.get(name)
    if row is not None and not row.flag:
        return None
    on, _, off = (row.flag[0] if row else "--" + name.replace("_", "-")).partition("/")
    if row is not None and row.is_switch:
        return off if value is not None and value.lower() in ("false", "off", "no") else on
    return on if value is None else f"{on} {value}"


def cli_texts(result: Any) -> Any:
    """A result's texts (findings, notes, assumptions) as the CLI prints them: field references as flags."""
    return word_texts(result, flag_words)
