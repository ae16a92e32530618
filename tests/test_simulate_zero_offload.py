"""DeepSpeed ZeRO-Offload simulated with DeepSpeed's own engine and its CPU Adam (simulate/zero.py).

Needs ``deepspeed`` with its CPU Adam op buildable (the CI installs the extra): without them the
simulation tests skip with the reason; the fallback test runs everywhere. The CLI's ``--offload all
--engine simulate --json`` is tested in test_simulate_zero.py.
Expected bytes by hand from DeepSpeed 0.19's offload layout, for the tiny untied Llama of
``sharded_tiny`` (P parameters, N = 2 ranks, bf16; every allocation rounded up to 512 B):
- ZeRO-2, ``offload_optimizer`` (stage_1_and_2.py ``__init__`` / ``initialize_optimizer_states``): on the
  host the fp32 master partition, its fp32 gradient, Adam's two moments (4 P / N bytes each), the 16-bit
  partition buffer (2 P / N) and ``temp_grad_buffer_for_cpu_offload`` (the largest parameter, the V x H
  embedding, 16 bits); on the device the flat 16-bit model (2 P) and ``temp_grad_buffer_for_gpu_offload``
  (V x H, 16 bits), no optimizer state.
- ZeRO-3, ``offload_optimizer`` + ``offload_param`` (stage3.py ``_create_fp32_partitions``,
  ``grad_partitions_flat_buffer``, ``param_groups_fp16_flat_cpu_memory``): on the host the fp32 partition,
  its fp32 gradient buffer, Adam's two moments (4 P / N each), the 16-bit gradient partitions and the
  16-bit parameter partitions (2 P / N each); no parameter partition on the device (only the rotary
  buffers, which are not parameters).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.api import build_setup  # noqa: E402
from tuneplan.specs.model import model_from_config  # noqa: E402

from .sharded_tiny import KV, ROPE, TINY, A, D, F, H, L, V, r512  # noqa: E402

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

LAYER = H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F + 2 * H
TOTAL = L * LAYER + 2 * V * H + H
N = 2


def _needs_cpu_adam():
    from tuneplan.simulate.zero import cpu_adam_loads, deepspeed_version

    if not deepspeed_version():
        pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]')")
    why = cpu_adam_loads()
    if why:
        pytest.skip(why)


def _report(stage: int, offload: str):
    from tuneplan.simulate import simulate_report

    spec = model_from_config(TINY, "tiny-llama-zero-offload")
    rep = simulate_report(spec, build_setup(spec, method="full", precision="bf16-mixed", seq=64, attn="eager",
                                            gradient_checkpointing=False, gpus=N, zero=stage, offload=offload,
                                            ds_reduce_bucket=100_000))
    assert not rep.fallback, rep.fallback
    return rep


def test_zero2_offload_keeps_master_gradients_and_states_on_the_host() -> None:
    _needs_cpu_adam()
    assert TOTAL % N == 0
    rep = _report(2, "optimizer")
    b = rep.breakdown
    assert b.engine == "simulate" and "DeepSpeed ZeRO" in b.wrapper
    assert b.components["optimizer_states"] == 0
    part32, part16, emb16 = r512(4 * TOTAL // N), r512(2 * TOTAL // N), r512(2 * V * H)
    assert b.host_bytes == 4 * part32 + part16 + emb16
    # the flat 16-bit model (and the rotary buffers) stay on the device, beside the device gradient buffer
    assert b.components["weights"] == r512(2 * TOTAL) + ROPE
    assert b.components["parallel_buffers"] == emb16


def test_zero3_offload_all_leaves_no_partition_on_the_device() -> None:
    _needs_cpu_adam()
    rep = _report(3, "all")
    b = rep.breakdown
    assert b.components["optimizer_states"] == 0
    assert b.components["weights"] == ROPE
    part32, part16 = r512(4 * TOTAL // N), r512(2 * TOTAL // N)
    assert b.host_bytes == 4 * part32 + 2 * part16


def test_zero_offload_without_cpu_adam_falls_back_with_the_reason(monkeypatch) -> None:
    import tuneplan.simulate.zero as zero
    from tuneplan.simulate import simulate_report

    monkeypatch.setattr(zero, "deepspeed_version", lambda: "0.19.8")
    monkeypatch.setattr(zero, "cpu_adam_loads", lambda: "DeepSpeed's CPU Adam op does not build here")
    spec = model_from_config(TINY, "tiny-llama-zero-offload")
    rep = simulate_report(spec, build_setup(spec, method="full", seq=64, gpus=2, zero=3, offload="all"))
    assert "CPU Adam" in rep.fallback
    assert rep.breakdown.engine == "analytic"
