"""Rank 0 of an N-GPU job in one CPU process: a fake process group and the real FSDP1 wrapper.

``torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=N)``
(``torch.testing._internal.distributed.fake_pg``) answers every collective at once with tensors of the
right shapes, so ``FullyShardedDataParallel`` runs its own code on fake tensors: it flattens and shards
each unit, all-gathers into its padded unsharded buffer before a unit runs, frees it after (or not, per
sharding strategy and the root rule), prefetches, reduce-scatters gradients into a new sharded gradient
and offloads it. Nodes change nothing for rank 0's memory: only the world size does.

FSDP1 allocates and frees the unsharded flat parameter by resizing one storage
(``torch.distributed.utils._alloc_storage`` / ``_free_storage``), which no op sees: ``fsdp_storage_hooks``
reports each resize to the tracker as an allocation / a free of that buffer. ``_flat_param._same_storage``
compares ``data_ptr()``, which is 0 for every fake storage; the hook compares the storages themselves.

How the HF Trainer configures it (transformers ``Trainer`` + accelerate ``FullyShardedDataParallelPlugin``,
accelerate 1.x, transformers 5):
- auto-wrap: the model's ``_no_split_modules`` (its decoder layer) as ``transformer_auto_wrap_policy``;
  a PEFT model gets PEFT's ``fsdp_auto_wrap_policy`` (the same layers, plus every leaf module with a
  trainable weight, i.e. each LoRA A / B, in a unit of its own) (transformers ``update_fsdp_plugin_peft``);
- mixed precision: ``MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`` in the ``-mixed`` precision's
  16-bit type (accelerate ``set_mixed_precision``), and for QLoRA with a floating ``bnb_4bit_quant_storage``
  the storage dtype (``update_fsdp_plugin_peft``); none for pure 16-bit runs;
- FULL_SHARD, ``BackwardPrefetch.BACKWARD_PRE``, ``forward_prefetch=False``, ``limit_all_gathers=True``,
  ``use_orig_params=True``, ``CPUOffload(offload_params=True)`` for ``--offload all`` / ``optimizer`` (FSDP1
  offloads parameters, gradients and the optimizer step together), ``sync_module_states`` off (a load-time
  broadcast: no training memory);
- gradient checkpointing: transformers' own (``gradient_checkpointing_enable``), as the Trainer does.

The CPU build has no CUDA device: the compute device is the CPU. With CPU offload, what FSDP keeps on the
host (the sharded flat parameters, their ``_cpu_grad``, the optimizer states, the writeback gradient) is
filed as host memory, and the device copy of each shard that ``pre_unshard`` makes (``flat_param_to``) is
made as on a GPU (``offloaded_where_a_gpu_puts_it``; FSDP2: ``fsdp2_offload_emulated``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tuneplan.specs.setup import TrainSetup

FSDP1 = "torch FullyShardedDataParallel (FSDP1)"


@contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """A fake default process group of ``world_size`` ranks, this process rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def fsdp_storage_hooks(tracker: Any) -> Iterator[None]:
    """Report FSDP1's storage resizes (unsharded flat parameters, low-precision shards) to the tracker, and
    put on the host / the device what a GPU run with ``CPUOffload(offload_params=True)`` puts there
    (``offloaded_where_a_gpu_puts_it``)."""
    import torch.distributed.fsdp._flat_param as fp

    orig_alloc, orig_free, orig_same = fp._alloc_storage, fp._free_storage, fp._same_storage

    def alloc(tensor: torch.Tensor, size: torch.Size) -> None:
        orig_alloc(tensor, size)
        tracker.resized(tensor, "parallel_buffers", op="fsdp unshard (all-gather buffer)")

    def free(tensor: torch.Tensor) -> None:
        orig_free(tensor)
        tracker.resized(tensor, "parallel_buffers")

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        from torch.distributed.tensor import DTensor

        a = a._local_tensor if isinstance(a, DTensor) else a
        b = b._local_tensor if isinstance(b, DTensor) else b
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata

    fp._alloc_storage, fp._free_storage, fp._same_storage = alloc, free, same
    # with CPU offload, the post-backward callback waits for the device-to-host gradient copies
    # (current_stream().synchronize()); the CPU device's stream has nothing to wait for
    add_sync = not hasattr(torch.cpu.Stream, "synchronize")
    if add_sync:
        torch.cpu.Stream.synchronize = lambda self: None  # type: ignore[attr-defined]
    try:
        with offloaded_where_a_gpu_puts_it(tracker), host_pinning_skipped():
            yield
    finally:
        if add_sync:
            del torch.cpu.Stream.synchronize  # type: ignore[attr-defined]
        fp._alloc_storage, fp._free_storage, fp._same_storage = orig_alloc, orig_free, orig_same


