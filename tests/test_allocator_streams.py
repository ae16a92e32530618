"""The caching-allocator emulation's stream rules, on hand-made allocation streams, and the tracker's view of
FSDP's streams on the tiny sharded model.

Expected sizes come from c10/cuda/CUDACachingAllocator.cpp's constants: a request of 1 MiB .. 10 MiB gets a
20 MiB large segment (``kLargeBuffer``), one <= 1 MiB a 2 MiB small segment (``kSmallBuffer``); free blocks
are looked up in the requesting stream's part of the pool only; a block ``record_stream``-ed on another
stream returns to its pool when the events recorded on those streams at its free have completed (here: once
the CPU has waited for the GPU's work queued after the free).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tuneplan.simulate.allocator import CachingAllocatorSim  # noqa: E402

MIB = 1024**2


def test_a_block_cached_by_one_stream_is_not_reused_by_another() -> None:
    one = CachingAllocatorSim()
    one.malloc(0, 8 * MIB, 8 * MIB)
    one.free(0, 8 * MIB)
    one.malloc(1, 8 * MIB, 8 * MIB)
    assert one.stats.max_reserved == 20 * MIB  # the cached block is reused

    two = CachingAllocatorSim()
    two.malloc(0, 8 * MIB, 8 * MIB, stream="side")
    two.free(0, 8 * MIB)
    two.malloc(1, 8 * MIB, 8 * MIB, stream="default")
    assert two.stats.max_reserved == 40 * MIB  # a second segment: the side stream's block stays its own
    assert two.stats.reserved_by_stream_at_peak == {"side": 20 * MIB, "default": 20 * MIB}
    two.malloc(2, 8 * MIB, 8 * MIB, stream="side")
    assert two.reserved == 40 * MIB  # the side stream reuses its own cached block


def test_record_stream_defers_reuse_until_the_use_stream_is_synchronized() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(0, 12 * MIB, 12 * MIB, stream="side")  # >= 10 MiB: a segment of exactly 12 MiB
    sim.free(0, 12 * MIB, uses=frozenset({"default"}), at=5)
    assert sim.allocated == 0 and sim.pending_bytes == 12 * MIB  # allocated drops at once
    sim.malloc(1, 12 * MIB, 12 * MIB, stream="side")
    assert sim.reserved == 24 * MIB  # the pending block is not handed out: a new segment
    sim.clock.sync(4)  # the CPU waited for the default stream, but only up to before the free
    sim.malloc(2, 12 * MIB, 12 * MIB, stream="side")
    assert sim.reserved == 36 * MIB
    sim.clock.sync(5)
    sim.malloc(3, 12 * MIB, 12 * MIB, stream="side")
    assert sim.reserved == 36 * MIB and sim.pending_bytes == 0  # now it is returned and reused


def test_record_stream_on_the_blocks_own_stream_changes_nothing() -> None:
    sim = CachingAllocatorSim()
    sim.malloc(0, 12 * MIB, 12 * MIB, stream="side")
    sim.free(0, 12 * MIB, uses=frozenset({"side"}), at=1)
    sim.malloc(1, 12 * MIB, 12 * MIB, stream="side")
    assert sim.reserved == 12 * MIB and sim.stats.deferred_frees == 0


def test_a_gpu_that_keeps_up_returns_pending_blocks_at_the_next_malloc() -> None:
    sim = CachingAllocatorSim(complete="eager")
    sim.malloc(0, 12 * MIB, 12 * MIB, stream="side")
    sim.free(0, 12 * MIB, uses=frozenset({"default"}), at=5)
    sim.malloc(1, 12 * MIB, 12 * MIB, stream="side")
    assert sim.reserved == 12 * MIB


def test_release_cached_blocks_completes_pending_frees_first() -> None:
    sim = CachingAllocatorSim(capacity=40 * MIB)
    sim.malloc(0, 8 * MIB, 8 * MIB, stream="side")  # 1..10 MiB: a 20 MiB segment
    sim.free(0, 8 * MIB, uses=frozenset({"default"}), at=1)
    sim.malloc(1, 12 * MIB, 12 * MIB, stream="default")  # 12 MiB segment: 32 MiB reserved
    sim.malloc(2, 12 * MIB, 12 * MIB, stream="default")  # 44 > 40: synchronize, release the side segment
    assert not sim.stats.oom and sim.reserved == 24 * MIB and sim.stats.cuda_frees == 1


@pytest.fixture(scope="module")
def tiny_fsdp1():
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tuneplan.api import build_setup
    from tuneplan.simulate import simulate_report
    from tuneplan.specs.model import model_from_config

    from .sharded_tiny import TINY

    spec = model_from_config(TINY, "tiny-llama-streams")
    return simulate_report(spec, build_setup(spec, method="full", precision="fp32", optimizer="adamw", seq=64,
                                             attn="eager", gradient_checkpointing=False, gpus=2, fsdp=True))


def test_fsdp1_all_gathers_and_reduce_scatters_on_their_own_streams(tiny_fsdp1) -> None:
    from .sharded_tiny import KV, A, D, F, H, V

    layer_fp32 = 4 * (H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F + 2 * H)
    root_fp32 = 4 * (2 * V * H + H)  # embed_tokens, lm_head, final norm
    a = tiny_fsdp1.allocator
    by = a["reserved_by_stream_bytes"]
    # every unsharded layer (and the root unit) and every sharded gradient of the tiny model is under 1 MiB,
    # and at most two layers and the root live or pending at once (under 2 MiB): one small segment per stream
    assert 2 * layer_fp32 + root_fp32 < 2 * MIB
    assert by["fsdp unshard (all-gather)"] == 2 * MIB
    assert by["fsdp post-backward (reduce-scatter)"] == 2 * MIB
    # the unsharded flat parameters are record_stream-ed on the compute stream before they are freed
    assert a["deferred_frees"] > 0
    assert a["cross_stream_bytes"] == a["reserved_bytes"] - a["reserved_one_stream_bytes"] > 0
    assert a["gap_bytes"] == a["reserved_bytes"] - a["allocated_bytes"]
    assert tiny_fsdp1.breakdown.reserved_peak_bytes == a["reserved_bytes"]


@pytest.mark.slow  # runs a simulated training step
def test_a_single_gpu_run_has_one_stream_and_no_cross_stream_gap() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tuneplan.api import build_setup
    from tuneplan.simulate import simulate_report
    from tuneplan.specs.model import model_from_config

    from .sharded_tiny import TINY

    spec = model_from_config(TINY, "tiny-llama-one")
    a = simulate_report(spec, build_setup(spec, method="lora", seq=64, attn="eager")).allocator
    assert list(a["reserved_by_stream_bytes"]) == ["default"]
    assert a["cross_stream_bytes"] == 0 and a["deferred_frees"] == 0
    assert a["reserved_one_stream_bytes"] == a["reserved_gpu_keeps_up_bytes"] == a["reserved_bytes"]


# ---- the analytic engine's per-stream reserve (estimator/overhead.cross_stream_reserve) --------------------
# Llama-2-7B's decoder layer: q, k, v, o 4096 x 4096, gate / up / down 4096 x 11008, two 4096 norms
LLAMA2_7B_LAYER = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096


def _cross_stream(**kw):
    from tuneplan.api import build_setup, estimate_run
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.allocator_segments import stranded_bytes
    from tuneplan.estimator.overhead import FRAGMENTATION, SEGMENT
    from tuneplan.estimator.run import resolve_run

    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    run = resolve_run(spec, build_setup(spec, **kw))
    b = estimate_run(run).breakdown
    # the same reserved figure without the per-stream part: what the loss instants strand, no stream
    at_forward, at_backward = stranded_bytes(run, run.setup.batch, run.setup.seq)
    held = max(b.instants["forward"] + at_forward, b.instants["backward_start"] + at_backward)
    top = max(int(b.allocated_peak_bytes * (1 + FRAGMENTATION)), held)
    return b.reserved_peak_bytes - -(-top // SEGMENT) * SEGMENT


def test_fsdp1_holds_the_rate_limiters_freed_units_and_gradients() -> None:
    # full fine-tune, bf16-mixed: one layer unsharded in bf16 (u) and its unsharded bf16 gradient (g = u);
    # the rate limiter lets two freed units (and two recorded gradients) wait for the compute stream
    u = 2 * LLAMA2_7B_LAYER
    assert _cross_stream(method="full", gpus=4, fsdp=True, gradient_checkpointing=True) == 2 * (u + u)


def test_fsdp2_caches_two_all_gather_outputs_and_one_reduce_scatter_input() -> None:
    u = 2 * LLAMA2_7B_LAYER
    got = _cross_stream(method="full", gpus=4, fsdp=True, fsdp_version=2, gradient_checkpointing=True)
    assert got == 3 * u


def test_lora_under_fsdp1_holds_the_adapters_gradients_not_the_layers() -> None:
    # r=16 on q_proj and v_proj: 2 x (4096 x 16 + 16 x 4096) trainable per layer, gradients in bf16
    u, g = 2 * LLAMA2_7B_LAYER, 2 * 2 * (4096 * 16 + 16 * 4096)
    assert _cross_stream(method="lora", rank=16, targets="q_proj,v_proj", gpus=2, fsdp=True) == 2 * (u + g)


@pytest.mark.parametrize("kw", [dict(method="lora"), dict(method="full", gpus=2),
                                dict(method="full", gpus=2, zero=3)])
def test_no_cross_stream_reserve_without_fsdp(kw) -> None:
    assert _cross_stream(**kw) == 0


def test_stream_gap_benchmark_pattern_emulated() -> None:
    """benchmarks/stream_gap.py's FSDP1-like pattern (256 MiB layer buffers: exact 256 MiB segments).
    GPU-bound: at layer i the rate limiter has waited for the free event of layer i - 2 only, so the
    buffer of layer i - 1 is still pending and layer i reuses layer i - 2's: two buffers in the side
    stream's pool. A GPU that keeps up returns each buffer at the next allocation: one."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from stream_gap import emulate

    shape = dict(layers=8, layer_mib=256, act_mib=64)
    bound = emulate(2, **shape, complete="sync")
    keeps_up = emulate(2, **shape, complete="eager")
    assert bound["reserved_by_stream_at_peak"]["side"] == 2 * 256 * MIB
    assert keeps_up["reserved_by_stream_at_peak"]["side"] == 256 * MIB
    assert bound["max_allocated"] == keeps_up["max_allocated"] == emulate(1, **shape)["max_allocated"]


