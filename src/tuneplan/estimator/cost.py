"""Money: renting GPU-hours against owning the card, and where the two cross.

- Cloud: a price per GPU-hour (the catalog's dated low reading, ``Accelerator.cloud_usd_per_gpu_hr`` with
  ``price_basis_and_date``; or the caller's ``--price``) x GPU-hours.
- Own: the card's price spread over its life (``own_years`` of use at ``duty`` of the hours of a year),
  plus the card's power at ``kwh_price``. Power is the card's TDP (a training step keeps a GPU near it);
  the host machine's draw, cooling and the resale value are left out and said so.
- Break-even: hours of use after which buying the card is cheaper than renting it,
  ``card_price / (cloud_per_hour - power_per_hour)``; never, when power alone costs more than renting.
Unknown stays unknown: no price, no number, and the reason says which input is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.hardware import Accelerator

HOURS_PER_YEAR = 8760.0
# Defaults are choices, stated in every output that uses them:
DEFAULT_OWN_YEARS = 3.0  # a common depreciation horizon for GPUs bought for ML work
DEFAULT_KWH_PRICE = 0.15  # USD per kWh; between US residential (~0.16-0.17) and industrial (~0.08) averages
DEFAULT_DUTY = 1.0  # fraction of the life the card is busy; break_even_hours answers the lower-use case


@dataclass(frozen=True)
class Prices:
    cloud_usd_per_gpu_hr: float | None = None  # overrides the catalog (``--price``)
    card_price_usd: float | None = None  # overrides the catalog's launch price (``--card-price``)
    kwh_price: float = DEFAULT_KWH_PRICE
    own_years: float = DEFAULT_OWN_YEARS
    duty: float = DEFAULT_DUTY

    def validate(self) -> Prices:
        from tuneplan.specs.limits import MAX_PRICE, check_number

        for name in ("cloud_usd_per_gpu_hr", "card_price_usd", "kwh_price", "own_years"):
            if getattr(self, name) is not None:  # finite and bounded: an infinite price makes totals NaN
                check_number(name, getattr(self, name), 0.0, MAX_PRICE)
        for name in ("cloud_usd_per_gpu_hr", "card_price_usd"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0):
                raise TuneplanError(f"must be a non-negative number, got {v!r}", field=name,
                                    accepted="e.g. 1.99")
        if not (isinstance(self.kwh_price, (int, float)) and self.kwh_price >= 0):
            raise TuneplanError(f"must be a non-negative number, got {self.kwh_price!r}", field="kwh_price",
                                accepted="USD per kWh, e.g. 0.15")
        if not (isinstance(self.own_years, (int, float)) and self.own_years > 0):
            raise TuneplanError(f"must be a positive number, got {self.own_years!r}", field="own_years",
                                accepted="years, e.g. 3")
        if not (isinstance(self.duty, (int, float)) and 0 < self.duty <= 1):
            raise TuneplanError(f"must be in (0, 1], got {self.duty!r}", field="duty", accepted="e.g. 0.5")
        return self


@dataclass(frozen=True)
class CostRates:
    """Prices per GPU-hour of one card under ``Prices``: nothing here depends on the hours."""

    cloud_hr: float | None
    own_hr: float | None
    power_hr: float | None
    card: float | None
    break_even: float | None
    assumptions: tuple[str, ...]
    unknown: tuple[str, ...]


# The catalog writes a borrowed price as "<rate>/hr -- proxy: the <card> price of this catalog (why)"
# (tools/build_accelerators.py keeps the reference table's wording).
_PROXY = re.compile(r"\bproxy: the (.+?) price\b")


# card-level answers (a planner or fit search asks them of one card for every setup it tries) are kept per
# (card, prices): both records are frozen, so the key is their value
@lru_cache(maxsize=256)
def priced_as(acc: Accelerator) -> str | None:
    """The card whose price the catalog borrows for ``acc`` ("A100 80GB SXM" for the Ascend 910B), or None
    when the price is a reading for this card (or there is none)."""
    m = _PROXY.search(acc.price_basis_and_date or "")
    return m.group(1) if m and acc.cloud_usd_per_gpu_hr is not None else None


@lru_cache(maxsize=256)
def cost_rates(acc: Accelerator, prices: Prices | None = None) -> CostRates:
    """Cloud, own and power prices per GPU-hour of ``acc`` and the break-even hours (see the module doc)."""
    p = (prices or Prices()).validate()
    assumptions: list[str] = []
    unknown: list[str] = []

    cloud_hr = p.cloud_usd_per_gpu_hr if p.cloud_usd_per_gpu_hr is not None else acc.cloud_usd_per_gpu_hr
    if p.cloud_usd_per_gpu_hr is not None:
        assumptions.append(f"cloud price {cloud_hr:g} USD per GPU-hour (given)")
    elif cloud_hr is not None:
        borrowed = priced_as(acc)
        assumptions.append(f"cloud price {cloud_hr:g} USD per GPU-hour"
                           + (f", borrowed from the {borrowed} (no reading for this card)"
                              if borrowed else "")
                           + f": {acc.price_basis_and_date or 'catalog'}")
    else:
        unknown.append(f"no cloud price for {acc.name} in the catalog: pass {{price}} (USD per GPU-hour)")

    card = p.card_price_usd if p.card_price_usd is not None else acc.launch_price_usd
    power_hr = acc.tdp_w / 1000.0 * p.kwh_price if acc.tdp_w else None
    if card is None:
        unknown.append(f"no purchase price for {acc.name} in the catalog: pass {{card_price}} (USD)")
    else:
        src = "given" if p.card_price_usd is not None else "catalog launch price"
        assumptions.append(f"card price {card:,.0f} USD ({src}) over {p.own_years:g} years"
                           + (f" at {p.duty:.0%} use" if p.duty < 1 else " of continuous use"))
    if power_hr is None:
        unknown.append(f"no TDP for {acc.name} in the catalog: power cost unknown")
    else:
        assumptions.append(f"power {acc.tdp_w:g} W per card (TDP) at {p.kwh_price:g} USD/kWh; host machine, "
                           "cooling and resale value not counted")

    own_hr = None
    if card is not None and power_hr is not None:
        own_hr = card / (p.own_years * HOURS_PER_YEAR * p.duty) + power_hr

    break_even = None
    if card is not None and power_hr is not None and cloud_hr is not None:
        if cloud_hr > power_hr:
            break_even = card / (cloud_hr - power_hr)
        else:
            assumptions.append("power alone costs more than renting: owning never breaks even")
    return CostRates(cloud_hr=cloud_hr, own_hr=own_hr, power_hr=power_hr, card=card, break_even=break_even,
                     assumptions=tuple(assumptions), unknown=tuple(unknown))


def cost_section(acc: Accelerator, gpus: int, gpu_hours: float | None, prices: Prices | None = None,
                 why_no_hours: str = ("no dataset size: totals need {samples} / {avg_tokens} or "
                                      "{dataset_tokens}"),
                 rates: CostRates | None = None) -> dict[str, Any]:
    """The ``cost`` section: cloud vs own for ``gpu_hours`` on ``gpus`` cards of ``acc`` (hours may be None,
    then ``why_no_hours`` says why); ``rates``: ``cost_rates(acc, prices)`` when the caller keeps them."""
    r = rates or cost_rates(acc, prices)
    cloud_hr, own_hr = r.cloud_hr, r.own_hr

    def times(rate: float | None) -> float | None:
        return None if rate is None or gpu_hours is None else rate * gpu_hours

    unknown = list(r.unknown)
    if gpu_hours is None:
        unknown.append(why_no_hours)
    sec: dict[str, Any] = {
        "cloud_usd": times(cloud_hr),
        "own_usd": times(own_hr),
        "break_even_hours": r.break_even,
        "cloud_usd_per_gpu_hour": cloud_hr,
        # the card whose price is borrowed ("priced as"), None for a reading of this card or a given --price
        "cloud_priced_as": None if (prices and prices.cloud_usd_per_gpu_hr is not None) else priced_as(acc),
        "own_usd_per_gpu_hour": own_hr,
        "power_usd_per_gpu_hour": r.power_hr,
        "card_price_usd": r.card,
        "gpus": gpus,
        "gpu_hours": gpu_hours,
        "cloud_to_own_ratio": (cloud_hr / own_hr) if cloud_hr is not None and own_hr else None,
        "assumptions": list(r.assumptions),
    }
    if unknown:
        sec["unknown"] = unknown
    return sec


@lru_cache(maxsize=256)
def hourless_section(acc: Accelerator, cards: int, prices: Prices | None) -> dict[str, Any]:
    """:func:`cost_section` without hours, kept per (card, cards, prices): never edited (callers copy it)."""
    return cost_section(acc, cards, None, prices, rates=cost_rates(acc, prices))
