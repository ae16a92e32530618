"""catalog/shipped.py: the package's accelerator catalog, read once."""

from __future__ import annotations

from tuneplan.catalog.shipped import shipped_cards


def test_cards_by_their_own_id():
    cards = shipped_cards()
    assert len(cards) == 61  # the README: 61 accelerators ship with it
    assert all(acc_id == acc.id for acc_id, acc in cards.items())
    assert all(acc.origin == "catalog" for acc in cards.values())


def test_read_once():
    assert shipped_cards() is shipped_cards()


def test_published_figures_of_two_cards():
    cards = shipped_cards()
    # NVIDIA's datasheets: H100 SXM5 80 GB HBM3, compute capability 9.0; RTX 4090 24 GB, 8.9
    h100, rtx = cards["h100-sxm5-80gb"], cards["rtx-4090"]
    assert (h100.memory_gb_marketed, h100.compute_capability) == (80, (9, 0))
    assert (rtx.memory_gb_marketed, rtx.compute_capability) == (24, (8, 9))
