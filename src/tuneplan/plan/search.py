"""Exact searches over a monotone yes/no question, on integers.

Every planner answer ("largest micro-batch that fits", "fewest cards") is the boundary of a predicate
that is monotone in one integer: if batch ``b`` fits, every smaller batch fits too (more tokens never
need less memory), and if ``n`` cards fit under sharding, more cards fit too. On such a predicate,
galloping (doubling) then bisection finds the boundary exactly in ``O(log answer)`` evaluations; no
sampled "try a few values". The predicate is the estimator's own verdict, so the planner and a plain
loop over the same estimator agree (tests/test_plan_search.py checks both ways).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def _memoized(pred: Callable[[int], bool], known: dict[int, bool] | None = None) -> Callable[[int], bool]:
    """``pred`` evaluated once per argument (``known``: verdicts the caller already has)."""
    memo: dict[int, bool] = dict(known or {})

    def p(x: int) -> bool:
        if x not in memo:
            memo[x] = bool(pred(x))
        return memo[x]

    return p


def _boundary(p: Callable[[int], bool], good: int, bad: int) -> int:
    """Bisection between ``good`` (``p`` true) and ``bad`` (``p`` false, or one past the range), on either
    side of it: the last true value next to the first false one, returned as the true one."""
    while abs(bad - good) > 1:
        mid = (good + bad) // 2
        if p(mid):
            good = mid
        else:
            bad = mid
    return good


def largest_true(pred: Callable[[int], bool], lo: int, hi: int, *, start: int | None = None,
                 known: dict[int, bool] | None = None) -> int | None:
    """The largest ``x`` in ``[lo, hi]`` with ``pred(x)``, for ``pred`` true up to a point, false after.

    Returns None when ``pred(lo)`` is false. ``start`` is where to begin (e.g. the user's own value):
    from a true start the search gallops upwards, from a false one it bisects below it. ``known``
    carries verdicts already computed by the caller so they are not evaluated again.
    """
    if lo > hi:
        return None
    p = _memoized(pred, known)

    s = lo if start is None else min(max(start, lo), hi)
    if p(s):
        good, step = s, max(1, s - lo + 1)
        while True:  # gallop: 2s, 4s, 8s, ... (from lo = 1) until false or past hi
            probe = good + step
            if probe > hi:
                bad = hi + 1
                break
            if not p(probe):
                bad = probe
                break
            good, step = probe, step * 2
    else:
        if s == lo:
            return None
        if not p(lo):
            return None
        good, bad = lo, s
    return _boundary(p, good, bad)


def largest_true_near(pred: Callable[[int], bool], lo: int, hi: int, guess: int) -> int | None:
    """:func:`largest_true` starting from a ``guess`` near the answer: the search gallops away from it in
    steps 1, 2, 4, ... (up while true, down while false) and bisects the last step, so it costs
    ``O(log |answer - guess|)`` evaluations instead of ``O(log (hi - lo))``; the answer is the same."""
    if lo > hi:
        return None
    p = _memoized(pred)

    g = min(max(guess, lo), hi)
    step = 1
    if p(g):
        good, bad = g, hi + 1
        while good + step <= hi:
            if not p(good + step):
                bad = good + step
                break
            good, step = good + step, step * 2
    else:
        bad = g
        while True:
            if bad - step < lo:
                if not p(lo):
                    return None
                good = lo
                break
            if p(bad - step):
                good = bad - step
                break
            bad, step = bad - step, step * 2
    return _boundary(p, good, bad)


def smallest_true(pred: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest ``x`` in ``[lo, hi]`` with ``pred(x)``, for ``pred`` false up to a point, true after.

    Returns None when ``pred(hi)`` is false (nothing in range works).
    """
    if lo > hi:
        return None
    p = _memoized(pred)

    if p(lo):
        return lo
    bad, step = lo, 1
    while True:  # gallop upwards from lo
        probe = bad + step
        if probe >= hi:
            if not p(hi):
                return None
            good = hi
            break
        if p(probe):
            good = probe
            break
        bad, step = probe, step * 2
    return _boundary(p, good, bad)


def first_true_in(pred: Callable[[T], bool], ordered: Sequence[T]) -> T | None:
    """The first item of an ordered sequence (monotone: false ... false true ... true) with ``pred``."""
    i = smallest_true(lambda k: pred(ordered[k]), 0, len(ordered) - 1) if ordered else None
    return None if i is None else ordered[i]


def last_true_in(pred: Callable[[T], bool], ordered: Sequence[T]) -> T | None:
    """The last item of an ordered sequence (monotone: true ... true false ... false) with ``pred``."""
    i = largest_true(lambda k: pred(ordered[k]), 0, len(ordered) - 1) if ordered else None
    return None if i is None else ordered[i]
