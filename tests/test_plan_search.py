"""The generic searches: exact boundaries of monotone predicates, in few evaluations."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tuneplan.plan.search import first_true_in, largest_true, largest_true_near, last_true_in, smallest_true


def plain_largest(lo: int, hi: int, cut: int) -> int | None:
    """The plain loop the searches must agree with: the last x in [lo, hi] before the first x > cut."""
    want = None
    for x in range(lo, hi + 1):
        if not x <= cut:
            break
        want = x
    return want


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(1, 50), span=st.integers(0, 5000), cut=st.integers(-10, 6000),
       start=st.none() | st.integers(0, 6000))
def test_largest_true_matches_a_plain_loop(lo: int, span: int, cut: int, start: int | None) -> None:
    hi = lo + span
    calls: list[int] = []

    def pred(x: int) -> bool:
        calls.append(x)
        return x <= cut

    got = largest_true(pred, lo, hi, start=start)
    want = plain_largest(lo, hi, cut)
    assert got == want
    # exact, and logarithmic: gallop + bisection, each about log2(span) steps, plus the ends
    assert len(set(calls)) <= 2 * math.log2(span + 2) + 4


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(1, 50), span=st.integers(0, 5000), cut=st.integers(-10, 6000),
       guess=st.integers(-10, 6000))
def test_largest_true_near_matches_a_plain_loop_and_costs_the_distance(lo: int, span: int, cut: int,
                                                                      guess: int) -> None:
    hi = lo + span
    calls: list[int] = []

    def pred(x: int) -> bool:
        assert lo <= x <= hi
        calls.append(x)
        return x <= cut

    got = largest_true_near(pred, lo, hi, guess)
    want = plain_largest(lo, hi, cut)
    assert got == want
    # gallop away from the (clamped) guess, then bisect the last step: about 2 log2 of the distance
    g = min(max(guess, lo), hi)
    distance = abs((want if want is not None else lo) - g)
    assert len(set(calls)) <= 2 * math.log2(distance + 2) + 4


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(0, 50), span=st.integers(0, 5000), cut=st.integers(-10, 6000))
def test_smallest_true_matches_a_plain_loop(lo: int, span: int, cut: int) -> None:
    hi = lo + span
    calls: list[int] = []

    def pred(x: int) -> bool:
        calls.append(x)
        return x >= cut

    got = smallest_true(pred, lo, hi)
    want = next((x for x in range(lo, hi + 1) if x >= cut), None)
    assert got == want
    assert len(set(calls)) <= 2 * math.log2(span + 2) + 4


def test_boundary_values_and_empty_ranges() -> None:
    assert largest_true(lambda x: True, 1, 1) == 1
    assert largest_true(lambda x: False, 1, 100) is None
    assert largest_true(lambda x: True, 1, 100) == 100
    assert largest_true(lambda x: True, 5, 4) is None
    assert smallest_true(lambda x: True, 3, 3) == 3
    assert smallest_true(lambda x: False, 0, 10) is None
    # a start above the boundary bisects below it; one below gallops up
    assert largest_true(lambda x: x <= 7, 1, 1000, start=500) == 7
    assert largest_true(lambda x: x <= 700, 1, 1000, start=3) == 700


def test_known_verdicts_are_not_evaluated_again() -> None:
    seen: list[int] = []

    def pred(x: int) -> bool:
        seen.append(x)
        return x <= 40

    assert largest_true(pred, 1, 100, start=10, known={10: True}) == 40
    assert 10 not in seen


def test_ordered_sequences() -> None:
    counts = [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32]
    assert first_true_in(lambda n: n * 10 >= 150, counts) == 16
    assert first_true_in(lambda n: False, counts) is None
    assert last_true_in(lambda n: n <= 6, counts) == 6
    assert first_true_in(lambda n: True, []) is None
