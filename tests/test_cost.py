"""Cloud vs own, by hand: prices x hours, amortization + power, break-even; unknown stays unknown."""

from __future__ import annotations

import dataclasses

import pytest

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.errors import TuneplanError
from tuneplan.estimator.cost import Prices, cost_section

CARD = dataclasses.replace(resolve_accelerator("rtx4090"), launch_price_usd=1600.0, tdp_w=450.0,
                           cloud_usd_per_gpu_hr=0.40)


def test_cloud_is_price_times_gpu_hours() -> None:
    c = cost_section(CARD, gpus=2, gpu_hours=10.0)
    assert c["cloud_usd"] == pytest.approx(0.40 * 10.0)
    c = cost_section(CARD, gpus=2, gpu_hours=10.0, prices=Prices(cloud_usd_per_gpu_hr=2.0))
    assert c["cloud_usd"] == pytest.approx(20.0)


def test_own_is_amortization_plus_power() -> None:
    c = cost_section(CARD, gpus=1, gpu_hours=100.0, prices=Prices(own_years=2, kwh_price=0.2))
    per_hour = 1600 / (2 * 8760) + 0.450 * 0.2  # 0.0913 + 0.09
    assert c["own_usd_per_gpu_hour"] == pytest.approx(per_hour)
    assert c["own_usd"] == pytest.approx(100 * per_hour)
    assert c["power_usd_per_gpu_hour"] == pytest.approx(0.09)


def test_lower_duty_raises_the_hourly_cost_of_owning() -> None:
    full = cost_section(CARD, 1, 1.0, Prices(duty=1.0))["own_usd_per_gpu_hour"]
    half = cost_section(CARD, 1, 1.0, Prices(duty=0.5))["own_usd_per_gpu_hour"]
    power = 0.45 * 0.15
    assert half - power == pytest.approx(2 * (full - power))


def test_break_even_hours() -> None:
    c = cost_section(CARD, 1, None, Prices(kwh_price=0.2))
    assert c["break_even_hours"] == pytest.approx(1600 / (0.40 - 0.09))  # ~5,161 hours of use
    assert c["cloud_usd"] is None and c["own_usd"] is None  # no dataset, no totals
    assert any("dataset" in u for u in c["unknown"])


def test_never_breaks_even_when_power_costs_more_than_renting() -> None:
    c = cost_section(CARD, 1, 5.0, Prices(cloud_usd_per_gpu_hr=0.05, kwh_price=0.5))
    assert c["break_even_hours"] is None
    assert any("never breaks even" in a for a in c["assumptions"])


def test_unknown_prices_are_reported_and_can_be_given() -> None:
    a100 = resolve_accelerator("a100-80gb-sxm4")  # cloud price known, purchase price not in the catalog
    c = cost_section(a100, 8, 10.0)
    assert c["cloud_usd"] == pytest.approx(a100.cloud_usd_per_gpu_hr * 10.0)
    assert c["own_usd"] is None and any("{card_price}" in u for u in c["unknown"])
    c = cost_section(a100, 8, 10.0, Prices(card_price_usd=15000))
    assert c["own_usd"] > 0 and c["break_even_hours"] > 0
    bare = dataclasses.replace(a100, cloud_usd_per_gpu_hr=None)
    c = cost_section(bare, 1, 10.0)
    assert c["cloud_usd"] is None and any("{price}" in u for u in c["unknown"])


def test_seed_004_claim_is_checkable() -> None:
    # "renting an A100 for a 7B QLoRA costs 3-5x an amortized 4090": per GPU-hour at catalog prices the
    # rental/own ratio of the two cards, times how much faster the A100 finishes, is the claim's ratio.
    a100 = cost_section(resolve_accelerator("a100-80gb-sxm4"), 1, 1.0)
    own_4090 = cost_section(resolve_accelerator("rtx4090"), 1, 1.0)
    ratio_per_hour = a100["cloud_usd_per_gpu_hour"] / own_4090["own_usd_per_gpu_hour"]
    assert ratio_per_hour == pytest.approx(1.39 / (1599 / (3 * 8760) + 0.45 * 0.15))  # ~10.8 per hour


@pytest.mark.parametrize("kw, field", [
    ({"cloud_usd_per_gpu_hr": -1}, "cloud_usd_per_gpu_hr"), ({"kwh_price": -0.1}, "kwh_price"),
    ({"own_years": 0}, "own_years"), ({"duty": 1.5}, "duty"), ({"card_price_usd": "a lot"}, "card_price_usd"),
])
def test_bad_prices_name_the_field(kw, field) -> None:
    with pytest.raises(TuneplanError) as e:
        Prices(**kw).validate()
    assert e.value.field == field
