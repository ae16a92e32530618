"""Links between GPUs: NCCL goes through host memory where it does not use peer-to-peer."""

from __future__ import annotations

import pytest

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.estimator.links import intra_node_link

PCIE4_X16 = 31.5  # GB/s one way: 16 GT/s x 16 lanes, 128b/130b (PCI-SIG)


def test_aws_g5_a10g_rings_go_through_host_memory() -> None:
    """g5 puts each A10G on its own CPU root port; NCCL's default P2P level stops at a PCIe switch, so
    the ring is staged through host memory: half the peer figure of a card behind a switch."""
    a10g, l40s = resolve_accelerator("a10g"), resolve_accelerator("l40s")
    assert intra_node_link(a10g, 4).gbs == pytest.approx(PCIE4_X16 * 0.7 * 0.5)
    assert intra_node_link(l40s, 4).gbs == pytest.approx(PCIE4_X16 * 0.7)
    assert "host memory" in intra_node_link(a10g, 4).source


def test_geforce_rings_go_through_host_memory() -> None:
    assert intra_node_link(resolve_accelerator("rtx-4090"), 2).gbs == pytest.approx(PCIE4_X16 * 0.7 * 0.5)
