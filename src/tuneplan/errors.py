"""Errors that carry what the user needs to fix their input.

A bad value names the field and the accepted values, never a traceback; the CLI exits 2.

The core words no face: where a message or the accepted values point at another field, they name it
as ``{field}`` or ``{field=value}`` (``"use {method=qlora}, or drop {bits}"``), and each face words
the reference its own way (:meth:`TuneplanError.worded`): the CLI as a flag (``--method qlora``), the web
page as the label of its widget (“Method” set to qlora), ``str(err)`` and the API as the field name
(``method=qlora``). The ``field`` itself is worded the same way, unless it is a key in a file
(:class:`ConfigError`: ``zero_optimization.stage``), which is shown as the file spells it.

The core's other texts follow the same rule: a finding's message and fix, a note, an assumption of the
time or cost model (``"pass {price} (USD per GPU-hour)"``); a face words a whole result with
:func:`word_texts` before it shows or prints it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

# a reference to a field: {name} or {name=value}; a value never holds braces
_REF = re.compile(r"\{([a-z][a-z0-9_]*)(?:=([^{}]*))?\}")

# How a face words a field: (name, value or None) -> text; None leaves the reference as the field name.
Words = Callable[[str, "str | None"], "str | None"]


def plain_words(name: str, value: str | None) -> str:
    """The API's wording: the field's name, ``name=value`` with a value."""
    return name if value is None else f"{name}={value}"


def word(text: str, words: Words) -> str:
    """``text`` with every ``{field}`` / ``{field=value}`` reference worded by ``words``."""

    def one(m: re.Match[str]) -> str:
        return words(m.group(1), m.group(2)) or plain_words(m.group(1), m.group(2))

    return _REF.sub(one, text)


# The parts of a result (``to_dict()``) that hold what the user gave: names, paths, setup values. They are
# shown as given, never read as references.
GIVEN_KEYS = frozenset({"model", "setup", "setup_sources", "gpu", "from"})


def word_texts(value: Any, words: Words, *, given: frozenset[str] = GIVEN_KEYS) -> Any:
    """A copy of a JSON-like result with every ``{field}`` reference in its texts (findings, notes,
    assumptions) worded by ``words``; the values under ``given`` keys are kept as they are."""
    if isinstance(value, str):
        return word(value, words)
    if isinstance(value, dict):
        return {k: v if k in given else word_texts(v, words, given=given) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(word_texts(v, words, given=given) for v in value)
    return value


class TuneplanError(ValueError):
    """Bad input: a field, what was wrong, and what is accepted (``message`` and ``accepted`` may refer to
    fields as ``{field}`` / ``{field=value}``; see the module docstring)."""

    field_is_key = False  # the field is a setup or face field, worded by each face

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        accepted: Iterable[str] | str | None = None,
        suggestions: Iterable[str] | None = None,
        field_is_key: bool | None = None,
    ) -> None:
        self.field = field
        if field_is_key is not None:
            self.field_is_key = field_is_key
        self.accepted = (
            accepted if isinstance(accepted, str) or accepted is None else ", ".join(str(a) for a in accepted)
        )
        self.suggestions = list(suggestions or [])
        self.message = message
        super().__init__(self.render())

    def parts(self, words: Words = plain_words,
              field_words: Callable[[str], str | None] | None = None) -> tuple[str | None, str, str | None]:
        """(the field, the message, the accepted values), worded by ``words`` (the field by ``field_words``
        when given: a heading may word it differently from a reference in a sentence)."""
        field = self.field
        if field is not None and not self.field_is_key:
            field = (field_words(field) if field_words else words(field, None)) or field
        return (field, word(self.message, words),
                word(self.accepted, words) if self.accepted else self.accepted)

    def worded(self, words: Words, field_words: Callable[[str], str | None] | None = None) -> str:
        """The one-line message as a face shows it: ``field: message; accepted: ...; did you mean: ...``."""
        field, message, accepted = self.parts(words, field_words)
        parts = [f"{field}: {message}" if field else message]
        if accepted:
            parts.append(f"accepted: {accepted}")
        if self.suggestions:
            parts.append("did you mean: " + ", ".join(self.suggestions))
        return "; ".join(parts)

    def render(self) -> str:
        return self.worded(plain_words)


class ConfigError(TuneplanError):
    """A model config.json (or training config file) that cannot be understood; ``field`` is the key in
    that file."""

    field_is_key = True


class UnknownNameError(TuneplanError):
    """A model or accelerator name that resolves to nothing; carries suggestions."""
