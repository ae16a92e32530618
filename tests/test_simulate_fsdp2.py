"""Rank 0 of an N-GPU FSDP2 job: the real ``fully_shard`` on a fake process group.

Expected bytes are derived here by hand from FSDP2's sharding rules (torch 2.13,
``_fully_shard/_fsdp_param.py`` ``_init_sharded_param``): every parameter is its own DTensor, chunked along
dim 0 with ``torch.chunk`` (ceil(d0 / N) rows per chunk), each rank's shard padded to chunk 0's size, so
rank 0 holds ceil(d0 / N) rows of every parameter in a storage of its own; no flat parameter, no padding
across parameters (FSDP1 flattens a unit and pads the flat total). Every allocation is rounded up to 512 B.
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

# (dim 0, the rest) of q k v o gate up down and the two norms
LAYER = [(A * D, H), (KV * D, H), (KV * D, H), (H, A * D), (F, H), (F, H), (H, F), (H, 1), (H, 1)]
EMBED, NORM, HEAD = (V, H), (H, 1), (V, H)

def shard_rows(d0: int, n: int) -> int:
    """torch.chunk's chunk size: rank 0 always holds a full chunk (the padded sharded size)."""
    return -(-d0 // n)


def rank0_bytes(shapes: list[tuple[int, int]], n: int, itemsize: int = 4) -> int:
    return sum(r512(itemsize * shard_rows(d0, n) * rest) for d0, rest in shapes)


@pytest.fixture(scope="module")
def tiny():
    return model_from_config(TINY, "tiny-llama-fsdp2")


def _full_fp32(spec, n: int):
    return simulate_report(spec, build_setup(spec, method="full", precision="fp32", optimizer="adamw", seq=64,
                                             attn="eager", gradient_checkpointing=False, gpus=n, fsdp=True,
                                             fsdp_version=2))


@pytest.mark.parametrize("n", [2, 3])
def test_fully_shard_keeps_a_dim0_chunk_of_every_parameter(tiny, n: int) -> None:
    rep = _full_fp32(tiny, n)
    b = rep.breakdown
    assert b.engine == "simulate" and not rep.fallback and "fully_shard" in b.wrapper
    shards = L * rank0_bytes(LAYER, n) + rank0_bytes([EMBED, NORM, HEAD], n)
    assert b.components["weights"] == shards + ROPE
    # AdamW's exp_avg and exp_avg_sq are zeros_like each DTensor: rank 0's local shard, same size
    assert b.components["optimizer_states"] == 2 * shards


def test_fully_shard_uneven_rows_differ_from_a_flat_shard(tiny) -> None:
    # 3 GPUs: q_proj's 64 rows split 22 / 21 / 21, rank 0 keeps 22 rows (FSDP1 would keep a third of the
    # flattened unit instead); the whole-model difference is what per-parameter chunking adds
    n = 3
    per_param = sum(shard_rows(d0, n) * rest for d0, rest in LAYER)
    flat = -(-sum(d0 * rest for d0, rest in LAYER) // n)
    assert per_param > flat
    rep = _full_fp32(tiny, n)
    assert rep.breakdown.components["weights"] - ROPE == (
        L * rank0_bytes(LAYER, n) + rank0_bytes([EMBED, NORM, HEAD], n))


def test_fully_shard_backward_holds_a_layer_its_prefetch_and_the_last_reduce_scatter_input(tiny) -> None:
    # at the peak (the last layer's backward, step 2): that layer's unsharded parameters (one all-gather
    # output per parameter, N chunks each), the previous layer's flat all-gather output (prefetched by
    # _backward_prefetch, not yet copied out) and the tail group's flat reduce-scatter input (its padded
    # unsharded gradients, kept in reduce_scatter_state until the next reduce-scatter); fp32 throughout
    n = 2
    b = _full_fp32(tiny, n).breakdown
    assert b.peak_instant == "backward"
    unsharded = sum(r512(4 * n * shard_rows(d0, n) * rest) for d0, rest in LAYER)
    prefetched = r512(4 * n * sum(shard_rows(d0, n) * rest for d0, rest in LAYER))
    tail_rs_input = r512(4 * n * sum(shard_rows(d0, n) * rest for d0, rest in (NORM, HEAD)))
    assert b.components["parallel_buffers"] == unsharded + prefetched + tail_rs_input
    # the tail's sharded gradients (views of its reduce-scatter output) are the only gradients yet
    assert b.components["gradients"] == r512(4 * sum(shard_rows(d0, n) * rest for d0, rest in (NORM, HEAD)))


def test_cli_estimate_fsdp2_simulate_names_the_wrapper(tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", "estimate", str(cfg), "--method", "lora",
                        "--seq", "64", "--gpus", "2", "--fsdp", "--fsdp-version", "2", "--engine", "simulate",
                        "--json"],
                       capture_output=True, text=True, timeout=300,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}})
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["engine"] == "simulate" and "fully_shard" in d["wrapper"]


def test_fsdp_version_is_checked() -> None:
    from tuneplan.errors import TuneplanError
    from tuneplan.specs.setup import TrainSetup

    with pytest.raises(TuneplanError) as e:
        TrainSetup(fsdp=True, gpus=2, fsdp_version=3).validate()
    assert e.value.field == "fsdp_version"
