"""specs/limits.py: the range checks every reader calls, and how a refused value is shown."""

from __future__ import annotations

import math

import pytest

from tuneplan.errors import TuneplanError
from tuneplan.specs.limits import (
    MODEL_INT_ALIASES,
    MODEL_INT_RANGES,
    SETUP_INT_RANGES,
    check_int,
    check_number,
    show_value,
)


@pytest.mark.parametrize("value", [1, 5, 10])
def test_check_int_accepts_the_closed_range(value):
    assert check_int("layers", value, 1, 10) == value


def test_check_int_takes_a_whole_float_as_its_integer():
    # 12.0 == int(12.0): a JSON writer that emits 12.0 for 12 is not refused
    out = check_int("layers", 12.0, 1, 100)
    assert out == 12 and type(out) is int


@pytest.mark.parametrize("value", [True, False, 2.5, "3", None, math.nan, math.inf])
def test_check_int_refuses_what_is_not_an_integer(value):
    with pytest.raises(TuneplanError) as err:
        check_int("layers", value, 1, 10)
    assert err.value.field == "layers"
    assert err.value.accepted == "an integer in 1..10"
    assert "must be an integer" in err.value.message


@pytest.mark.parametrize("value", [0, 11, -1, 10**40])
def test_check_int_refuses_outside_the_range_and_says_why(value):
    with pytest.raises(TuneplanError) as err:
        check_int("layers", value, 1, 10, "the largest model has 10")
    assert err.value.field == "layers"
    assert err.value.accepted == "an integer in 1..10"
    assert "(the largest model has 10)" in err.value.message


def test_check_number_bounds_closed_and_open():
    assert check_number("price", 0, 0.0, 5.0) == 0.0
    assert check_number("price", 5, 0.0, 5.0) == 5.0
    with pytest.raises(TuneplanError) as err:
        check_number("price", 0.0, 0.0, 5.0, low_open=True)
    # the default accepted text names the open bound with '>' and formats the bounds with :g (0.0 -> "0")
    assert err.value.accepted == "a number > 0 and <= 5"
    with pytest.raises(TuneplanError):
        check_number("price", 5.0000001, 0.0, 5.0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1", True, None])
def test_check_number_refuses_non_finite_and_non_numbers(value):
    with pytest.raises(TuneplanError) as err:
        check_number("price", value, 0.0, 1e9, accepted="USD per hour")
    assert err.value.field == "price" and err.value.accepted == "USD per hour"


def test_check_number_compares_a_huge_int_exactly_without_overflow():
    # float(10**400) raises OverflowError; the check must refuse it as out of range instead
    with pytest.raises(TuneplanError) as err:
        check_number("tokens", 10**400, 0.0, 1e15)
    assert "out of range" in err.value.message


def test_show_value_cuts_long_reprs_to_60_characters():
    text = show_value("x" * 500)
    assert len(text) == 60 and text.endswith("...")
    assert show_value(42) == "42"
    assert show_value("ab") == "'ab'"


def test_show_value_gives_the_digit_count_of_a_huge_int():
    # 10**40 has 41 digits; bit_length 133 * log10(2) = 40.04 -> int + 1 = 41
    assert show_value(10**40) == "an integer of about 41 digits"
    assert show_value(-(10**40)) == "an integer of about 41 digits"


def test_ranges_are_well_formed():
    for table in (MODEL_INT_RANGES, SETUP_INT_RANGES):
        for name, (low, high, why) in table.items():
            assert 0 <= low < high, name
            assert why, name


def test_every_alias_points_at_a_ranged_name():
    assert set(MODEL_INT_ALIASES.values()) <= set(MODEL_INT_RANGES)
    assert not set(MODEL_INT_ALIASES) & set(MODEL_INT_RANGES)  # an alias is not itself a canonical name
