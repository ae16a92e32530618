"""Errors that carry what the user needs to fix their input.

Every face (CLI, web, API) catches :class:`TuneplanError` and shows ``str(err)``; the CLI exits 2.
A bad value names the field and the accepted values, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class TuneplanError(ValueError):
    """Bad input: a field, what was wrong, and what is accepted."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        accepted: Iterable[str] | str | None = None,
        suggestions: Iterable[str] | None = None,
    ) -> None:
        self.field = field
        self.accepted = (
            accepted if isinstance(accepted, str) or accepted is None else ", ".join(str(a) for a in accepted)
        )
        self.suggestions = list(suggestions or [])
        self.message = message
        super().__init__(self.render())

    def render(self) -> str:
        parts = [f"{self.field}: {self.message}" if self.field else self.message]
        if self.accepted:
            parts.append(f"accepted: {self.accepted}")
        if self.suggestions:
            parts.append("did you mean: " + ", ".join(self.suggestions))
        return "; ".join(parts)


class ConfigError(TuneplanError):
    """A model config.json (or training config file) that cannot be understood."""


class UnknownNameError(TuneplanError):
    """A model or accelerator name that resolves to nothing; carries suggestions."""
