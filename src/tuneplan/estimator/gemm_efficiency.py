"""The card's sustained tensor throughput: a published per-card GEMM fraction where one exists
(``catalog/card_efficiency.toml``), else the fraction of its class (``card_rates.GEMM_EFFICIENCY``), and how
well that is known: ``measured``, ``spec-derived`` or ``proxy`` (the file's header says what each means)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from tuneplan.specs.hardware import Accelerator

KNOWN = ("measured", "spec-derived", "proxy")
UNVERIFIED_MARKERS = ("tensor", "bf16", "bandwidth", "throughput", "all numeric", "all throughput")
LINK_MARKERS = ("nvlink", "if bandwidth", "hccs")


@lru_cache(maxsize=256)
def unverified_figures(acc: Accelerator) -> str | None:
    """Why the card's tensor peak or bandwidth is not verified (the catalog's own words), or None (kept per
    card: the memory and time sections both ask; the record is frozen, so the key is its value)."""
    text = (acc.unverified_or_derived_fields or "").strip()
    if acc.verified == "no":
        return text or "no source for this card's figures"
    hits = [p.strip() for p in text.split(";") if any(k in p.lower() for k in UNVERIFIED_MARKERS)
            and not any(k in p.lower() for k in LINK_MARKERS)]  # link figures do not set the card's speed
    return "; ".join(hits) or None


@dataclass(frozen=True)
class CardEfficiency:
    fraction: float  # of the dense tensor peak, sustained on a training step's large GEMMs
    known: str  # measured | spec-derived | proxy
    source: str


@lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    text = resources.files("tuneplan.catalog").joinpath("card_efficiency.toml").read_text(encoding="utf-8")
    return dict(tomllib.loads(text))


@lru_cache(maxsize=512)
def card_efficiency(acc: Accelerator, class_fraction: float, figures_unverified: bool) -> CardEfficiency:
    """The card's GEMM fraction and how well it is known (``figures_unverified``: the catalog says its tensor
    or bandwidth figure is not the vendor's, which makes an unlisted card a proxy)."""
    row = _table().get(acc.id)
    if row is not None:
        return CardEfficiency(float(row.get("gemm_efficiency", class_fraction)), str(row["known"]),
                              str(row["source"]))
    if figures_unverified:
        return CardEfficiency(class_fraction, "proxy", "catalog figures not verified; the class's fraction")
    return CardEfficiency(class_fraction, "spec-derived", "the vendor's dense peak at the class's fraction")