@contextmanager
def host_pinning_skipped() -> Iterator[None]:
    """CPU offload pins the host shards and gradients (FSDP1 ``init_flat_param_attributes``, FSDP2
    ``_init_sharded_param``); pinning has no fake kernel and changes no device memory: the host tensor is kept
    as it is."""
    orig_pin = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.pin_memory = orig_pin  # type: ignore[method-assign]


@contextmanager
def offloaded_where_a_gpu_puts_it(tracker: Any) -> Iterator[None]:
    """FSDP1 with ``offload_params=True``: on the CPU build the compute device and the host are one device,
    so two of FSDP's tensors land on the wrong side of the PCIe bus; they are put where a GPU run has them
    (torch 2.13, ``torch/distributed/fsdp/_flat_param.py``):

    - ``_writeback_orig_params`` (``pre_unshard``, before each unshard) finds the original parameters'
      ``.grad`` set (after the forward's reshard they are views of ``_cpu_grad``, ``_use_sharded_grad_views``)
      and ``flat_param.grad`` None, so it makes ``torch.zeros_like(flat_param)`` and writes them back into it.
      With offload the sharded ``flat_param`` is ``_local_shard``, on the host (``_use_sharded_flat_param``):
      that zero gradient is host memory, dropped again by ``prepare_gradient_for_backward``. Simulated as
      device memory it put the root's and the prefetched layer's shard-size fp32 gradients at the loss.
    - a unit with no low-precision shard (no ``MixedPrecision``, or a flat parameter already in the param
      dtype: frozen 16-bit weights, bf16-stored 4-bit codes) has its host shard copied to the device by
      ``pre_unshard`` (``flat_param_to(self.device)``, when ``flat_param.device != self.device``), the
      all-gather's input; ``flat_param_to`` points the original parameters at it (``_use_sharded_views``),
      which keeps it alive until the unit reshards. On the CPU build the devices are equal and nothing is
      copied, so the copy is made here (a clone, filed as a parallel buffer), the views refreshed as
      ``flat_param_to`` does.
    """
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    orig_writeback, orig_pre = FlatParamHandle._writeback_orig_params, FlatParamHandle.pre_unshard

    def writeback(self: Any) -> bool:
        first = len(tracker.blocks)
        out = orig_writeback(self)
        if self._offload_params:
            for b in tracker.blocks[first:]:
                b.category = "host"
        return out

    def pre_unshard(self: Any) -> bool:
        ran = orig_pre(self)
        flat = self.flat_param
        low_precision_shard = self._uses_param_mixed_precision and not self._force_full_precision
        if not (self._offload_params and not low_precision_shard and self.is_sharded(flat)
                and flat.untyped_storage()._cdata == flat._local_shard.untyped_storage()._cdata):
            return ran
        with torch.no_grad():
            flat.data = flat.data.clone()
        b = tracker.block_of(flat)
        if b is not None:
            b.category, b.op = "parallel_buffers", "fsdp pre_unshard (host shard copied to the device)"
        if self._use_orig_params:
            self._use_sharded_views()
        return True

    FlatParamHandle._writeback_orig_params = writeback  # type: ignore[method-assign]
    FlatParamHandle.pre_unshard = pre_unshard  # type: ignore[method-assign]
    try:
        yield
    finally:
        FlatParamHandle._writeback_orig_params = orig_writeback  # type: ignore[method-assign]
        FlatParamHandle.pre_unshard = orig_pre  # type: ignore[method-assign]