def test_the_trackers_stream_hooks_are_undone_on_exit_even_when_re_entered() -> None:
    import torch

    from tuneplan.simulate.tracker import StorageTracker

    record, had_sync = torch.cpu.Event.record, hasattr(torch.cpu.Stream, "synchronize")
    t = StorageTracker()
    with t:
        patched = torch.cpu.Event.record
        assert patched is not record
        with t:  # a mode pushed again (a checkpoint's recomputation) keeps the outer hooks
            assert torch.cpu.Event.record is patched
        assert torch.cpu.Event.record is patched
        s = torch.cpu.Stream()
        with torch.cpu.stream(s):
            assert t.stream_name() == "side stream 1"
        assert t.stream_name() == "default"
    assert torch.cpu.Event.record is record and hasattr(torch.cpu.Stream, "synchronize") == had_sync


# ---- the free segments a loss instant strands (estimator/allocator_segments.py) --------------------------
def test_a_checkpointed_llama_lora_step_strands_its_mlp_blocks_norm_and_16_bit_logits() -> None:
    # Llama-2-7B, LoRA on q_proj / v_proj (PEFT's default), checkpointing, bf16-mixed, 4 x 2048 tokens:
    # - the MLP under a checkpointed forward: the SiLU output, up_proj's output and their product are live
    #   together and none is saved: 3 blocks of 8192 x 11008 x 2 B = 172 MiB (a whole number of 2 MiB);
    # - RMSNorm's fp32 block: 8192 x 4096 x 4 B = 128 MiB;
    # - the 16-bit logits, freed by the fp32 cast before the loss backward: 8192 x 32000 x 2 B = 500 MiB;
    # - the checkpoints' packing: 32 layer inputs of 8192 x 4096 x 2 B = 64 MiB, two to each 172 MiB
    #   segment (172 // 64), hold 16 x 172 = 2752 MiB for 2048 MiB of their own: 704 MiB more
    from tuneplan.api import build_setup
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.allocator_segments import stranded_bytes
    from tuneplan.estimator.run import resolve_run

    mib = 2**20
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    run = resolve_run(spec, build_setup(spec, method="lora", batch=4, seq=2048, gradient_checkpointing=True,
                                        precision="bf16-mixed"))
    packing = (16 * 172 - 32 * 64) * mib
    assert stranded_bytes(run, 4, 2048) == ((3 * 172 + 128) * mib + packing,
                                            (3 * 172 + 128 + 500) * mib + packing)
    # checkpoints in host memory pack into nothing on the device
    off = resolve_run(spec, build_setup(spec, method="lora", batch=4, seq=2048, gradient_checkpointing=True,
                                        precision="bf16-mixed", activation_offload=True))
    assert stranded_bytes(off, 4, 2048) == ((3 * 172 + 128) * mib, (3 * 172 + 128 + 500) * mib)
    # without checkpointing autograd saves the SiLU input and both operands of the product; the product,
    # which frozen down_proj does not keep, is the one MLP block left free
    run = resolve_run(spec, build_setup(spec, method="lora", batch=4, seq=2048, gradient_checkpointing=False,
                                        precision="bf16-mixed"))
    assert stranded_bytes(run, 4, 2048) == ((172 + 128) * mib, (172 + 128 + 500) * mib)
