"""Card names: an ambiguous or unknown name is an error listing the candidates, never a silent substitute;
the cards added beside the reference table carry their figures and source."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tuneplan.catalog.accelerators import catalog_accelerators, resolve_accelerator
from tuneplan.errors import UnknownNameError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("typed,card", [
    ("rtx4060", "rtx-4060"), ("RTX 4060", "rtx-4060"), ("4060", "rtx-4060"),
    ("4060 ti 16gb", "rtx-4060-ti-16gb"), ("RTX 4060 Ti 8GB", "rtx-4060-ti-8gb"),
    ("3060 ti", "rtx-3060-ti"), ("3060", "rtx-3060-12gb"), ("5060 ti", "rtx-5060-ti-16gb"),
    ("rtx 5070", "rtx-5070"), ("5070 ti", "rtx-5070-ti"), ("a40", "a40"), ("l40", "l40"),
    ("l40s", "l40s"), ("h20", "h20-96gb"), ("mi300x", "mi300x"), ("A100-SXM4-40GB", "a100-40gb-sxm4"),
    ("a100", "a100-80gb-sxm4"),
])
def test_names_resolve_to_that_card(typed: str, card: str) -> None:
    assert resolve_accelerator(typed).id == card


@pytest.mark.parametrize("typed,candidates", [
    ("4060 ti", {"rtx-4060-ti-8gb", "rtx-4060-ti-16gb"}),  # two memory sizes, no default
    ("rtx 4070 ti", {"rtx-4070-ti-super"}),  # the plain 4070 Ti is not in the catalog: not the Super
])
def test_ambiguous_or_missing_variant_is_an_error_listing_candidates(typed: str,
                                                                     candidates: set[str]) -> None:
    with pytest.raises(UnknownNameError) as e:
        resolve_accelerator(typed)
    assert e.value.field == "gpu" and candidates <= set(e.value.suggestions)


def test_a_card_never_becomes_its_variant() -> None:
    # every catalog card whose name adds Ti / Super / D / S / X to another card's: the shorter name is
    # that card
    cat = catalog_accelerators()
    for base, variant in (("rtx-4090", "rtx-4090-d"), ("l40", "l40s"), ("rtx-4060", "rtx-4060-ti-8gb")):
        assert resolve_accelerator(cat[base].name).id == base != variant


def test_added_cards_have_figures_and_a_source() -> None:
    cat = catalog_accelerators()
    with (ROOT / "tools" / "accelerators_added.csv").open(encoding="utf-8") as f:
        names = [r["name"] for r in csv.DictReader(f)]
    assert len(names) == 6
    by_name = {a.name: a for a in cat.values()}
    for n in names:
        a = by_name[n]
        assert (a.memory_gb_marketed and a.memory_bandwidth_gbs and a.bf16_tflops_dense
                and a.compute_capability)
        assert a.interconnect and a.source and a.launch_price_usd
    # by hand: RTX 4060 = 24 SMs x 2.46 GHz x 512 FLOP/clock = 30.2 TFLOPS; 8 GB
    a = cat["rtx-4060"]
    assert a.bf16_tflops_dense == pytest.approx(30.2) and a.memory_gb_marketed == 8
    for acc_id in ("a40", "l40", "h20-96gb", "mi300x"):  # asked for, already in the reference table
        assert cat[acc_id].bf16_tflops_dense and cat[acc_id].memory_bandwidth_gbs


def test_cli_names_the_candidates_and_exits_2() -> None:
    p = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "fit", "Qwen/Qwen2.5-0.5B",
                        "--gpu", "4060 ti"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "rtx-4060-ti-8gb" in p.stderr and "rtx-4060-ti-16gb" in p.stderr
