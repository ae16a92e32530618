"""estimator/gemm_efficiency.py: a card's sustained GEMM fraction and how well it is known."""

from __future__ import annotations

import dataclasses

import pytest

from tuneplan.estimator.gemm_efficiency import KNOWN, card_efficiency, unverified_figures
from tuneplan.specs.hardware import Accelerator

CARD = Accelerator(id="made-up-card", name="Made-up", vendor="nvidia", memory_gb_marketed=24.0,
                   verified="yes")


def noted(text: str) -> Accelerator:
    return dataclasses.replace(CARD, unverified_or_derived_fields=text)


def test_an_unlisted_card_takes_its_class_fraction():
    eff = card_efficiency(CARD, 0.7, False)
    assert (eff.fraction, eff.known) == (0.7, "spec-derived")


def test_an_unlisted_card_with_unverified_figures_is_a_proxy():
    eff = card_efficiency(CARD, 0.7, True)
    assert (eff.fraction, eff.known) == (0.7, "proxy")


def test_a_measured_card_takes_its_published_fraction():
    # NVIDIA's Matrix Multiplication Background guide: ~250 of 312 TFLOPS on large bf16 GEMMs = 0.80
    a100 = dataclasses.replace(CARD, id="a100-40gb-sxm4")
    eff = card_efficiency(a100, 0.5, True)
    assert eff.known == "measured"
    assert eff.fraction == pytest.approx(250 / 312, abs=0.01)
    assert eff.source


def test_a_listed_proxy_card_without_a_fraction_keeps_the_class_one():
    ascend = dataclasses.replace(CARD, id="ascend-910b")  # listed as proxy, no gemm_efficiency given
    eff = card_efficiency(ascend, 0.5, False)
    assert (eff.fraction, eff.known) == (0.5, "proxy")


def test_every_listed_card_is_one_of_the_known_kinds():
    from tuneplan.estimator.gemm_efficiency import _table

    for card_id, row in _table().items():
        assert row["known"] in KNOWN, card_id
        # above 1 only where boards run above the reference boost clock the spec peak is quoted at (the
        # RTX 3090's measured 76.5 of 71 TFLOPS); past 1.1 it would be a typo, not a clock
        assert 0 < float(row.get("gemm_efficiency", 0.5)) <= 1.1, card_id


def test_unverified_figures_reads_only_speed_figures():
    assert unverified_figures(CARD) is None
    tensor = noted("bf16 tensor figure derived; launch price")
    assert unverified_figures(tensor) == "bf16 tensor figure derived"
    # link figures do not set the card's speed
    link = noted("NVLink bandwidth from a third party")
    assert unverified_figures(link) is None
    both = noted("memory bandwidth estimated; tdp; fp32 throughput")
    assert unverified_figures(both) == "memory bandwidth estimated; fp32 throughput"


def test_an_unverified_card_says_so_even_without_details():
    assert unverified_figures(dataclasses.replace(CARD, verified="no")) == "no source for this card's figures"
    noted = dataclasses.replace(CARD, verified="no", unverified_or_derived_fields="all numeric")
    assert unverified_figures(noted) == "all numeric"
