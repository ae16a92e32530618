"""The three operations the shape-dependent formulas need beyond + - * //, for Python numbers and numpy
arrays.

The memory formulas in batch and seq (``activations.saved_at``, ``logits.logits_plan``, ``memory.memory_at``)
are written once and evaluated either on Python ints (``tuneplan.estimate``) or on numpy arrays of every
(batch, seq) of a grid (``tuneplan.grid``). Python's ``max``/``min``/``int`` do not broadcast over arrays, so
those formulas call these instead. For numbers they are exactly the builtins (``max(a, b)`` returns ``a``
unless ``b > a``; a comparison that gives a Python bool means two numbers, so that is the only test made);
for arrays the element-wise numpy equivalents, which give the same IEEE-754 results (both paths multiply
and add in float64 in the same order, and truncate toward zero).
numpy is imported only when an array is passed: the scalar path and the CLI never load it.
"""

from __future__ import annotations

from typing import Any, overload

_NUMBERS = (int, float)


def maximum(a: Any, b: Any) -> Any:
    more = b > a  # a bool for two numbers; an array (or a numpy bool) when either is numpy
    if more.__class__ is bool:
        return b if more else a
    import numpy as np

    return np.maximum(a, b)


def minimum(a: Any, b: Any) -> Any:
    less = b < a
    if less.__class__ is bool:
        return b if less else a
    import numpy as np

    return np.minimum(a, b)


def to_int(x: Any) -> Any:
    """``int(x)``: truncation toward zero (numpy ``astype(int64)`` truncates the same way)."""
    if x.__class__ in _NUMBERS:
        return int(x)
    import numpy as np

    return np.asarray(x).astype(np.int64)


def int_for(x: Any) -> Any:
    """``to_int`` for a formula whose operands are numbers when ``x`` is one: the builtin ``int`` then (the
    same result without a Python call around it, on the scalar path), else :func:`to_int`. (Python's
    two-argument ``max`` is slower than :func:`maximum` on numbers: it goes through an iterator.)"""
    return int if x.__class__ in _NUMBERS else to_int


@overload
def ceil_div(a: int, b: int) -> int: ...
@overload
def ceil_div(a: Any, b: Any) -> Any: ...
def ceil_div(a: Any, b: Any) -> Any:
    """``a / b`` rounded up, for integers (or integer arrays): ``-(-a // b)``."""
    return -(-a // b)
