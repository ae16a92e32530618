"""FSDP1's rate limiter with a unit per LoRA matrix (Answer.AI's fsdp_qlora train.py: limit_all_gathers=True,
every leaf whose weight requires grad wrapped on its own): each layer's all-gathers wait for the compute
before them, so they add to the step whole, and the host copies of CPU offload (issued before the
limiter's wait) run beside the compute. Figures by hand for Llama-2 7B (6,738,415,616 parameters) LoRA
r=64 on q, k, v, gate, up, down (143,130,624 adapter parameters) on two RTX 4090, all in bf16 (train.py's
default precision casts the whole model to bf16).
"""

from __future__ import annotations

import pytest

from tuneplan.api import estimate
from tuneplan.estimator.collective_time import gathers_wait_for_compute

TARGETS = "q_proj,k_proj,v_proj,gate_proj,up_proj,down_proj"
# one all-gather of every unit: the weights and the adapters at 2 B each, half of it received by each of
# two GPUs
GATHERED = (6_738_415_616 + 143_130_624) * 2
# PCIe 4.0 x16, 31.5 GB/s per direction x 0.7 (NCCL's reach) x 0.5 (GeForce: staged through host memory)
PEER_GBS = 31.5 * 0.7 * 0.5
HOST_GBS = 31.5 * 0.7  # the host link, the same PCIe 4.0 x16
GATHER_S = GATHERED / 2 / (PEER_GBS * 1e9)


def _time(framework: str, offload: str = "none") -> dict:
    est = estimate("meta-llama/Llama-2-7b-hf", gpu="rtx-4090", framework=framework, method="lora", rank=64,
                   targets=TARGETS, gpus=2, fsdp=True, batch=4, seq=2048, gradient_checkpointing=True,
                   offload=offload)
    assert gathers_wait_for_compute(est.run) == (framework == "fsdp-qlora")
    return est.extras["sections"]["time"]["components_seconds"]


def test_gathers_add_whole_under_the_rate_limiter() -> None:
    waits = _time("fsdp-qlora")
    # both gathers of every unit, plus NCCL's per-call latency and the adapters' reduce-scatter (a few %)
    assert 2 * GATHER_S <= waits["communication_exposed"] <= 2 * GATHER_S * 1.05
    assert waits["communication_exposed"] == pytest.approx(waits["communication_total"])
    # the HF Trainer's wrap, with prefetched gathers, hides the same volume behind the compute
    hidden = _time("hf")
    assert hidden["communication_total"] == pytest.approx(waits["communication_total"])
    assert hidden["communication_exposed"] < 0.1 * 2 * GATHER_S


def test_offload_copies_run_beside_the_compute_when_gathers_wait() -> None:
    # with the parameters on the host, each micro-batch copies every unit's shard up for the forward and
    # again for the backward: 2 x GATHERED / 2 GPUs over the host link
    micro_copies = 2 * GATHERED / 2 / (HOST_GBS * 1e9)
    waits, hidden = _time("fsdp-qlora", "all"), _time("hf", "all")
    assert hidden["offload"] - waits["offload"] == pytest.approx(micro_copies, rel=1e-3)
