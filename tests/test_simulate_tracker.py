"""The storage tracker and the caching-allocator emulation, on hand-made allocation streams."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from tuneplan.simulate.allocator import CachingAllocatorSim  # noqa: E402
from tuneplan.simulate.tracker import StorageTracker, find_peak  # noqa: E402

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

MIB = 1 << 20


def _track(fn):
    tr = StorageTracker()
    with FakeTensorMode(), tr:
        fn()
    return tr, find_peak(tr.result())


def test_sizes_round_up_to_512_bytes() -> None:
    def body():
        a = torch.empty(1, dtype=torch.uint8)  # 1 B -> 512
        b = torch.empty(513, dtype=torch.uint8)  # 513 B -> 1024
        c = torch.empty(256, dtype=torch.float32)  # 1024 B -> 1024
        return a, b, c

    tr, pk = _track(body)
    assert sorted(b.size for b in tr.blocks) == [512, 1024, 1024]
    assert pk.bytes == 512 + 1024 + 1024


def test_a_storage_is_freed_when_its_last_tensor_dies_and_views_share_it() -> None:
    def body():
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B -> 4096
        v = a[10:]  # a view: no new storage
        w = a.view(10, 100)
        del a, v, w  # storage dies here
        b = torch.empty(512, dtype=torch.float32)  # 2048 B
        return b

    tr, pk = _track(body)
    assert [b.size for b in tr.blocks] == [4096, 2048]
    assert tr.blocks[0].freed_at >= 0
    assert pk.bytes == 4096  # never both alive


def test_peak_live_set_and_relabelling() -> None:
    holder = {}

    def body():
        x = torch.empty(1024, dtype=torch.float32)  # 4 KiB
        y = x * 2  # 4 KiB, allocated by aten.mul
        holder["y"] = y
        tr.relabel(y, "gradients")
        del x

    tr = StorageTracker()
    tr.phase = "step1.backward"
    with FakeTensorMode(), tr, torch.no_grad():  # the autograd engine runs backward ops without grad mode
        body()
    pk = find_peak(tr.result())
    assert pk.bytes == 8192
    assert sorted(b.category for b in pk.live) == ["backward_temp", "gradients"]
    assert "mul" in pk.op


def test_a_recomputation_inside_backward_is_activations() -> None:
    # a checkpoint recomputes the layer under enable_grad() while backward runs: an op outside any module
    # then (transformers 5 checkpoints the layer's forward, so its residual adds) is a recomputed activation
    held = []
    tr = StorageTracker()
    tr.phase = "step1.backward"
    with FakeTensorMode(), tr:
        with torch.no_grad():
            held.append(torch.empty(256) * 2)
        with torch.enable_grad():
            held.append(torch.empty(256) * 2)
    cats = [b.category for b in find_peak(tr.result()).live if b.op.endswith("mul.Tensor")]
    assert cats == ["backward_temp", "activations"]


def test_allocator_small_and_large_pools() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(0, 1000, 1000)  # small pool: one 2 MiB segment
    sim.malloc(1, 4096, 4096)  # same segment
    assert sim.reserved == 2 * MIB and len(sim.segments) == 1
    sim.malloc(2, 5 * MIB, 5 * MIB)  # large request under 10 MiB: a 20 MiB segment
    assert sim.reserved == 22 * MIB
    sim.malloc(3, 30 * MIB + 1, 30 * MIB + 1)  # >= 10 MiB: rounded up to 2 MiB -> 32 MiB
    assert sim.reserved == 54 * MIB
    # 1000 B counts as 1024 (512-rounded); the 5 MiB block is split off its 20 MiB segment
    assert sim.allocated == 1024 + 4096 + 5 * MIB + (30 * MIB + 512)  # 30 MiB + 1 B rounds to + 512


def test_allocator_reuse_merge_and_no_split_of_small_remainders() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(0, 8 * MIB, 8 * MIB)  # 20 MiB segment, split: 8 used, 12 free
    sim.malloc(1, 12 * MIB - 512 * 1024, 1)  # remainder 0.5 MiB <= 1 MiB: not split, whole 12 MiB handed out
    assert sim.allocated == 20 * MIB and sim.reserved == 20 * MIB
    sim.free(0, 0)
    sim.free(1, 0)
    seg = next(iter(sim.segments.values()))
    assert seg.blocks == [[0, 20 * MIB, -1]]  # both frees merged back into one block
    sim.malloc(2, 20 * MIB, 20 * MIB)  # fits the cached segment: no new cudaMalloc
    assert sim.stats.cuda_mallocs == 1 and sim.reserved == 20 * MIB


def test_allocator_releases_cached_segments_at_capacity() -> None:
    sim = CachingAllocatorSim(capacity=40 * MIB)
    sim.malloc(0, 20 * MIB, 20 * MIB)
    sim.free(0, 0)  # cached, still reserved
    sim.malloc(1, 30 * MIB, 30 * MIB)  # 20 + 30 > 40: the free segment goes back to CUDA first
    assert sim.reserved == 30 * MIB and sim.stats.cuda_frees == 1 and not sim.stats.oom
    sim.malloc(2, 20 * MIB, 20 * MIB)
    assert sim.stats.oom


def test_live_set_groups_by_decoder_or_encoder_layer() -> None:
    from tuneplan.simulate.report import module_group

    # PEFT prefix dropped
    assert module_group("base_model.model.model.layers.3.mlp.up_proj") == "model.layers.3"
    assert module_group("bert.encoder.layer.23.attention.self") == "bert.encoder.layer.23"
    assert module_group("transformer.h.1.mlp.act") == "transformer.h.1"
    assert module_group("model.graph.0.x") == "model.graph.0.x"  # "h.N" only as a whole path component
    assert module_group("") == "(autograd engine: backward)"
