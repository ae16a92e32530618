"""DeepSpeed ZeRO-1/2/3 on a fake process group: DeepSpeed's own engine, rank 0 of an N-GPU job.

DeepSpeed (0.19, CPU accelerator) runs as it is on fake tensors: ``deepspeed.initialize`` flattens and
partitions the 16-bit parameters, makes the fp32 master partition and the contiguous-gradients (IPG)
bucket, and ``engine.backward`` / ``engine.step`` reduce, partition, step and all-gather as on a GPU; the
collectives return at once. Five checks read tensor values, which a fake tensor has not, and are
answered as a healthy step answers them (nothing else is replaced):

- ``DeepSpeedZeroOptimizer(_Stage3).has_overflow`` (the fp16/bf16 overflow check): no overflow;
- ``is_invalid_grad_norm`` (a NaN / inf gradient norm skips the step): a finite norm;
- ``assert_ints_same_as_other_ranks`` (ZeRO-3's check that every rank traced the same module order,
  by a broadcast from rank 0): rank 0 agrees with itself;
- ``_has_inf_or_nan`` (ZeRO-Offload's per-gradient overflow tracker): finite;
- ``complete_grad_norm_calculation_for_cpu_offload`` (ZeRO-Offload sums the per-parameter gradient norms
  on the host, ``.item()`` / ``float()``): a finite norm, as the 0-dim host tensor it returns.

ZeRO-3 runs with DeepSpeed's memory-efficient linear, as a model built under ``zero.Init`` does.

Configured as the HF Trainer's DeepSpeed integration does with a config that names no optimizer
(transformers ``deepspeed_optim_sched``: the Trainer's own optimizer, ``zero_allow_untested_optimizer``):
``bf16`` / ``fp16`` from the precision, the stage, ``reduce_bucket_size``, ``stage3_prefetch_bucket_size``
and ``overlap_comm`` when set (DeepSpeed's defaults otherwise), ``gradient_clipping`` 1.0
(``max_grad_norm``), ``gradient_accumulation_steps``. The Trainer calls ``engine.backward(loss)`` and
``engine.step()`` for every micro-batch; DeepSpeed steps at the accumulation boundary.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any

import torch
from torch import nn

from tuneplan.simulate.step import training_labels
from tuneplan.specs.setup import TrainSetup

ZERO = "DeepSpeed ZeRO engine (deepspeed {version})"


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """DeepSpeed writes to stdout: its logger's handler (made at import, on the stdout of that moment) and
    the op builders' ``print`` of a JIT build. A command's stdout carries its result (one JSON object with
    ``--json``), so while DeepSpeed is imported or runs, stdout is stderr."""
    with redirect_stdout(sys.stderr):
        yield


def deepspeed_version() -> str:
    """The installed DeepSpeed's version, '' when it is not installed."""
    try:
        with stdout_to_stderr():
            import deepspeed
    except Exception:  # not installed, or its import fails on this machine
        return ""
    return str(getattr(deepspeed, "__version__", "?"))


def ds_config(setup: TrainSetup) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": setup.zero}
    if setup.ds_reduce_bucket:
        zero["reduce_bucket_size"] = setup.ds_reduce_bucket
    if setup.ds_prefetch_bucket:
        zero["stage3_prefetch_bucket_size"] = setup.ds_prefetch_bucket
    if setup.ds_overlap_comm is not None:
        zero["overlap_comm"] = setup.ds_overlap_comm
    if setup.offload in ("optimizer", "all"):
        # as the exported config writes it (export/deepspeed_json.py): the optimizer step on the CPU with
        # DeepSpeed's CPU Adam, which ZeRO-Offload builds from a named "AdamW" (engine
        # _configure_basic_optimizer), and the 16-bit parameter partitions on the CPU with ``all`` (ZeRO-3)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if setup.offload == "all":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": setup.batch,
        "gradient_accumulation_steps": setup.grad_accum,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": setup.precision.startswith("bf16")},
        "fp16": {"enabled": setup.precision.startswith("fp16")},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
    }
    if setup.offload in ("optimizer", "all"):
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.999], "eps": 1e-8,
                                                         "weight_decay": 0.0}}
    return cfg


