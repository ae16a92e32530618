"""The link a user states (--link) and the LoRA adapter's backward traffic, against hand derivations."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.estimator.compute import _adapter_backward_bytes
from tuneplan.estimator.links import stated_link, valid_stated_link


def test_stated_pcie_link_rates() -> None:
    # PCIe 3.0: 8 GT/s x 128/130 = 0.985 GB/s per lane per direction; x8 = 7.875 GB/s; NCCL reaches 0.7 of it
    a100 = resolve_accelerator("a100-80gb-pcie")
    assert stated_link("pcie3x8", a100, 2).gbs == pytest.approx(7.875 * 0.7)
    # a GeForce card has no peer-to-peer: NCCL crosses PCIe twice per byte (half the rate)
    assert stated_link("pcie3x8", resolve_accelerator("rtx-3090"), 2).gbs == pytest.approx(7.875 * 0.7 / 2)
    assert stated_link("pcie4x16-nop2p", a100, 2).gbs == pytest.approx(31.5 * 0.7 / 2)
    # NVLink3: 600 GB/s both directions, 300 one way, x 0.78
    assert stated_link("nvlink3", a100, 8).gbs == pytest.approx(300 * 0.78)
    assert not valid_stated_link("pcie9x16") and not valid_stated_link("fast")
    assert valid_stated_link("PCIe 4.0 x8")


def test_bad_link_flag_names_the_field() -> None:
    out = subprocess.run([sys.executable, "-m", "tuneplan", "estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "4090",
                          "--gpus", "2", "--link", "warp"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "link" in out.stderr + out.stdout and "pcie3x8" in out.stderr + out.stdout


def test_adapter_backward_bytes_op_by_op() -> None:
    # q_proj of Llama-2 7B, 4096 -> 4096, bf16, dropout on: the scaling multiply's gradient (4096), lora_A's
    # input gradient (4096), dropout's backward (4096), the add into the base layer's input gradient (4096)
    assert _adapter_backward_bytes(4096, 4096, True, 2) == (4096 + 3 * 4096) * 2
    # gate_proj 4096 -> 11008 without dropout: 11008 + 2 x 4096 elements
    assert _adapter_backward_bytes(4096, 11008, False, 2) == (11008 + 2 * 4096) * 2