def _layer_classes(model: nn.Module) -> set[type]:
    """accelerate ``set_auto_wrap_policy``: the classes named in the model's ``_no_split_modules``."""
    inner = model
    while hasattr(inner, "base_model") and inner.base_model is not inner:
        inner = inner.base_model
    if hasattr(inner, "model") and not hasattr(inner, "_no_split_modules"):
        inner = inner.model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    return {type(m) for m in model.modules() if type(m).__name__ in names}


def auto_wrap_policy(model: nn.Module, peft: bool) -> Any:
    if peft:
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(model)
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=_layer_classes(model))


def mixed_precision(setup: TrainSetup, half: torch.dtype) -> Any:
    """accelerate ``set_mixed_precision`` (param, reduce and buffer dtype alike), or None for pure 16-bit."""
    from torch.distributed.fsdp import MixedPrecision

    from tuneplan.estimator.wrappers.fsdp import fsdp1_param_mixed_precision

    if not fsdp1_param_mixed_precision(setup):
        return None
    return MixedPrecision(param_dtype=half, reduce_dtype=half, buffer_dtype=half)


def wrap_fsdp1(model: nn.Module, setup: TrainSetup, half: torch.dtype, sharding: str = "full") -> nn.Module:
    """``FullyShardedDataParallel`` as accelerate builds it for the HF Trainer (call inside
    FakeTensorMode)."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    strategy = {"full": ShardingStrategy.FULL_SHARD, "grad-op": ShardingStrategy.SHARD_GRAD_OP}[sharding]
    peft = any("lora_" in n for n, _ in model.named_parameters())
    return FSDP(
        model, sharding_strategy=strategy, auto_wrap_policy=auto_wrap_policy(model, peft),
        mixed_precision=mixed_precision(setup, half),
        cpu_offload=CPUOffload(offload_params=setup.offload != "none"),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=False, limit_all_gathers=True,
        use_orig_params=True, sync_module_states=False, device_id=torch.device("cpu"),
    )


def flat_params(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp._flat_param import FlatParameter

    return [p for p in model.parameters(recurse=True) if isinstance(p, FlatParameter)] or [
        h.flat_param for h in _handles(model)]


def _handles(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in model.modules() if isinstance(m, FSDP) and m._handle is not None]


DDP = "torch DistributedDataParallel (reducer buckets emulated)"
# DistributedDataParallel(bucket_cap_mb=25) default; TrainingArguments.ddp_bucket_cap_mb None
DDP_BUCKET_CAP = 25 * 1024**2


class DdpBuckets:
    """DDP's gradient buckets, from its code; the C++ ``Reducer`` itself cannot run on fake tensors (it reads
    bucket data), so what it allocates is allocated here:

    - the assignment is DDP's own: ``dist._compute_bucket_assignment_by_size`` over the trainable parameters
      in reverse order, the first bucket capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB), the others at
      ``bucket_cap_mb`` (25 MiB), one dtype per bucket (``DistributedDataParallel._ddp_init_helper``);
    - ``Reducer::initialize_buckets`` allocates one flat gradient tensor per bucket at construction and keeps
      it for the run; with ``gradient_as_bucket_view=False`` (DDP's and accelerate's default) the parameters'
      ``.grad`` are separate tensors and the bucket holds a copy for the all-reduce, so the buckets add their
      size to the gradients; with ``True`` the ``.grad`` are views of the buckets and add nothing;
    - after the first iteration ``_rebuild_buckets`` (called from the second forward's ``_pre_forward``)
      clears the buckets and allocates new ones in the order the gradients became ready.
    """

    def __init__(self, params: list[Any], tracker: Any, bucket_cap: int = DDP_BUCKET_CAP,
                 as_view: bool = False) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.tracker, self.bucket_cap, self.as_view = tracker, bucket_cap, as_view
        self.buckets: list[torch.Tensor] = []
        self.rebuilt = False

    def _assign(self, order: list[Any]) -> list[list[int]]:
        import torch.distributed as dist

        idx, _ = dist._compute_bucket_assignment_by_size(
            order, [dist._DEFAULT_FIRST_BUCKET_BYTES, self.bucket_cap], [False] * len(order))
        return idx

    def allocate(self) -> None:
        """Reducer::initialize_buckets (call inside FakeTensorMode)."""
        self.buckets = []
        if self.as_view:
            return
        order = list(reversed(self.params))
        for bucket in self._assign(order):
            n = sum(order[i].numel() for i in bucket)
            t = torch.empty(n, dtype=order[bucket[0]].dtype, device=order[bucket[0]].device)
            b = self.tracker.register(t, "gradients", op="DDP reducer bucket")
            if b is not None:
                b.category = "gradients"
            self.buckets.append(t)

    def on_step(self, step: int) -> None:
        """The second iteration's forward rebuilds the buckets (the old ones are freed first)."""
        if step == 2 and not self.rebuilt:
            self.rebuilt = True
            self.buckets = []
            self.allocate()


FSDP2 = "torch fully_shard (FSDP2)"


@contextmanager
def fsdp2_storage_hooks(tracker: Any) -> Iterator[None]:
    """Report FSDP2's storage resizes (each parameter's unsharded all-gather output) to the tracker, and
    answer its storage-identity test without ``data_ptr()``.

    ``_fsdp_param.alloc_storage`` / ``free_storage`` resize the storage of each parameter's all-gather
    output (``FSDPParam.all_gather_outputs``) in ``wait_for_unshard`` and ``reshard``; no op sees that.
    ``FSDPParam.reset_sharded_param`` (the root's lazy init) asks whether the parameter's local tensor still
    lives in ``_sharded_param_data`` by comparing ``data_ptr()``, which is 0 for every fake storage, so it
    would pad a second copy of every unevenly sharded parameter; the storages are compared here instead
    and, when they are the same, it does what it does then: keep the data, refresh the sharding spec."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as fcoll
    import torch.distributed.fsdp._fully_shard._fsdp_param as fp2
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fpg

    orig_alloc, orig_free, orig_reset = fp2.alloc_storage, fp2.free_storage, fp2.FSDPParam.reset_sharded_param

    def alloc(tensor: torch.Tensor) -> None:
        orig_alloc(tensor)
        tracker.resized(tensor, "parallel_buffers", op="fully_shard unshard (all-gather output)")

    def free(tensor: torch.Tensor) -> None:
        orig_free(tensor)
        tracker.resized(tensor, "parallel_buffers")

    def reset(self: Any) -> None:
        local = getattr(self.sharded_param, "_local_tensor", None)
        data = getattr(self, "_sharded_param_data", None)
        same = (local is not None and type(data) is torch.Tensor and data.numel() > 0
                and local.untyped_storage()._cdata == data.untyped_storage()._cdata)
        if same:
            # CPUOffloadPolicy(pin_memory=True): the shard pinned in _init_sharded_param is still pinned on a
            # GPU run (``is_pinned()``), so nothing is re-pinned either
            self._sharding_spec = self.sharded_param._spec
            return
        first = len(tracker.blocks)
        orig_reset(self)
        if self.offload_to_cpu:  # a re-padded / re-pinned shard of an offloaded parameter is host memory
            for b in tracker.blocks[first:]:
                b.category = "host"

    orig_buffer = fcoll.DefaultAllocMixin.allocate

    def buffer(self: Any, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # the flat all-gather output and reduce-scatter input / output of a group (foreach_all_gather,
        # foreach_reduce); a reduce-scatter output becomes the sharded gradients (relabelled by the step)
        t = orig_buffer(self, size, dtype=dtype, device=device)
        b = tracker.block_of(t)
        if b is not None:
            b.category, b.op = "parallel_buffers", f"fully_shard {type(self).__name__} buffer"
        return t

    fcoll.DefaultAllocMixin.allocate = buffer  # type: ignore[method-assign]
    fp2.alloc_storage, fp2.free_storage, fpg.alloc_storage = alloc, free, alloc
    fp2.FSDPParam.reset_sharded_param = reset  # type: ignore[method-assign]
    try:
        with fsdp2_offload_emulated(tracker), host_pinning_skipped():
            yield
    finally:
        fp2.alloc_storage, fp2.free_storage, fpg.alloc_storage = orig_alloc, orig_free, orig_alloc
        fcoll.DefaultAllocMixin.allocate = orig_buffer  # type: ignore[method-assign]
        fp2.FSDPParam.reset_sharded_param = orig_reset  # type: ignore[method-assign]


@contextmanager
def fsdp2_offload_emulated(tracker: Any) -> Iterator[None]:
    """``CPUOffloadPolicy``: the two host <-> device copies ``fully_shard`` makes, which the CPU build, where
    host and device are one, does not make (``.to("cpu")`` of a CPU tensor is the tensor itself). Torch 2.13:

    - ``FSDPParam.all_gather_inputs`` (``_fully_shard/_fsdp_param.py``): the host shard
      ``_sharded_param_data`` is copied to the device (``.to(self.device, non_blocking=True)``) and cast to
      the mixed-precision param dtype; the device copy is the all-gather input (freed after the copy-in) or,
      with a cast, freed once cast. Here ``_sharded_param_data`` is a device copy (a clone, a parallel
      buffer) while the real property runs;
    - ``foreach_reduce`` (``_fully_shard/_fsdp_collectives.py``): each parameter's view of the reduce-scatter
      output is copied to the host (``new_sharded_grad.to(torch.device("cpu"), non_blocking=...)``) before it
      becomes ``sharded_param.grad``, so the device output dies with the call. Here the view reaching
      ``to_sharded_dtensor`` inside ``foreach_reduce`` is cloned and the clone filed as host memory.

    Everything else of the step (the sharded parameters, their gradients, the optimizer step on them) is on
    the host on a GPU too: the engine files it there (``engine._file_offloaded_on_host``)."""
    import torch.distributed.fsdp._fully_shard._fsdp_param as fp2
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fpg

    prop: Any = fp2.FSDPParam.all_gather_inputs  # a property: its getter is what runs
    orig_reduce, orig_dtensor = fpg.foreach_reduce, fp2.FSDPParam.to_sharded_dtensor
    reducing = [False]

    def inputs(self: Any) -> list[torch.Tensor]:
        if not (self.offload_to_cpu and self.sharded_state == fp2.ShardedState.SHARDED
                and not hasattr(self._sharded_local_tensor, "fsdp_pre_all_gather")):
            return prop.fget(self)
        host = self._sharded_param_data
        with torch.no_grad():
            self._sharded_param_data = host.clone()  # .to(self.device, non_blocking=True)
        b = tracker.block_of(self._sharded_param_data)
        if b is not None:
            b.category, b.op = "parallel_buffers", "fully_shard offload: host shard copied to the device"
        try:
            return prop.fget(self)
        finally:
            self._sharded_param_data = host

    def reduce(*args: Any, **kwargs: Any) -> Any:
        reducing[0] = True
        try:
            return orig_reduce(*args, **kwargs)
        finally:
            reducing[0] = False

    def to_dtensor(self: Any, tensor: torch.Tensor) -> Any:
        if reducing[0] and self.offload_to_cpu:
            tensor = tensor.clone()  # new_sharded_grad.to(torch.device("cpu"))
            tracker.untrack(tensor)
        return orig_dtensor(self, tensor)

    fp2.FSDPParam.all_gather_inputs = property(inputs)  # type: ignore[method-assign,assignment]
    fpg.foreach_reduce, fp2.FSDPParam.to_sharded_dtensor = reduce, to_dtensor  # type: ignore[method-assign]
    try:
        yield
    finally:
        fp2.FSDPParam.all_gather_inputs = prop  # type: ignore[method-assign]
        fpg.foreach_reduce, fp2.FSDPParam.to_sharded_dtensor = orig_reduce, orig_dtensor  # type: ignore[method-assign]


def device_mesh(world_size: int) -> Any:
    """The 1-D mesh ``fully_shard`` shards over (made outside FakeTensorMode: building it runs real ops)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,))


