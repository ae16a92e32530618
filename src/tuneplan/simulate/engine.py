"""Run one setup on fake tensors and return what the tracker saw (no printing, no I/O but the snapshot)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tuneplan.estimator.overhead import CUBLAS_WORKSPACE
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup


@dataclass
class SimRun:
    result: Any  # tracker.TrackResult
    seconds: float
    build_seconds: float
    paged_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    n_params: int = 0
    n_trainable: int = 0
    kernel_buffers: dict[str, int] = field(default_factory=dict)
    wrapper: str = ""  # the data-parallel wrapper that ran ("" on one GPU)
    world_size: int = 1


def _module_names(model: Any) -> dict[int, str]:
    return {id(m): (name or type(m).__name__) for name, m in model.named_modules()}


def simulate_run(spec: ModelSpec, setup: TrainSetup, prof: Profile,
                 progress: Callable[[float, str], None] | None = None, fsdp_sharding: str = "full") -> SimRun:
    from tuneplan.simulate.distributed import fake_process_group

    with warnings.catch_warnings():
        # transformers 5 / peft deprecation notices (gradient_checkpointing_* renames) are not the user's
        warnings.simplefilter("ignore", FutureWarning)
        # FSDP's use of data_ptr() on fake storages (answered by fsdp1.fsdp_storage_hooks)
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
        warnings.filterwarnings("ignore", message=".*FSDP.*")
        group = fake_process_group(setup.world_size) if (setup.fsdp or setup.zero) else nullcontext()
        with group:
            return _simulate_run(spec, setup, prof, progress, fsdp_sharding)


def _simulate_run(spec: ModelSpec, setup: TrainSetup, prof: Profile,
                  progress: Callable[[float, str], None] | None, fsdp_sharding: str = "full") -> SimRun:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tuneplan.simulate.build import build, compute_dtype, lora_targets_skipped, uses_autocast
    from tuneplan.simulate.distributed import gradient_sync_off
    from tuneplan.simulate.fsdp_qlora import train_py_no_sync
    from tuneplan.simulate.grouped_mm import grouped_mm_any_dtype
    from tuneplan.simulate.kernels import (
        KERNEL_BUFFERS,
        cuda_autocast_policies,
        cuda_dropout,
        softmax_keeps_input,
        workspace_rule,
    )
    from tuneplan.simulate.qlora import SimLinear4bit
    from tuneplan.simulate.step import run_steps
    from tuneplan.simulate.tracker import StorageTracker

    t0 = time.perf_counter()
    KERNEL_BUFFERS.clear()
    targets = resolve_targets(spec, setup.targets) if setup.is_lora else frozenset()
    tokens = setup.batch * setup.seq
    tracker = StorageTracker(workspace_rule(CUBLAS_WORKSPACE, tokens))
    tracker.vocab = spec.vocab
    notes: list[str] = []
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = build(spec, setup, prof, targets)
    wrapper = ""
    fsdp2 = setup.fsdp and setup.fsdp_version == 2
    if fsdp2:
        from tuneplan.simulate.fsdp2 import FSDP2, device_mesh, wrap_fsdp2

        mesh = device_mesh(setup.world_size)
        with fake:
            model = wrap_fsdp2(model, setup, prof, compute_dtype(setup), mesh)
        wrapper = FSDP2
        notes.append(f"simulated rank 0 of {setup.world_size} GPUs: {FSDP2}, reshard_after_forward=True "
                     "on a fake process group"
                     + (", CPUOffloadPolicy (the host-to-device copy of each shard and the "
                        "device-to-host copy of each gradient emulated)"
                        if setup.offload != "none" else ""))
    elif setup.fsdp and prof.name == "fsdp-qlora":
        from tuneplan.simulate.fsdp_qlora import TRAIN_PY, wrap_train_py

        with fake:
            model = wrap_train_py(model, setup)
        wrapper = TRAIN_PY
        notes.append(f"simulated rank 0 of {setup.world_size} GPUs: {TRAIN_PY}, FULL_SHARD on a fake process "
                     "group" + (", CPUOffload(offload_params=True)" if setup.offload != "none" else ""))
    elif setup.fsdp:
        from tuneplan.simulate.fsdp1 import FSDP1, wrap_fsdp1

        with fake:
            model = wrap_fsdp1(model, setup, prof, compute_dtype(setup), sharding=fsdp_sharding)
        wrapper = FSDP1
        notes.append(f"simulated rank 0 of {setup.world_size} GPUs: {FSDP1}, "
                     f"{'FULL_SHARD' if fsdp_sharding == 'full' else 'SHARD_GRAD_OP'} on a fake process group"
                     + (", CPUOffload(offload_params=True)" if setup.offload != "none" else ""))
    ddp = None
    if setup.world_size > 1 and not setup.fsdp and not setup.zero:
        from tuneplan.simulate.ddp import DDP, DdpBuckets

        ddp = DdpBuckets(list(model.parameters()), tracker)
        wrapper = DDP
        notes.append(f"simulated rank 0 of {setup.world_size} GPUs: DistributedDataParallel's C++ reducer "
                     "does not run on fake tensors; its gradient buckets are emulated from its code (25 MiB "
                     "buckets, first 1 MiB, gradient_as_bucket_view=False, rebuilt after the first "
                     "iteration)")
    if prof.name == "fsdp-qlora":
        from tuneplan.simulate.fsdp_qlora import legacy_causal_lm_loss

        legacy_causal_lm_loss(model)
    build_s = time.perf_counter() - t0
    if progress:
        progress(0.0, f"built {type(model).__name__} in {build_s:.1f} s")
    if setup.is_lora:
        skipped = lora_targets_skipped(model, targets)
        if skipped:
            notes.append("LoRA targets not wrapped by PEFT (not nn.Linear in transformers): "
                         f"{', '.join(skipped)}")

    names = _module_names(model)
    # The loss runs in the *ForCausalLM / *ForMaskedLM / *ForSequenceClassification forward itself (under
    # PEFT: base_model.model).
    heads = ("ForMaskedLM", "ForSequenceClassification")
    causal = next((m for m in model.modules() if "lm_head" in dict(m.named_children())
                   or (type(m).__name__.endswith(heads) and not type(m).__name__.startswith("PeftModel"))),
                  model)
    tracker.top_module = names.get(id(causal), "")

    # Register what exists before the first step: parameters, buffers, quantized storage.
    with fake:
        for name, p in model.named_parameters():
            cat = "lora_adapters" if "lora_" in name else "weights"
            p = getattr(p, "_local_tensor", p)  # fully_shard: rank 0's shard of the DTensor parameter
            b = tracker.register(p, cat, op="parameter")
            if b is not None:
                b.module = name
            tracker.param_storages.add(p.untyped_storage()._cdata)
        for name, buf in model.named_buffers():
            b = tracker.register(buf, "weights", op="buffer")
            if b is not None:
                b.module = name
        for name, m in model.named_modules():
            if isinstance(m, SimLinear4bit):
                for t in m.quant_tensors():
                    b = tracker.register(t, "quant_meta", op="quant_state")
                    if b is not None:
                        b.module = name

    def pre(mod: Any, args: Any) -> None:
        tracker.module_stack.append(names.get(id(mod), type(mod).__name__))

    def post(mod: Any, args: Any, out: Any) -> None:
        if tracker.module_stack:
            tracker.module_stack.pop()

    # always_call: non-reentrant checkpointing stops a recomputation by raising inside the layer's
    # forward (early stop); the post hook must still pop the module.
    if ddp is not None:
        with fake:
            ddp.allocate()  # DistributedDataParallel.__init__ builds the Reducer and its buckets
    offload = setup.fsdp and setup.offload != "none"
    if offload and fsdp2:
        for p in model.parameters():
            tracker.untrack(getattr(p, "_local_tensor", p))  # CPUOffloadPolicy: the sharded parameters
    elif offload:
        from tuneplan.simulate.fsdp1 import flat_params

        for fp in flat_params(model):
            # CPUOffload(offload_params=True): the sharded flat parameters live on the host
            tracker.untrack(fp)
    if setup.zero:
        return _run_zero(model, setup, prof, tracker, fake, notes, progress, t0, build_s, pre, post)
    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post, always_call=True)
    hooks = nullcontext()
    if fsdp2:
        from tuneplan.simulate.fsdp2 import fsdp2_storage_hooks

        hooks = fsdp2_storage_hooks(tracker)
    elif setup.fsdp:
        from tuneplan.simulate.fsdp1 import fsdp_storage_hooks

        hooks = fsdp_storage_hooks(tracker)
    # the Trainer runs each accumulating micro-batch under accelerator.no_sync; train.py only with CPU offload
    loop_no_sync = prof.name != "fsdp-qlora" or train_py_no_sync(setup)
    try:
        with fake, tracker, hooks, cuda_dropout(), cuda_autocast_policies(), grouped_mm_any_dtype(), \
                softmax_keeps_input(setup.softmax_keeps_input):
            opt = run_steps(model, setup, setup.optimizer or prof.default_optimizer, tracker,
                            compute_dtype(setup), uses_autocast(setup, prof), progress,
                            no_sync=(partial(gradient_sync_off, model) if fsdp2
                                     else model.no_sync if setup.fsdp and loop_no_sync else None),
                            on_step=ddp.on_step if ddp is not None else None,
                            outputs_until_step=prof.name == "fsdp-qlora",
                            # FSDP's and ZeRO's flat parameters: the groups are not modelled there
                            trainer_groups=prof.trainer_param_groups and not setup.fsdp)
    finally:
        h1.remove()
        h2.remove()
    if setup.fsdp:
        with fake:
            for buf in model.buffers():
                # FSDP's MixedPrecision casts the buffers to buffer_dtype in the root's first pre-forward
                # (new tensors made outside any module): they are the model's buffers, resident like weights
                tracker.relabel(buf, "weights")
    if offload:
        _file_offloaded_on_host(model, tracker, fsdp2)
    paged = getattr(opt, "paged_bytes", 0)
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return SimRun(tracker.result(), time.perf_counter() - t0, build_s, paged_bytes=paged, notes=notes,
                  n_params=n_params, n_trainable=n_train, kernel_buffers=dict(KERNEL_BUFFERS),
                  wrapper=wrapper, world_size=setup.world_size)


def _file_offloaded_on_host(model: Any, tracker: Any, fsdp2: bool = False) -> None:
    """FSDP1 with ``offload_params=True`` keeps the sharded flat parameters and their ``_cpu_grad`` on the
    host and steps the optimizer there (FSDP docs, ``CPUOffload``: "gradients ... offloaded to CPU ... the
    optimizer step runs on CPU"); FSDP2's ``CPUOffloadPolicy`` likewise ("offloads parameters, gradients, and
    optimizer states to CPU": the sharded parameters and the gradients copied out of the reduce-scatter,
    ``fsdp2.fsdp2_offload_emulated``): every block of the optimizer step and zero_grad is host memory."""
    from tuneplan.simulate.fsdp1 import flat_params

    for fp in ([] if fsdp2 else flat_params(model)):
        # not ``fp`` itself: a unit left unsharded (the root) points its data at the device buffer
        for t in (getattr(fp, "_local_shard", None), getattr(fp, "_cpu_grad", None)):
            if t is not None:
                tracker.untrack(t)
    for b in tracker.blocks:
        if b.phase.endswith((".optimizer", ".zero_grad")) or b.category == "optimizer_states":
            b.category = "host"


def _on_host_until_initialized(model: Any, setup: TrainSetup, tracker: Any) -> None:
    """ZeRO-1/2 under the HF Trainer: a model that bitsandbytes did not place on the GPU at its load (every
    one but QLoRA's: transformers ``Bnb4BitHfQuantizer.update_device_map``) is still on the host when
    ``deepspeed.initialize`` runs (``Trainer.__init__``: ``place_model_on_device = False`` with DeepSpeed).
    ``DeepSpeedEngine._configure_distributed_model`` casts it there to the 16-bit dtype
    (``_cast_module_mixed_precision``: ``p.data = p.data.to(param_dtype)`` for each fp32 parameter) and only
    then ``module.to(device)``: the fp32 parameters it casts (a ``-mixed`` full fine-tune's fp32 model,
    fp32 adapters or upcast trained layers) never reach the GPU. On the fake device ``.to`` moves nothing,
    so those fp32 storages are filed as host memory; their 16-bit casts are the module's weights."""
    import torch

    if setup.zero == 3 or setup.quant_bits or setup.precision == "fp32":
        return
    half = torch.float16 if setup.precision.startswith("fp16") else torch.bfloat16
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != half:
            tracker.untrack(p)


def _run_zero(model: Any, setup: TrainSetup, prof: Profile, tracker: Any, fake: Any, notes: list[str],
              progress: Callable[[float, str], None] | None, t0: float, build_s: float, pre: Any,
              post: Any) -> SimRun:
    """DeepSpeed's engine wraps the model inside the tracker (its partitions and buckets are allocations of
    the run), then the Trainer's DeepSpeed loop runs two steps (simulate/zero.py)."""
    import torch

    from tuneplan.simulate.grouped_mm import grouped_mm_any_dtype
    from tuneplan.simulate.kernels import KERNEL_BUFFERS, cuda_autocast_policies, cuda_dropout
    from tuneplan.simulate.step import make_optimizer, relabel_states
    from tuneplan.simulate.zero import (
        ZERO,
        built_under_zero_init,
        deepspeed_version,
        label_zero_buffers,
        local_rank_env,
        memory_efficient_linear,
        offload_note,
        offload_on_host,
        run_zero_steps,
        stdout_to_stderr,
        value_checks_answered,
        wrap_zero,
    )

    wrapper = ZERO.format(version=deepspeed_version())
    notes.append(f"simulated rank 0 of {setup.world_size} GPUs: {wrapper}, "
                 f"ZeRO-{setup.zero}{offload_note(setup)} on a fake process group (overflow, gradient-norm "
                 "and rank-agreement checks answered as a healthy step does)")
    tracker.host_scalars_in_optimizer = False
    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post, always_call=True)
    try:
        # cuda_autocast_policies as in the other strategies' run: no autocast under DeepSpeed's fp16 / bf16
        # engine, but an fp16 eager softmax asked in fp32 must take CUDA's half-to-float kernel (ATen
        # SoftMax.cpp ``softmax``), not the fp32 copy CPU fake tensors would make
        with (stdout_to_stderr(), local_rank_env(), fake, tracker, value_checks_answered(),
              memory_efficient_linear(setup.zero), cuda_dropout(), cuda_autocast_policies(),
              grouped_mm_any_dtype(), offload_on_host(tracker, setup)):
            tracker.phase = "setup.zero"
            params = [p for p in model.parameters() if p.requires_grad]
            # the Trainer's own optimizer (its ``optim``), which DeepSpeed steps on the fp32 master partition
            start = len(tracker.events)
            _on_host_until_initialized(model, setup, tracker)
            engine, opt = wrap_zero(model, setup, make_optimizer(setup.optimizer or prof.default_optimizer,
                                                                 params))
            initialized = len(tracker.events)
            label_zero_buffers(tracker, engine, opt)
            run_zero_steps(engine, setup, tracker, progress)
            inner = getattr(opt, "optimizer", opt)
            relabel_states(tracker, inner, setup.optimizer == "adamw-fused")
        if setup.zero == 3:
            built_under_zero_init(tracker, start, initialized)
    finally:
        h1.remove()
        h2.remove()
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    n_train = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    return SimRun(tracker.result(), time.perf_counter() - t0, build_s,
                  paged_bytes=getattr(inner, "paged_bytes", 0), notes=notes, n_params=n_params,
                  n_trainable=n_train, kernel_buffers=dict(KERNEL_BUFFERS), wrapper=wrapper,
                  world_size=setup.world_size)
