"""simulate/snapshot.py: the emulated allocator as a ``torch.cuda.memory._snapshot()`` pickle, read back by
PyTorch's own snapshot reader (torch/cuda/_memory_viz.py)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch.cuda._memory_viz as memory_viz

from tuneplan.simulate.allocator import CachingAllocatorSim
from tuneplan.simulate.snapshot import snapshot_dict, write_snapshot

MIB = 1024**2
BLOCKS = [
    SimpleNamespace(module="model.layers.0.mlp", category="activation", op="aten.mm", shape=(4, 256),
                    dtype="bf16", phase="forward", requested=2000),
    SimpleNamespace(module="model", category="weight", op="aten.empty", shape=(1024, 1024), dtype="bf16",
                    phase="load", requested=2 * MIB),
]


@pytest.fixture
def sim():
    s = CachingAllocatorSim()
    s.malloc(0, 2048, 2000)  # a small block: PyTorch's CUDACachingAllocator gives it a 2 MiB small segment
    s.malloc(1, 2 * MIB, 2 * MIB)  # over 1 MiB and under 10 MiB: a 20 MiB large segment (kLargeBuffer)
    s.free(0, 2000)
    return s


def test_segments_by_hand(sim):
    d = snapshot_dict(sim, BLOCKS)
    segs = d["segments"]
    assert [(s["segment_type"], s["total_size"]) for s in segs] == [("small", 2 * MIB), ("large", 20 * MIB)]
    assert [s["allocated_size"] for s in segs] == [0, 2 * MIB]
    for s in segs:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        addr = s["address"]
        for b in s["blocks"]:  # blocks tile the segment in address order
            assert b["address"] == addr
            addr += b["size"]
    live = segs[1]["blocks"][0]
    assert live["state"] == "active_allocated" and live["requested_size"] == 2 * MIB
    assert live["frames"][0]["filename"] == "model"
    assert live["frames"][0]["name"] == "weight: empty [1024, 1024] bf16 [load]"


def test_trace_events_in_order(sim):
    trace = snapshot_dict(sim, BLOCKS)["device_traces"][0]
    assert [(e["action"], e["size"]) for e in trace] == [
        ("segment_alloc", 2 * MIB), ("alloc", 2048), ("segment_alloc", 20 * MIB), ("alloc", 2 * MIB),
        ("free_requested", 2048), ("free_completed", 2048)]
    assert [e["time_us"] for e in trace] == list(range(len(trace)))


def test_pytorchs_reader_sums_it(sim):
    text = memory_viz.segsum(snapshot_dict(sim, BLOCKS))
    assert "total_reserved: 22.0MiB" in text and "total_allocated: 2.0MiB" in text
    assert "<html" in memory_viz.trace_plot(snapshot_dict(sim, BLOCKS)).lower()


def test_write_snapshot_round_trips(sim, tmp_path):
    path = write_snapshot(tmp_path / "snap.pickle", sim, BLOCKS)
    with open(path, "rb") as f:
        assert pickle.load(f) == snapshot_dict(sim, BLOCKS)
