"""What every predicate shares: the registry (``predicate(code)``) and the card's SM name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuneplan.compat.rules import Context

Hit = dict[str, Any] | None
PREDICATES: dict[str, Callable[[Context, dict[str, Any]], Hit]] = {}


def predicate(code: str) -> Callable[[Callable[[Context, dict[str, Any]], Hit]], Callable[..., Hit]]:
    def deco(fn: Callable[[Context, dict[str, Any]], Hit]) -> Callable[..., Hit]:
        PREDICATES[code] = fn
        return fn

    return deco


def sm_name(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}{cc[1]}" if cc else "?"

