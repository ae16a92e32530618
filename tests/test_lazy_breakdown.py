"""The analytic breakdown fixes its peak figures at once and builds the rest when read: what is read must be
what the definitions say (components sum to the allocated peak, the peak is the first instant with the
largest total, reserved and its band follow the allocator model's stated constants), a built part is kept
(an edit to it stays), and a verdict alone builds nothing else."""

from __future__ import annotations

import pytest

import tuneplan
from tuneplan.api import build_setup, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.memory import memory_of

MIB = 2**20
SETUPS = [
    ("Qwen/Qwen2.5-0.5B", {"method": "full", "grad_accum": 2}),
    ("meta-llama/Llama-2-7b-hf", {"method": "lora", "batch": 4, "seq": 512}),
    ("meta-llama/Llama-3.2-1B", {"method": "qlora", "gradient_checkpointing": True, "framework": "litgpt"}),
    ("Qwen/Qwen2.5-7B-Instruct", {"method": "lora", "zero": 3, "gpus": 4}),
]


@pytest.mark.parametrize(("model", "kw"), SETUPS)
def test_read_parts_follow_the_definitions(model, kw):
    b = tuneplan.estimate(model, gpu="a100-80gb", **kw).breakdown
    allocated = b.allocated_peak_bytes  # read before the components exist
    # overhead.py: at least allocated x 1.06, truncated, rounded up to 2 MiB segments (more where a loss
    # instant strands free segments: allocator_segments.py); the band: allocated x 1.02 .. reserved +
    # allocated x 0.14
    flat = -(-int(allocated * 1.06) // (2 * MIB)) * (2 * MIB)
    reserved = b.reserved_peak_bytes
    assert reserved >= flat and reserved % (2 * MIB) == 0
    assert b.device_peak_bytes == reserved + b.cuda_context_bytes + b.nccl_bytes
    assert sum(b.components.values()) == allocated == b.allocated_peak_bytes
    assert b.instants[b.peak_instant] == allocated == max(b.instants.values())
    assert next(k for k, v in b.instants.items() if v == allocated) == b.peak_instant  # the first on a tie
    band = b.bands["reserved"]
    assert (band.low, band.high) == (int(allocated * 1.02), reserved + int(allocated * (0.2 - 0.06)))
    transient = b.components["activations"] + b.components["logits_loss"] + b.components["backward_temp"]
    assert b.bands["allocated"].high == int(allocated + 0.1 * transient)
    d = b.to_dict()
    assert d["allocated_peak_bytes"] == allocated and d["components"] == b.components


def test_built_parts_are_kept_and_edits_stay():
    b = tuneplan.estimate("Qwen/Qwen2.5-0.5B", method="lora").breakdown
    assert b.notes is b.notes and b.components is b.components and b.bands is b.bands
    b.notes.insert(0, "first")
    assert b.to_dict()["notes"][0] == "first"
    b.components["framework"] += MIB
    assert b.allocated_peak_bytes == sum(b.components.values())  # the sum of what the components now hold


def test_a_verdict_builds_nothing_else():
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    b = memory_of(resolve_run(spec, build_setup(spec, method="lora")))
    assert b.device_peak_bytes > b.allocated_peak_bytes > 0
    assert not {"components", "instants", "bands", "notes", "paged_bytes", "host_bytes"} & set(vars(b))
