"""catalog/card_names.py: loose card names -> the card they mean, over a hand-made catalog (independent of
the shipped one): exact ids and names, NVML's names, variant words never added, and a name that leaves
the memory open refused."""

from __future__ import annotations

import pytest

from tuneplan.catalog.card_names import (
    match_card,
    memory_families,
    name_key,
    resolve_in,
    resolve_named_in,
    variants_of,
)
from tuneplan.errors import UnknownNameError
from tuneplan.specs.hardware import Accelerator


def card(acc_id: str, name: str, gb: float, form: str | None = None) -> Accelerator:
    return Accelerator(id=acc_id, name=name, vendor="nvidia", memory_gb_marketed=gb, form_factor=form)


CAT = {c.id: c for c in (
    card("rtx-4090", "GeForce RTX 4090", 24), card("rtx-4060", "GeForce RTX 4060", 8),
    card("rtx-4060-ti", "GeForce RTX 4060 Ti", 16),
    card("h100-sxm5-80gb", "H100 SXM5 80GB", 80, "SXM5"),
    card("h100-pcie-80gb", "H100 PCIe 80GB", 80, "PCIe"),
    card("a100-80gb-sxm4", "A100 80GB SXM4", 80, "SXM4"),
    card("a100-80gb-pcie", "A100 80GB PCIe", 80, "PCIe"),
    card("a100-40gb-sxm4", "A100 40GB SXM4", 40, "SXM4"),
    card("v100-sxm2-16gb", "Tesla V100 SXM2 16GB", 16, "SXM2"),
    card("v100-sxm2-32gb", "Tesla V100 SXM2 32GB", 32, "SXM2"),
    card("l40", "L40", 48), card("l40s", "L40S", 48),
)}


@pytest.mark.parametrize("name, key", [("NVIDIA GeForce RTX 4090", "rtx4090"), ("A100 80GB", "a10080g"),
                                       ("h100-sxm5-80gb", "h100sxm580g"),
                                       ("RTX 6000 Ada Generation", "rtx6000ada")])
def test_name_key(name, key):
    assert name_key(name) == key


@pytest.mark.parametrize("name, acc_id", [
    ("rtx-4090", "rtx-4090"), ("GeForce RTX 4090", "rtx-4090"), ("4090", "rtx-4090"),
    ("RTX 4090", "rtx-4090"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),  # what NVML reports for the SXM5 board
    ("A100-SXM4-40GB", "a100-40gb-sxm4"),  # nvidia-smi's word order
    ("l40s", "l40s"), ("L40", "l40"),
])
def test_names_resolve(name, acc_id):
    assert resolve_in(name, CAT).id == acc_id


def test_a_loose_match_never_adds_a_variant_word():
    # "4060" is the RTX 4060, not the 4060 Ti (a different card with twice the memory)
    assert match_card("rtx 4060", CAT).id == "rtx-4060"
    assert match_card("4060 ti", CAT).id == "rtx-4060-ti"


def test_a_name_that_leaves_the_memory_open_is_refused():
    with pytest.raises(UnknownNameError) as err:
        resolve_in("v100", CAT)
    assert "16 GB or 32 GB" in err.value.message
    assert err.value.suggestions == ["v100-sxm2-16gb", "v100-sxm2-32gb"]
    assert resolve_in("v100 32gb", CAT).id == "v100-sxm2-32gb"


def test_same_memory_other_board_means_the_sxm_board_and_says_so():
    acc, note = resolve_named_in("a100 80gb", CAT)
    assert acc.id == "a100-80gb-sxm4"
    assert note == "a100 80gb read as a100-80gb-sxm4, not a100-80gb-pcie"
    exact, none = resolve_named_in("a100-80gb-pcie", CAT)
    assert exact.id == "a100-80gb-pcie" and none is None


def test_variants_of_an_exact_id_are_none():
    assert variants_of("v100-sxm2-16gb", CAT["v100-sxm2-16gb"], CAT) == []


def test_memory_families():
    # card models sold in several memory sizes: A100 (40 / 80 GB) and V100 (16 / 32 GB); the H100 SXM5 and
    # PCIe share 80 GB, the RTX 4060 and 4060 Ti are different models
    fams = memory_families(CAT)
    assert fams == {"a100": ["a100-40gb-sxm4", "a100-80gb-pcie", "a100-80gb-sxm4"],
                    "v100": ["v100-sxm2-16gb", "v100-sxm2-32gb"]}


def test_an_unknown_name_suggests_near_ones():
    with pytest.raises(UnknownNameError) as err:
        resolve_in("rtx 4099", CAT)
    assert err.value.field == "gpu" and "rtx-4090" in err.value.suggestions
