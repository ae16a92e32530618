"""DeepSpeed ZeRO simulated with DeepSpeed's own engine on a fake process group (simulate/zero.py).

Needs the ``deepspeed`` package (the ``deepspeed`` extra; the CI installs it): without it those tests
skip with that reason; the fallback test runs everywhere.
Expected bytes by hand from DeepSpeed 0.19's ZeRO-1/2 layout (``stage_1_and_2.py``): the fp32 master is a
1/N partition of the flat trainable parameters, the Adam moments are the same size, the contiguous-
gradients bucket is ``reduce_bucket_size`` elements in the 16-bit dtype, made when the first gradient is
ready and released at the end of the backward. Every allocation is rounded up to 512 B.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tuneplan.api import build_setup  # noqa: E402
from tuneplan.specs.model import model_from_config  # noqa: E402

from .sharded_tiny import KV, TINY, A, D, F, H, L, V, r512  # noqa: E402

pytestmark = pytest.mark.slow  # runs a simulated training step (pyproject.toml markers)

LAYER = H * A * D + 2 * H * KV * D + A * D * H + 3 * H * F + 2 * H
TOTAL = L * LAYER + 2 * V * H + H
BUCKET = 100_000  # reduce_bucket_size, elements


def _needs_deepspeed():
    from tuneplan.simulate.zero import deepspeed_version

    if not deepspeed_version():
        pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]')")


def _run(n: int, stage: int, precision: str = "bf16-mixed"):
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    spec = model_from_config(TINY, "tiny-llama-zero")
    setup = resolve_setup(build_setup(spec, method="full", precision=precision, seq=64, attn="eager",
                                      gradient_checkpointing=False, gpus=n, zero=stage,
                                      ds_reduce_bucket=BUCKET), spec)
    return simulate_run(spec, setup, get_profile("hf"))


def test_zero2_partitions_master_and_moments_and_buckets_the_backward_only() -> None:
    _needs_deepspeed()
    from tuneplan.simulate.report import build_report

    n = 2
    assert TOTAL % n == 0
    run = _run(n, 2)
    assert "DeepSpeed ZeRO" in run.wrapper
    b = build_report(run).breakdown
    # fp32 master partition + exp_avg + exp_avg_sq, one 1/N partition each; fused AdamW's step counter
    # is a device scalar (one 512-byte block)
    assert b.components["optimizer_states"] == 3 * r512(4 * TOTAL // n) + 512
    buckets = [blk for blk in run.result.blocks
               if blk.size == r512(2 * BUCKET) and blk.op.startswith("aten.empty")]
    assert buckets, "no contiguous-gradients bucket of reduce_bucket_size bf16 elements"
    for blk in buckets:
        assert blk.phase.endswith(".backward")  # made at the first gradient, not at construction


def test_fp16_zero_runs_whatever_the_host_processor_supports(monkeypatch) -> None:
    # DeepSpeed's CPU accelerator answers fp16 support from the host's oneDNN (AVX512-FP16 / AMX-FP16);
    # the simulated card is a GPU: an fp16 ZeRO run is simulated on a processor without them too, with the
    # same fp32 master partition and moments as bf16 (3 x 4 B x TOTAL / N, plus the step counter)
    _needs_deepspeed()
    import torch

    from tuneplan.simulate.report import build_report

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", lambda: False)
    run = _run(2, 2, precision="fp16-mixed")
    assert "DeepSpeed ZeRO" in run.wrapper
    assert build_report(run).breakdown.components["optimizer_states"] == 3 * r512(4 * TOTAL // 2) + 512
    from deepspeed.accelerator import get_accelerator

    assert "is_fp16_supported" not in vars(get_accelerator())  # answered during initialize only


def test_two_zero_simulations_in_one_process() -> None:
    # DeepSpeed caches the job's process groups in module globals; each simulation has its own fake group
    _needs_deepspeed()
    first = _run(2, 3)
    second = _run(2, 3)
    assert first.wrapper == second.wrapper


def test_without_deepspeed_zero_falls_back_with_the_reason(monkeypatch) -> None:
    import tuneplan.simulate.zero as zero
    from tuneplan.simulate import simulate_report

    monkeypatch.setattr(zero, "deepspeed_version", lambda: "")
    spec = model_from_config(TINY, "tiny-llama-zero")
    rep = simulate_report(spec, build_setup(spec, method="full", seq=64, gpus=2, zero=2))
    assert "deepspeed is not installed" in rep.fallback
    assert rep.breakdown.engine == "analytic"


@pytest.mark.parametrize("flags", [("--gpus", "2", "--zero", "2"),
                                   ("--gpus", "4", "--zero", "3", "--offload", "all")])
def test_cli_zero_simulate_json_is_one_object_on_stdout(tmp_path, flags) -> None:
    # DeepSpeed logs and reports its JIT builds on stdout; --json must still print exactly one JSON object,
    # the simulate engine with DeepSpeed's engine named as the wrapper (ZeRO-Offload too: what it offloads
    # is in the notes, and host memory is reported)
    import json
    import os
    import subprocess
    import sys

    _needs_deepspeed()
    offload = "--offload" in flags
    if offload:
        from tuneplan.simulate.zero import cpu_adam_loads

        if cpu_adam_loads():
            pytest.skip(cpu_adam_loads())
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    args = ["estimate", str(cfg), "--method", "full", "--seq", "64", *flags, "--engine", "simulate", "--json"]
    r = subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["engine"] == "simulate" and "DeepSpeed ZeRO engine" in d["wrapper"]
    if offload:
        assert any("offloaded to CPU memory" in n for n in d["notes"])
        assert d["per_gpu"]["host_bytes"] > 0


def test_a_zero_simulation_leaves_the_process_environment_as_it_was(monkeypatch) -> None:
    """DeepSpeed reads LOCAL_RANK while the simulated step runs; afterwards the caller's environment is as
    it was: a LOCAL_RANK left behind makes a later TrainingArguments in the same process (the exported
    script's checks, a notebook) try to start torch.distributed."""
    import os

    from tuneplan.simulate.zero import local_rank_env

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with local_rank_env():
        assert os.environ["LOCAL_RANK"] == "0"
    assert "LOCAL_RANK" not in os.environ
    monkeypatch.setenv("LOCAL_RANK", "3")  # a launcher's own value is kept, inside and after
    with local_rank_env():
        assert os.environ["LOCAL_RANK"] == "3"
    assert os.environ["LOCAL_RANK"] == "3"
    monkeypatch.delenv("LOCAL_RANK")
    test_zero2_partitions_master_and_moments_and_buckets_the_backward_only()
    assert "LOCAL_RANK" not in os.environ


def test_the_trainers_own_optimizer_steps_the_master_partition() -> None:
    """The HF Trainer hands DeepSpeed its own optimizer (``optim``); DeepSpeed gives it the fp32 master
    partition: Adafactor keeps one full fp32 second moment of that 1-D tensor beside the master, no first
    moment (beta1 None), and its step makes ``grad**2`` and ``+ eps`` of the partition's size."""
    _needs_deepspeed()
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    n = 2
    spec = model_from_config(TINY, "tiny-llama-zero")
    setup = resolve_setup(build_setup(spec, method="full", precision="bf16-mixed", seq=64, attn="eager",
                                      gradient_checkpointing=False, gpus=n, zero=2, optimizer="adafactor",
                                      ds_reduce_bucket=BUCKET), spec)
    from tuneplan.simulate.tracker import find_peak

    run = simulate_run(spec, setup, get_profile("hf"))
    states = [b for b in find_peak(run.result).live if b.category == "optimizer_states"]
    assert sorted(b.size for b in states if b.size >= 4 * TOTAL // n) == [r512(4 * TOTAL // n)] * 2
    temps = [b for b in run.result.blocks if b.phase == "step2.optimizer" and b.size == r512(4 * TOTAL // n)]
    assert {b.op for b in temps} >= {"aten.pow.Tensor_Scalar", "aten.add.Tensor"}


def test_zero2_reduction_copies_the_bucket_it_reduces() -> None:
    """stage_1_and_2.py ``allreduce_bucket``: ``self.flatten(bucket)`` makes a new 16-bit tensor of every
    gradient the reduction takes: with a bucket the whole model fits in, one reduction at the epilogue,
    of all TOTAL gradients; the analytic epilogue row holds the bucket and that copy."""
    _needs_deepspeed()
    from tuneplan.estimator.memory_statics import memory_statics
    from tuneplan.estimator.run import resolve_run
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    bucket = 4 * TOTAL
    spec = model_from_config(TINY, "tiny-llama-zero")
    setup = resolve_setup(build_setup(spec, method="full", precision="bf16-mixed", seq=64, attn="eager",
                                      gradient_checkpointing=False, gpus=2, zero=2,
                                      ds_reduce_bucket=bucket), spec)
    run = simulate_run(spec, setup, get_profile("hf"))
    copies = [b for b in run.result.blocks if b.phase == "step2.backward" and b.op == "aten.cat.default"
              and b.size == r512(2 * TOTAL)]
    assert len(copies) == 1
    epilogue = memory_statics(resolve_run(spec, setup)).wrapped.epilogue
    assert epilogue is not None
    assert (epilogue.gradients, epilogue.reduction_copy) == (2 * bucket, 2 * TOTAL)


def test_zero2_rank0_partition_holds_every_parameter_it_overlaps() -> None:
    """stage_1_and_2.py ``copy_grads_in_partition`` sizes ``grads_in_partition`` as the sum of ``numel()``
    over the parameters overlapping the rank's slice: over 8 GPUs rank 0's slice, TOTAL / 8 = 13,352
    elements, lies inside the token embedding (V x H = 16,384, first in the flat group), counted whole."""
    _needs_deepspeed()
    from tuneplan.estimator.memory_statics import memory_statics
    from tuneplan.estimator.run import resolve_run
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    n = 8
    assert TOTAL // n < V * H
    spec = model_from_config(TINY, "tiny-llama-zero")
    setup = resolve_setup(build_setup(spec, method="full", precision="bf16-mixed", seq=64, attn="eager",
                                      gradient_checkpointing=False, gpus=n, zero=2,
                                      ds_reduce_bucket=BUCKET), spec)
    run = simulate_run(spec, setup, get_profile("hf"))
    made = [b for b in run.result.blocks if b.phase.endswith("backward")
            and b.op == "aten.empty.memory_format" and b.shape == (V * H,)]
    assert made, "no grads_in_partition of the embedding's size"
    assert memory_statics(resolve_run(spec, setup)).wrapped.resident.gradients == 2 * V * H


def test_zero3_whole_parameters_never_reach_the_device() -> None:
    """Under the HF Trainer ZeRO-3 builds the model inside ``deepspeed.zero.Init``: every parameter above
    ``stage3_param_persistence_threshold`` (1e5 elements) is partitioned as it is made, never whole on the
    GPU. The simulation builds it whole and lets ``deepspeed.initialize`` partition it: the whole embedding
    and head (V' x H = 262,144 elements each) leave no block, their 1/2 partitions do."""
    _needs_deepspeed()
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    vocab = 4096
    assert vocab * H > 100_000
    spec = model_from_config(dict(TINY, vocab_size=vocab), "tiny-llama-zero3-init")
    setup = resolve_setup(build_setup(spec, method="full", precision="bf16-mixed", seq=64, attn="eager",
                                      gradient_checkpointing=False, gpus=2, zero=3), spec)
    run = simulate_run(spec, setup, get_profile("hf"))
    whole = [b for b in run.result.blocks if b.shape == (vocab, H) and b.category == "weights"]
    assert not whole
    parts = [b for b in run.result.blocks if b.phase == "setup.zero" and b.shape == (vocab * H // 2,)]
    assert len(parts) >= 2


def test_a_sequence_classifier_trains_on_one_label_per_sample() -> None:
    """A classification head (``num_labels``) trains on one class index per sample under ZeRO as on one
    GPU (simulate/step.py ``training_labels``): batch 2 runs both steps, and no (batch, seq, vocab) logits
    are ever made."""
    _needs_deepspeed()
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    spec = model_from_config(TINY, "tiny-llama-zero")
    setup = resolve_setup(build_setup(spec, method="full", precision="bf16-mixed", seq=64, batch=2,
                                      attn="eager", gradient_checkpointing=False, gpus=2, zero=2,
                                      num_labels=3, ds_reduce_bucket=BUCKET), spec)
    run = simulate_run(spec, setup, get_profile("hf"))
    phases = {b.phase for b in run.result.blocks}
    assert {"step2.forward", "step2.backward", "step2.optimizer"} <= phases
    assert not [b for b in run.result.blocks if tuple(b.shape) == (2, 64, V)]
    assert [b for b in run.result.blocks if tuple(b.shape) == (2, 3)]


def test_zero1_casts_a_full_fp32_model_on_the_host_before_moving_it() -> None:
    # the HF Trainer hands DeepSpeed a model still on the host (place_model_on_device = False); the
    # engine casts each fp32 parameter to bf16 there (_cast_module_mixed_precision) and then moves the
    # module: the fp32 parameters (4 B each) are host memory, their bf16 casts (2 B each) device memory;
    # every tensor rounded to 512 B
    _needs_deepspeed()
    run = _run(2, 1)
    layer = [H * A * D, H * KV * D, H * KV * D, A * D * H, H * F, H * F, F * H, H, H]
    numels = L * layer + [V * H, H, V * H]
    fp32 = [b for b in run.result.blocks if b.op == "parameter" and b.dtype.endswith("float32")]
    assert sum(b.size for b in fp32) == sum(r512(4 * n) for n in numels)
    assert all(b.category == "host" for b in fp32)
    casts = [b for b in run.result.blocks if b.phase == "setup.zero" and b.op == "aten._to_copy.default"
             and b.dtype.endswith("bfloat16")]
    assert sum(b.size for b in casts) == sum(r512(2 * n) for n in numels)
    assert not any(b.category == "host" for b in casts)



def test_zero_step_runs_under_the_cuda_kernel_policies(monkeypatch) -> None:
    # DeepSpeed's fp16 engine runs the model in fp16 without autocast; eager attention's
    # softmax(scores, dtype=float32) on a CUDA fp16 input is ATen's half-to-float kernel (SoftMax.cpp
    # ``softmax``), which the simulation's fake CPU tensors take only under kernels.cuda_autocast_policies
    # (test_eager_forward_softmax checks the kernel choice): the ZeRO step must run under it, as the others
    _needs_deepspeed()
    from contextlib import contextmanager

    import tuneplan.simulate.kernels as kernels

    entered: list[bool] = []
    policies = kernels.cuda_autocast_policies

    @contextmanager
    def recording():  # type: ignore[no-untyped-def]
        with policies():
            entered.append(True)
            yield

    monkeypatch.setattr(kernels, "cuda_autocast_policies", recording)
    _run(2, 2)
    assert entered


def test_zero3_initialize_casts_no_whole_parameter() -> None:
    """A model built under zero.Init reaches ``deepspeed.initialize`` already partitioned, so the engine
    skips its whole-module 16-bit cast and device move (engine.py ``_configure_distributed_model``:
    ``_cast_module_mixed_precision`` casts only ``if not is_zero_init_model``): the fp32 model of a
    bf16-mixed full fine-tune leaves no whole bf16 embedding or head (V' x H) before the first step, in any
    category (the step's own V' x H gradients are made in the backward)."""
    _needs_deepspeed()
    from tuneplan.simulate.engine import simulate_run
    from tuneplan.specs.profiles import get_profile, resolve_setup

    vocab = 4096
    spec = model_from_config(dict(TINY, vocab_size=vocab), "tiny-llama-zero3-cast")
    setup = resolve_setup(build_setup(spec, method="full", precision="bf16-mixed", seq=64, attn="eager",
                                      gradient_checkpointing=False, gpus=2, zero=3), spec)
    run = simulate_run(spec, setup, get_profile("hf"))
    assert not [b for b in run.result.blocks if b.phase.startswith("setup") and b.shape == (vocab, H)]
    assert [b for b in run.result.blocks if b.phase.startswith("step") and b.shape == (vocab, H)]
