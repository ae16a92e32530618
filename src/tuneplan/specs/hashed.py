"""A frozen record's hash, computed once per record.

``functools`` caches key on their arguments' hashes; a :class:`~tuneplan.specs.model.ModelSpec` hashes
every field, its layer kinds and each kind's linears (about 30 tuples for Llama-2-7B), and a cold estimate
looks it up in some 25 caches. A frozen record's fields never change, so its hash does not either: the
first ``hash()`` keeps the dataclass's own value in the instance's ``__dict__`` and every later call reads
it back. Equality is untouched (the dataclass's ``__eq__``). The kept value is left out of a pickle: a
``str`` hash differs between processes (PYTHONHASHSEED), so an unpickled record hashes afresh.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_KEPT = "_hash_once"


def hash_once(cls: type[T]) -> type[T]:
    """Make the dataclass ``__hash__`` of ``cls`` run once per record (above ``@dataclass``)."""
    plain = cls.__hash__

    def __hash__(self: Any) -> int:
        kept: int | None = self.__dict__.get(_KEPT)
        if kept is None:
            kept = self.__dict__[_KEPT] = plain(self)
        return kept

    def __getstate__(self: Any) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != _KEPT}

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls
