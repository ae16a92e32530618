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
    ("v100-16gb", "v100-sxm2-16gb"), ("910b", "ascend-910b"),
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


# The catalog's cards of one model in several memory sizes (by hand from accelerators.json): a name that
# leaves the size open is refused, listing every size, on every face.
MEMORY_AMBIGUOUS = {
    "v100": {"v100-sxm2-16gb", "v100-pcie-16gb", "v100-sxm2-32gb", "v100-pcie-32gb"},
    "Tesla V100": {"v100-sxm2-16gb", "v100-pcie-16gb", "v100-sxm2-32gb", "v100-pcie-32gb"},
    "a100": {"a100-40gb-sxm4", "a100-40gb-pcie", "a100-80gb-sxm4", "a100-80gb-pcie"},
    "a100-sxm4": {"a100-40gb-sxm4", "a100-80gb-sxm4"},
    "v100 pcie": {"v100-pcie-16gb", "v100-pcie-32gb"},
}


@pytest.mark.parametrize("typed", sorted(MEMORY_AMBIGUOUS))
def test_a_name_that_leaves_the_memory_open_is_refused_with_every_size(typed: str) -> None:
    with pytest.raises(UnknownNameError) as e:
        resolve_accelerator(typed)
    assert e.value.field == "gpu" and set(e.value.suggestions) == MEMORY_AMBIGUOUS[typed]
    assert "16 GB" in str(e.value) or "40 GB" in str(e.value)


@pytest.mark.parametrize("typed,card,other", [
    ("a100-80gb", "a100-80gb-sxm4", "a100-80gb-pcie"), ("h100", "h100-sxm5-80gb", "h100-pcie-80gb"),
    ("v100-32gb", "v100-sxm2-32gb", "v100-pcie-32gb"),
])
def test_a_name_that_fixes_the_memory_is_the_sxm_board_and_says_so(typed: str, card: str, other: str) -> None:
    from tuneplan.catalog.accelerators import resolve_named

    acc, choice = resolve_named(typed)
    assert acc.id == card and choice is not None and card in choice and other in choice
    assert resolve_named(card)[1] is None  # the id itself is no choice


def test_every_face_refuses_v100_the_same_way() -> None:
    """CLI estimate, CLI fit, the API and the web form: one function, one answer."""
    import tuneplan
    from tuneplan.web.form import parse

    p = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", "Qwen/Qwen2.5-7B-Instruct",
                        "--method", "qlora", "--gpu", "v100"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "v100-sxm2-16gb" in p.stderr and "v100-pcie-32gb" in p.stderr
    with pytest.raises(UnknownNameError):
        tuneplan.estimate("qwen2.5-7b-instruct", method="qlora", gpu="v100")
    parsed = parse({"gpu": "v100"})
    assert "v100-pcie-16gb" in str(parsed.errors) and "v100-sxm2-32gb" in str(parsed.errors)


def test_the_estimate_says_the_board_chosen_on_its_first_line() -> None:
    p = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", "Qwen/Qwen2.5-7B-Instruct",
                        "--method", "qlora", "--gpu", "a100-80gb"], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})
    first = p.stdout.splitlines()[0]
    assert p.returncode == 0 and first.startswith("FITS on A100 80GB SXM4") and "a100-80gb-pcie" in first


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