@contextmanager
def value_checks_answered() -> Iterator[None]:
    """The value-reading checks of a ZeRO step, answered as a healthy step answers them."""
    import deepspeed.runtime.zero.partitioned_param_coordinator as coord
    import deepspeed.runtime.zero.stage3 as s3
    import deepspeed.runtime.zero.stage_1_and_2 as s12

    z12, z3 = s12.DeepSpeedZeroOptimizer, s3.DeepSpeedZeroOptimizer_Stage3
    norm12 = z12.complete_grad_norm_calculation_for_cpu_offload
    norm3 = z3.complete_grad_norm_calculation_for_cpu_offload
    saved = (z12.has_overflow, z3.has_overflow, s12.is_invalid_grad_norm, s3.is_invalid_grad_norm,
             coord.assert_ints_same_as_other_ranks, vars(z12)["_has_inf_or_nan"], vars(z3)["_has_inf_or_nan"],
             norm12, norm3)
    z12.has_overflow = lambda self, *a, **k: False  # type: ignore[method-assign]
    z3.has_overflow = lambda self, *a, **k: False  # type: ignore[method-assign]
    s12.is_invalid_grad_norm = s3.is_invalid_grad_norm = lambda norm: False
    coord.assert_ints_same_as_other_ranks = lambda ints: None
    # ZeRO-Offload's per-gradient overflow tracker (update_offload_overflow_tracker) reads the same check
    z12._has_inf_or_nan = z3._has_inf_or_nan = staticmethod(lambda x, j=None: False)  # type: ignore[method-assign]
    # ZeRO-1/2 offload adds the per-parameter gradient norms up in Python (``.item()``) and returns a
    # 0-dim tensor on the host: a finite norm
    z12.complete_grad_norm_calculation_for_cpu_offload = (  # type: ignore[method-assign]
        lambda self, params: torch.tensor(1.0, device=self.device, dtype=torch.float))
    z3.complete_grad_norm_calculation_for_cpu_offload = (  # type: ignore[method-assign]
        lambda self, params: torch.tensor(1.0, dtype=torch.float))  # stage3: ``total_norm.cpu()``
    try:
        yield
    finally:
        (z12.has_overflow, z3.has_overflow, s12.is_invalid_grad_norm, s3.is_invalid_grad_norm,  # type: ignore[method-assign]
         coord.assert_ints_same_as_other_ranks, z12._has_inf_or_nan, z3._has_inf_or_nan,
         norm12, norm3) = saved


@contextmanager
def memory_efficient_linear(stage: int) -> Iterator[None]:
    """ZeRO-3 under the HF Trainer builds the model inside ``deepspeed.zero.Init`` (transformers'
    ``from_pretrained`` when ZeRO-3 is configured), which replaces ``torch.nn.functional.linear`` by
    ``zero3_linear_wrap`` for the rest of the process (``_enable_mem_efficient_linear``: "This will persist
    unless manually reset"): its autograd function saves the weight parameter, not the ``weight.t()`` view
    that plain ``F.linear`` saves, so a gathered weight is not kept alive after the module releases it."""
    if stage != 3:
        yield
        return
    import torch.nn.functional as fn
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    saved = fn.linear
    fn.linear = zero3_linear_wrap
    try:
        yield
    finally:
        fn.linear = saved


def forget_process_groups() -> None:
    """DeepSpeed caches the process groups of the job (``deepspeed.utils.groups``) and its communication
    backend (``deepspeed.comm.comm.cdb``) in module globals; each simulation has a fake group of its own,
    destroyed at its end, so a second simulation in the same process must not find the first one's."""
    import re

    import deepspeed.comm.comm as comm
    import deepspeed.utils.groups as groups

    for name, value in list(vars(groups).items()):
        if re.fullmatch(r"_[A-Z][A-Z_]*", name) and not isinstance(value, str):
            setattr(groups, name, {} if isinstance(value, dict) else None)
    groups.mesh_device = None
    for name in ("cdb", "nccl_backend", "mpi_backend", "ccl_backend", "hccl_backend"):
        if hasattr(comm, name):
            setattr(comm, name, None)


@contextmanager
def local_rank_env() -> Iterator[None]:
    """``LOCAL_RANK`` = 0 while the simulated ZeRO step runs, as DeepSpeed's launcher would set it (the
    engine and zero/utils.py read ``os.environ["LOCAL_RANK"]`` for the device index), then the caller's
    environment as it was: left set, it makes a later ``TrainingArguments`` in the same process start
    torch.distributed."""
    before = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = before if before is not None else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = before


def wrap_zero(model: nn.Module, setup: TrainSetup, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """``deepspeed.initialize`` on the fake process group (call inside FakeTensorMode, the tracker on, and
    inside :func:`local_rank_env`)."""
    import deepspeed

    from tuneplan.simulate.build import data_assignment_apply
    from tuneplan.simulate.zero_accelerator import gpu_dtypes_answered

    forget_process_groups()
    cfg = ds_config(setup)
    # a config that names the optimizer (offload: DeepSpeed's CPU Adam) takes no client optimizer
    client = None if "optimizer" in cfg else optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    with data_assignment_apply(), gpu_dtypes_answered():
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=client, config=cfg,
                                                 model_parameters=params if client is None else None,
                                                 dist_init_required=False)
    return engine, opt


