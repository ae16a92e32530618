"""cli/time_options.py: the dataset and price flags as estimate's keyword arguments, checked once."""

from __future__ import annotations

import inspect

import pytest

from tuneplan.cli.time_options import TIME_FLAGS, TIME_OPTIONS, time_kw_from, with_time_options
from tuneplan.errors import TuneplanError


def test_nothing_given_is_nothing_passed():
    assert time_kw_from({f.name: None for f in TIME_FLAGS}) == {}


def test_prices_pass_as_given():
    assert time_kw_from({"price": 2.5, "own_years": 4.0, "samples": None}) == {"price": 2.5, "own_years": 4.0}


def test_a_size_makes_a_dataset():
    kw = time_kw_from({"samples": 20_000, "avg_tokens": 400.0, "epochs": 2.0})
    ds = kw["dataset"]
    assert (ds.samples, ds.avg_tokens, ds.epochs) == (20_000, 400.0, 2.0)


@pytest.mark.parametrize("values, field", [({"inter_node_gbs": 0.0}, "inter_node_gbs"),
                                           ({"inter_node_gbs": -25.0}, "inter_node_gbs"),
                                           ({"link": "carrier-pigeon"}, "link"),
                                           ({"samples": -5}, "samples")])
def test_bad_values_name_their_flag(values, field):
    with pytest.raises(TuneplanError) as err:
        time_kw_from(values)
    assert err.value.field == field


def test_a_stated_link_becomes_a_runtime_option():
    kw = time_kw_from({"link": "pcie4x16", "inter_node_gbs": 50.0})
    opts = kw["time_options"]
    assert (opts.inter_node_gbs, opts.peer_link) == (50.0, "pcie4x16")


def test_every_row_is_one_flag_of_its_type():
    assert [f.name for f in TIME_FLAGS] == [name for name, _, _ in TIME_OPTIONS]
    types = {f.name: f.type for f in TIME_FLAGS}
    assert types["samples"] is int and types["epochs"] is float and types["packing"] is bool
    assert types["link"] is str


def test_with_time_options_adds_the_flags_and_hands_one_dict():
    seen = {}

    def command(model: str, time_kw: dict) -> None:
        seen.update(model=model, time_kw=time_kw)

    wrapped = with_time_options(command)
    params = inspect.signature(wrapped).parameters
    assert "time_kw" not in params and all(f.name in params for f in TIME_FLAGS)
    wrapped(model="m", price=3.0, samples=None)
    assert seen == {"model": "m", "time_kw": {"price": 3.0}}