def wrap_fsdp2(model: nn.Module, setup: TrainSetup, half: torch.dtype, mesh: Any) -> nn.Module:
    """``fully_shard`` as accelerate's ``fsdp2_prepare_model`` applies it for the HF Trainer (accelerate
    1.x, ``fsdp_version: 2``; call inside FakeTensorMode):

    - each decoder layer (the model's ``_no_split_modules``, ``transformer_auto_wrap_policy``) is a group; a
      PEFT model keeps that policy (the Trainer creates the optimizer before ``prepare`` under FSDP2, so
      ``update_fsdp_plugin_peft`` and PEFT's per-adapter policy never run): adapters shard inside their layer;
    - the input embeddings (when untied) are a group; the final norm and the output embeddings (with the input
      embeddings when tied) are one group with ``reshard_after_forward=False``; the root gets the rest with
      the default, which the root resolves to no reshard;
    - ``reshard_after_forward=True`` (FULL_SHARD), ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` in the
      16-bit type for the ``-mixed`` precisions, after the trainable parameters are upcast to fp32;
    - ``CPUOffloadPolicy()`` for offload.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mixed = setup.precision.endswith("-mixed")
    if mixed and setup.method != "qlora":  # accelerate skips the upcast when the model has Params4bit
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
    mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half) if mixed else MixedPrecisionPolicy()
    kw = dict(mesh=mesh, mp_policy=mp,
              offload_policy=CPUOffloadPolicy() if setup.offload != "none" else OffloadPolicy())
    layers = tuple(_layer_classes(model))
    with host_pinning_skipped():
        for m in list(model.modules())[::-1]:
            if m is not model and isinstance(m, layers):
                fully_shard(m, reshard_after_forward=True, **kw)
        emb_in, emb_out = model.get_input_embeddings(), model.get_output_embeddings()
        tied = emb_out is not None and emb_in.weight is emb_out.weight
        if not tied:
            fully_shard(emb_in, reshard_after_forward=True, **kw)
        norm = _final_norm(model)
        tail = [m for m in ((norm, emb_in, emb_out) if tied else (norm, emb_out)) if m is not None]
        if tail:
            fully_shard(tail, reshard_after_forward=False, **kw)
        fully_shard(model, **kw)
    return model


def _final_norm(model: nn.Module) -> nn.Module | None:
    """accelerate ``_find_final_norm``: the last direct child of ``model.<base_model_prefix>`` whose class
    name has "Norm" (None for a PEFT model, which has no such prefix: its tail group is the head alone)."""
    prefix = getattr(model, "base_model_prefix", "")
    body = getattr(model, prefix, None) if prefix else model
    if not isinstance(body, nn.Module):
        return None
    norm = None
    for _, m in body.named_children():
        if "Norm" in type(m).__name__:
            norm = m
    return norm


@contextmanager
def gradient_sync_off(model: Any) -> Iterator[None]:
    """accelerate ``Accelerator.no_sync`` under FSDP2: ``set_requires_gradient_sync(False)`` for the
    accumulating micro-batches (each group then keeps its unsharded gradient until the synced one)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