def built_under_zero_init(tracker: Any, start: int, end: int) -> None:
    """ZeRO-3 as the HF Trainer runs it: ``TrainingArguments(deepspeed=...)`` comes before
    ``from_pretrained``, which then builds the model inside ``deepspeed.zero.Init`` (transformers
    ``is_deepspeed_zero3_enabled``): partition_parameters.py partitions every parameter as its module is
    made, and the checkpoint is copied into the partitions a few tensors at a time on the host; a whole
    parameter never exists on the GPU. Here the model is built whole on fake tensors and
    ``deepspeed.initialize`` partitions it (events ``start`` to ``end``) into the same partitions: the whole
    parameters it frees there are taken out of the record (their events dropped, the later indices
    renumbered, the stream log with them); what it keeps whole (``stage3_param_persistence_threshold``) stays,
    as zero.Init keeps it. The 16-bit casts of the whole parameters ``initialize`` makes and frees on the
    way (engine.py ``_configure_distributed_model``: ``_cast_module_mixed_precision`` and ``module.to``
    run only when ``not is_zero_init_model``) are taken out the same way: a model built under zero.Init
    never has them. What this leaves unchecked: the instants of loading the checkpoint (one module
    gathered at a time) and the order of those allocations, before the first step."""
    drop = {b.bid for b in tracker.blocks
            if start <= b.freed_at < end and (
                (b.phase == "setup" and b.category in ("weights", "quant_meta"))
                or (b.phase == "setup.zero" and b.op == "aten._to_copy.default"))}
    if not drop:
        return
    kept = [e for e in tracker.events if e.block.bid not in drop]
    before = [0] * (len(tracker.events) + 1)  # old event index -> kept events before it
    n = 0
    for i, e in enumerate(tracker.events):
        before[i] = n
        n += e.block.bid not in drop
    before[len(tracker.events)] = n
    for i, e in enumerate(kept):
        e.index = i
        if not e.alloc:
            e.block.freed_at = i
    tracker.events[:] = kept
    tracker.blocks[:] = [b for b in tracker.blocks if b.bid not in drop]
    tracker.stream_ops[:] = [(before[min(op[0], len(before) - 1)], op[1], op[2],
                              before[min(op[3], len(before) - 1)]) for op in tracker.stream_ops]


def offload_note(setup: TrainSetup) -> str:
    """How the run offloads, for the simulation's note ('' without offload)."""
    if setup.offload == "none":
        return ""
    where = "optimizer states and parameter partitions" if setup.offload == "all" else "optimizer states"
    return (f" with {where} offloaded to CPU memory (DeepSpeed's CPU Adam; its compiled in-place update is "
            "skipped on fake tensors)")


def cpu_adam_loads() -> str:
    """'' when DeepSpeed's CPU Adam op (a C++ extension, built on first use) loads here, else why not."""
    try:
        with stdout_to_stderr():
            from deepspeed.ops.op_builder import CPUAdamBuilder

            builder = CPUAdamBuilder()
            if not builder.is_compatible(verbose=False):
                return "DeepSpeed's CPU Adam op is not compatible with this machine"
            builder.load(verbose=False)
    except Exception as exc:  # no compiler, no ninja, a failed build
        return f"DeepSpeed's CPU Adam op does not build here ({type(exc).__name__})"
    return ""


@contextmanager
def cpu_adam_kernel_answered(inner: Any) -> Iterator[None]:
    """DeepSpeedCPUAdam.step allocates its states in Python (``torch.zeros_like`` on the host partition) and
    then calls the compiled ``adam_update``, which updates parameter and states in place through their data
    pointers (a fake tensor has none): the kernel call is skipped; it allocates nothing."""
    kernel = getattr(inner, "ds_opt_adam", None)
    if kernel is None:
        yield
        return

    class _InPlaceUpdate:
        def __getattr__(self, name: str) -> Any:
            if name in ("adam_update", "adam_rollback"):
                return lambda *a, **k: None
            return getattr(kernel, name)

    inner.ds_opt_adam = _InPlaceUpdate()
    try:
        yield
    finally:
        inner.ds_opt_adam = kernel


def run_zero_steps(engine: Any, setup: TrainSetup, tracker: Any,
                   progress: Callable[[float, str], None] | None, steps: int = 2) -> None:
    """The HF Trainer's loop under DeepSpeed: ``engine.backward(loss)``, ``engine.step()`` per micro-batch."""
    ids = torch.zeros((setup.batch, setup.seq), dtype=torch.long)
    labels = training_labels(setup, ids)
    total, done = steps * setup.grad_accum, 0
    for step in range(1, steps + 1):
        for _ in range(setup.grad_accum):
            tracker.phase = f"step{step}.forward"
            outputs = engine(input_ids=ids, labels=labels)
            loss = outputs.loss
            del outputs
            tracker.phase = f"step{step}.backward"
            engine.backward(loss)
            del loss
            tracker.phase = f"step{step}.optimizer"
            engine.step()
            done += 1
            if progress:
                progress(done / total, f"step {step}")


