"""Rank 0 of an N-GPU FSDP job, simulated with the real FullyShardedDataParallel on a fake process group.

Expected bytes are derived here by hand from FSDP1's sharding rule (``_flat_param.py``: a unit's parameters
flattened in registration order, padded to a multiple of the world size, rank 0 keeping the first
``numel / N`` elements; ``use_orig_params=True`` exposes each parameter's slice of that shard, so an
optimizer state per slice) and from the tiny config: every allocation rounded up to 512 bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.api import build_setup  # noqa: E402
from tuneplan.simulate import simulate_report  # noqa: E402
from tuneplan.specs.model import model_from_config  # noqa: E402

from .sharded_tiny import KV, ROPE, TINY, A, D, F, H, L, V, r512  # noqa: E402

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

# q k v o gate up down 2 norms
LAYER = [H * A * D, H * KV * D, H * KV * D, A * D * H, H * F, H * F, F * H, H, H]
# embed_tokens, final norm, lm_head: what the decoder-layer auto-wrap leaves to the root
ROOT = [V * H, H, V * H]


def rank0_slices(numels: list[int], n: int) -> list[int]:
    """Elements of each parameter inside rank 0's shard (the first ceil(total / n) of the flat parameter)."""
    left, out = -(-sum(numels) // n), []
    for k in numels:
        take = min(k, left)
        if take:
            out.append(take)
        left -= take
    return out


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY, "tiny-llama-fsdp")


def _full_fp32(spec, n: int):
    return simulate_report(spec, build_setup(spec, method="full", precision="fp32", optimizer="adamw", seq=64,
                                             attn="eager", gradient_checkpointing=False, gpus=n, fsdp=True))


@pytest.mark.parametrize("n", [2, 4])
def test_fsdp_full_shard_weights_and_states_are_rank0_shards(tiny, n: int) -> None:
    rep = _full_fp32(tiny, n)
    b = rep.breakdown
    assert b.engine == "simulate" and not rep.fallback and "FullyShardedDataParallel" in b.wrapper
    shards = L * r512(4 * -(-sum(LAYER) // n)) + r512(4 * -(-sum(ROOT) // n))
    assert b.components["weights"] == shards + ROPE
    # foreach AdamW: exp_avg and exp_avg_sq per parameter slice of the shard (step counters on the host)
    per_moment = (L * sum(r512(4 * k) for k in rank0_slices(LAYER, n))
                  + sum(r512(4 * k) for k in rank0_slices(ROOT, n)))
    assert b.components["optimizer_states"] == 2 * per_moment
    assert b.nccl_bytes > 0


def test_fsdp_backward_holds_two_unsharded_layers_and_the_root(tiny) -> None:
    # at the peak (backward of the last layer): that layer unsharded, the next one prefetched
    # (BackwardPrefetch.BACKWARD_PRE), and the root unit, which FSDP1 does not reshard after forward
    b = _full_fp32(tiny, 2).breakdown
    assert b.peak_instant == "backward"
    assert b.components["parallel_buffers"] == 2 * r512(4 * sum(LAYER)) + r512(4 * sum(ROOT))


def test_fsdp_qlora_shards_the_bf16_stored_codes_and_offload_moves_them_to_the_host(tiny) -> None:
    on = simulate_report(tiny, build_setup(tiny, method="qlora", seq=64, gpus=2, fsdp=True))
    off = simulate_report(tiny, build_setup(tiny, method="qlora", seq=64, gpus=2, fsdp=True, offload="all"))
    assert on.breakdown.engine == off.breakdown.engine == "simulate"
    # 4-bit codes stored as bf16 (n / 4 elements per weight), norms bf16 (no fp32 upcast for sharded QLoRA)
    layer_elems = sum(k // 4 for k in LAYER[:7]) + 2 * H
    root_elems = V * H + H  # embeddings and final norm in bf16 (the lm_head is the adapter-free bf16 head)
    root_elems += V * H
    assert on.breakdown.components["weights"] == (L * r512(2 * (layer_elems // 2))
                                                  + r512(2 * (root_elems // 2)) + ROPE)
    # offloaded: no weight shard, adapter or optimizer state on the device; they are host memory
    c = off.breakdown.components
    assert c["lora_adapters"] == 0 and c["optimizer_states"] == 0 and c["gradients"] == 0
    assert off.breakdown.host_bytes > on.breakdown.host_bytes


def test_cli_estimate_fsdp_simulate_names_the_wrapper(tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", str(cfg), "--method", "lora",
                        "--seq", "64", "--gpus", "2", "--fsdp", "--engine", "simulate", "--json"],
                       capture_output=True, text=True, timeout=300,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}})
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["engine"] == "simulate" and "FullyShardedDataParallel" in d["wrapper"]
    assert any("wrapper that ran" in n for n in d["notes"])


def test_ddp_buckets_follow_ddp_assignment_rule() -> None:
    # DDP buckets the trainable parameters in reverse order: the first bucket closes at 1 MiB, the next at
    # 25 MiB; three 1 MiB fp32 parameters make a 1 MiB bucket and a 2 MiB one
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tuneplan.simulate.ddp import DdpBuckets
    from tuneplan.simulate.tracker import StorageTracker

    tracker = StorageTracker()
    with FakeTensorMode():
        params = [torch.nn.Parameter(torch.empty(512, 512)) for _ in range(3)]
        ddp = DdpBuckets(params, tracker)
        ddp.allocate()
    assert [t.untyped_storage().nbytes() for t in ddp.buckets] == [2**20, 2 * 2**20]
    assert all(tracker.block_of(t).category == "gradients" for t in ddp.buckets)


def test_ddp_rank0_holds_buckets_beside_the_gradients(tiny) -> None:
    from tuneplan.estimator.memory import memory_breakdown

    setup = build_setup(tiny, method="full", precision="fp32", optimizer="adamw", seq=64, attn="eager",
                        gradient_checkpointing=False, gpus=2)
    rep = simulate_report(tiny, setup)
    b = rep.breakdown
    assert b.engine == "simulate" and "DistributedDataParallel" in b.wrapper
    # every parameter trains: 4 B each, all in one bucket (under the 1 MiB first-bucket cap); at the peak of
    # the second step's backward the gradients of step 1 are gone (set_to_none), the bucket is not
    total = L * sum(LAYER) + sum(ROOT)
    assert 4 * total < 2**20
    assert b.components["gradients"] == r512(4 * total)
    assert b.components["weights"] == (sum(r512(4 * k) for k in LAYER) * L
                                       + sum(r512(4 * k) for k in ROOT) + ROPE)
    ana = memory_breakdown(tiny, setup)
    assert abs(ana.allocated_peak_bytes / b.allocated_peak_bytes - 1) < 0.05


# the rest: benchmarks/agreement.py --only "mg "
@pytest.mark.parametrize("label", ["mg fsdp1 ws2 qlora q0.5b"])
def test_analytic_within_3_percent_of_the_fsdp_simulation(label: str) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "agreement.py"
    spec = importlib.util.spec_from_file_location("agreement_bench_mg", path)
    agreement = importlib.util.module_from_spec(spec)
    sys.modules["agreement_bench_mg"] = agreement
    spec.loader.exec_module(agreement)  # type: ignore[union-attr]
    case = next(c for c in agreement.MULTI_GPU if c.label == label)
    assert "ci" in case.tags
    r = agreement.run_case(agreement.Case(case.label, case.model, case.setup, layers=2))
    assert abs(r["rel"]) <= 0.03, f"{label}: {100 * r['rel']:+.2f}% {r['components']}"
