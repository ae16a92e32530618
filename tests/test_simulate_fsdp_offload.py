"""FSDP with CPU offload, simulated: only what a GPU run holds on the device is device memory.

Expected bytes are derived here by hand from torch 2.13's FSDP code and the tiny config (every allocation
rounded up to 512 bytes):

- FSDP1 ``CPUOffload(offload_params=True)`` (``_flat_param.py``): the sharded flat parameter is
  ``_local_shard`` on the host; before each unshard ``_writeback_orig_params`` writes the original
  parameters' gradient views back into ``torch.zeros_like(flat_param)``, a host tensor; without a
  mixed-precision policy ``pre_unshard`` copies the host shard to the device (``flat_param_to``);
- FSDP2 ``CPUOffloadPolicy`` (``_fully_shard/_fsdp_param.py``, ``_fsdp_collectives.py``): the sharded
  parameters live on the host; each unshard copies them to the device (``to(device, non_blocking=True)``)
  for the all-gather; the reduce-scatter output is copied to the host gradient (``foreach_reduce``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.api import build_setup  # noqa: E402
from tuneplan.simulate import simulate_report  # noqa: E402
from tuneplan.specs.model import model_from_config  # noqa: E402

from .sharded_tiny import KV, TINY, A, D, F, H, r512  # noqa: E402

V = 8192  # a vocabulary large enough that the loss chain is the peak
LAYER = [H * A * D, H * KV * D, H * KV * D, A * D * H, H * F, H * F, F * H, H, H]
ROOT = [V * H, H, V * H]  # embed_tokens, final norm, lm_head (untied)


@pytest.fixture(scope="module")
def big_vocab():
    return model_from_config({**TINY, "vocab_size": V}, "tiny-llama-offload")


def _fsdp1_offload(spec):
    return simulate_report(spec, build_setup(spec, method="full", precision="fp32", optimizer="adamw",
                                             seq=256, attn="eager", gradient_checkpointing=False,
                                             gpus=2, fsdp=True, offload="all"))


def test_fsdp1_offload_writeback_gradient_is_host_memory(big_vocab) -> None:
    # at the loss backward: the root's unsharded flat parameter (kept after forward) and the last layer's
    # (prefetched by the root's pre-backward); fp32 has no MixedPrecision, so pre_unshard copied each of
    # their host shards to the device (flat_param_to), and the original parameters stay views of that copy
    # (_use_sharded_views) until the unit reshards. The writeback zeros of the two shards are host tensors
    # (zeros_like of the host _local_shard): no backward scratch on the device yet
    rep = _fsdp1_offload(big_vocab)
    b = rep.breakdown
    assert b.engine == "simulate" and "FullyShardedDataParallel" in b.wrapper
    assert rep.peak_op.startswith("_log_softmax_backward_data")
    assert b.components["backward_temp"] == 0
    unsharded = r512(4 * sum(ROOT)) + r512(4 * sum(LAYER))
    device_shards = r512(4 * -(-sum(ROOT) // 2)) + r512(4 * -(-sum(LAYER) // 2))
    assert b.components["parallel_buffers"] == unsharded + device_shards
    assert b.components["weights"] == 2 * 512  # the rotary buffers: every parameter shard is on the host


def test_fsdp1_offload_without_mixed_precision_copies_each_shard_to_the_device(big_vocab) -> None:
    # pure bf16: no MixedPrecision, so pre_unshard moves the host shard to the device (flat_param_to) for the
    # all-gather: rank 0's padded shard of a layer, ceil(numel / 2) bf16 elements
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    setup = resolve_setup(build_setup(big_vocab, method="full", precision="bf16", seq=64, gpus=2, fsdp=True,
                                      offload="all"), big_vocab)
    run = simulate_run(big_vocab, setup, get_profile(setup.framework))
    copies = [bl for bl in run.result.blocks if "host shard copied" in bl.op]
    assert copies and all(bl.category == "parallel_buffers" for bl in copies)
    assert {bl.size for bl in copies} == {r512(2 * -(-sum(LAYER) // 2)), r512(2 * -(-sum(ROOT) // 2))}
    assert all(bl.freed_at >= 0 for bl in copies)  # freed once the all-gather output replaces them
