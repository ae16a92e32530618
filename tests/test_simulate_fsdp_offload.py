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

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

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
    # LLaMA-Factory's pure bf16 (bf16 / fp16 off in the Trainer, so accelerate sets no MixedPrecision):
    # pre_unshard moves the host shard to the device (flat_param_to) for the all-gather: rank 0's padded
    # shard of a layer, ceil(numel / 2) bf16 elements
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    setup = resolve_setup(build_setup(big_vocab, method="full", precision="bf16", seq=64, gpus=2, fsdp=True,
                                      offload="all", framework="llamafactory"), big_vocab)
    run = simulate_run(big_vocab, setup, get_profile(setup.framework))
    copies = [bl for bl in run.result.blocks if "host shard copied" in bl.op]
    assert copies and all(bl.category == "parallel_buffers" for bl in copies)
    assert {bl.size for bl in copies} == {r512(2 * -(-sum(LAYER) // 2)), r512(2 * -(-sum(ROOT) // 2))}
    assert all(bl.freed_at >= 0 for bl in copies)  # freed once the all-gather output replaces them


def _fsdp2_offload(spec):
    return simulate_report(spec, build_setup(spec, method="full", precision="fp32", optimizer="adamw",
                                             seq=256, attn="eager", gradient_checkpointing=False,
                                             gpus=2, fsdp=True, fsdp_version=2, offload="all"))


def test_fsdp2_cpu_offload_policy_keeps_shards_gradients_and_states_on_the_host(big_vocab) -> None:
    # at the loss: the tail group (final norm, lm_head; reshard_after_forward=False) unsharded, one
    # all-gather output per parameter of N * ceil(d0 / N) rows; every shard, gradient and optimizer state
    # is on the host: the only device weights are the rotary buffers
    rep = _fsdp2_offload(big_vocab)
    b = rep.breakdown
    assert b.engine == "simulate" and not rep.fallback and "fully_shard" in b.wrapper
    assert rep.peak_op.startswith("_log_softmax_backward_data")
    assert b.components["parallel_buffers"] == r512(4 * 2 * -(-V // 2) * H) + r512(4 * 2 * -(-H // 2))
    assert b.components["weights"] == 2 * 512
    assert b.components["gradients"] == b.components["optimizer_states"] == 0
    # on the host: rank 0's fp32 shard of every parameter (d0 / 2 rows, the 9 per layer, embeddings, norm,
    # head), at least once, and its gradient
    layer = [(A * D, H), (KV * D, H), (KV * D, H), (H, A * D), (F, H), (F, H), (H, F), (H, 1), (H, 1)]
    shards = 2 * sum(r512(4 * -(-d0 // 2) * rest) for d0, rest in layer)
    shards += r512(4 * -(-V // 2) * H) * 2 + r512(4 * -(-H // 2))
    assert b.host_bytes >= 2 * shards


def test_fsdp2_offload_copies_each_host_shard_to_the_device_for_the_all_gather(big_vocab) -> None:
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    setup = resolve_setup(build_setup(big_vocab, method="full", precision="fp32", seq=64, gpus=2, fsdp=True,
                                      fsdp_version=2, offload="all"), big_vocab)
    run = simulate_run(big_vocab, setup, get_profile(setup.framework))
    copies = [bl for bl in run.result.blocks if "host shard copied" in bl.op]
    assert copies and all(bl.category == "parallel_buffers" and bl.freed_at >= 0 for bl in copies)
    # one per parameter per all-gather: the q_proj shard (A * D / 2 rows of H fp32) among them
    assert r512(4 * (A * D // 2) * H) in {bl.size for bl in copies}


def test_cli_estimate_fsdp2_offload_simulate_prints_one_json_object(tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", str(cfg), "--method", "qlora",
                        "--seq", "64", "--gpus", "2", "--fsdp", "--fsdp-version", "2", "--offload", "all",
                        "--engine", "simulate", "--json"],
                       capture_output=True, text=True, timeout=300,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}})
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)  # the whole of stdout is one object
    assert d["engine"] == "simulate" and "fully_shard" in d["wrapper"]
    assert any("CPUOffloadPolicy" in n for n in d["notes"])


def test_analytic_within_3_percent_of_the_fsdp2_offload_simulation() -> None:
    # the benchmark's CI case for FSDP2 + CPUOffloadPolicy (the rest: benchmarks/agreement.py --only offload)
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "agreement.py"
    spec = importlib.util.spec_from_file_location("agreement_bench_offload", path)
    agreement = importlib.util.module_from_spec(spec)
    sys.modules["agreement_bench_offload"] = agreement
    spec.loader.exec_module(agreement)  # type: ignore[union-attr]
    case = next(c for c in agreement.MULTI_GPU if c.label == "mg fsdp2 ws2 qlora q0.5b offload")
    assert "ci" in case.tags
    r = agreement.run_case(agreement.Case(case.label, case.model, case.setup, layers=2))
    assert abs(r["rel"]) <= 0.03, f"{case.label}: {100 * r['rel']:+.2f}% {r['components']}"