def label_zero_buffers(tracker: Any, engine: Any, opt: Any) -> None:
    """File what ``deepspeed.initialize`` allocated: every block it left live is a DeepSpeed buffer (the
    contiguous-gradients bucket, the flat 16-bit groups, partition bookkeeping) unless it is a module
    parameter or its ZeRO-3 partition (weights) or an fp32 master partition (optimizer states, as the
    analytic engine files the master with the Adam states)."""
    for b in tracker.blocks:
        if b.phase == "setup.zero" and b.freed_at < 0 and b.category != "host":
            b.category = "parallel_buffers"
    for p in engine.module.parameters():
        tracker.relabel(getattr(p, "ds_tensor", None), "weights")
        tracker.relabel(p, "weights")
    flats = getattr(opt, "bit16_groups_flat", None) or getattr(opt, "fp16_partitioned_groups_flat", None)
    for flat in flats or ():
        tracker.relabel(flat, "weights")
    inner = getattr(opt, "optimizer", None)
    for group in getattr(inner, "param_groups", ()):
        for p in group["params"]:
            tracker.relabel(p, "optimizer_states")
    file_offloaded_partitions(tracker, engine, opt)


def file_offloaded_partitions(tracker: Any, engine: Any, opt: Any) -> None:
    """The host buffers DeepSpeed makes on its offload device without pinning them (``offload_on_host``
    files the pinned ones), by identity, DeepSpeed 0.19.8:
    - ZeRO-1/2 ``cpu_offload``: ``single_partition_of_fp32_groups`` (the fp32 master, ``.to(self.device)``)
      and their ``.grad`` (``initialize_optimizer_states``);
    - ZeRO-3 ``offload_optimizer``: ``fp32_partitioned_groups_flat`` (``_create_fp32_partitions``:
      ``.to(subgroup_to_device)`` then ``clone``) and their ``.grad``;
    - ZeRO-3 ``offload_param``: every parameter's partition ``ds_tensor`` and the flat 16-bit groups
      (``fp16_partitioned_groups_flat``, views of ``param_groups_fp16_flat_cpu_memory``)."""
    if getattr(opt, "cpu_offload", False):
        masters = getattr(opt, "single_partition_of_fp32_groups", ())
    elif getattr(opt, "offload_optimizer", False):
        masters = getattr(opt, "fp32_partitioned_groups_flat", ())
    else:
        masters = ()
    for flat in masters:
        tracker.relabel(flat, "host")
        tracker.relabel(getattr(flat, "grad", None), "host")
    if getattr(opt, "offload_param", False):
        for p in engine.module.parameters():
            tracker.relabel(getattr(p, "ds_tensor", None), "host")
        for flat in getattr(opt, "fp16_partitioned_groups_flat", ()):
            tracker.relabel(flat, "host")


@contextmanager
def offload_on_host(tracker: Any, setup: TrainSetup) -> Iterator[None]:
    """ZeRO-Offload: file what a real run keeps in host memory as ``host`` (not device memory).

    On the CPU accelerator the device and the host are the same device, so what lives where is told by
    DeepSpeed's own calls (0.19.8):
    - every buffer it pins (``get_accelerator().pin_memory``, ``pin_memory: true`` as the exported config
      sets it) is host memory: the fp32 master partitions and their gradient buffers (stage_1_and_2.py
      ``__init__`` / ``initialize_optimizer_states``, stage3.py ``_create_fp32_partitions``,
      ``_create_fp16_sub_groups`` / ``grad_partitions_flat_buffer``), and with ``offload_param`` the 16-bit
      parameter partitions (partition_parameters.py ``_partition_param``, stage3.py
      ``param_groups_fp16_flat_cpu_memory``);
    - everything ``DeepSpeedCPUAdam.step`` allocates (its states, on the host partition).
    What DeepSpeed makes on the accelerator (the 16-bit model or its gathered layers, the reduce bucket,
    ``temp_grad_buffer_for_gpu_offload``) stays device memory."""
    if setup.offload == "none":
        yield
        return
    from deepspeed.accelerator import get_accelerator
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    acc = get_accelerator()
    pin, step = acc.pin_memory, DeepSpeedCPUAdam.step

    def pinned(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        out = pin(tensor, *args, **kwargs)
        tracker.relabel(out, "host")
        return out

    def host_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = len(tracker.blocks)
        with cpu_adam_kernel_answered(self):
            out = step(self, *args, **kwargs)
        for b in tracker.blocks[first:]:
            b.category = "host"
        return out

    acc.pin_memory = pinned
    DeepSpeedCPUAdam.step = host_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        acc.pin_memory = pin
        DeepSpeedCPUAdam.step = step  # type: ignore[method-assign]
