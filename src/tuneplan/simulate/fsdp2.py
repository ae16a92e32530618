"""FSDP2 (``fully_shard``) on the fake process group (``distributed.py``), grouped as accelerate's
``fsdp2_prepare_model`` groups it, with its storage resizes reported to the tracker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tuneplan.simulate import RealStackRefuses
from tuneplan.simulate.distributed import host_pinning_skipped, layer_classes
from tuneplan.specs.load_precision import fsdp_mixed_precision
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup

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


def wrap_fsdp2(model: nn.Module, setup: TrainSetup, prof: Profile, half: torch.dtype, mesh: Any) -> nn.Module:
    """``fully_shard`` as accelerate's ``fsdp2_prepare_model`` applies it for the HF Trainer (accelerate
    1.x, ``fsdp_version: 2``; call inside FakeTensorMode):

    - each decoder layer (the model's ``_no_split_modules``, ``transformer_auto_wrap_policy``) is a group; a
      PEFT model keeps that policy (the Trainer creates the optimizer before ``prepare`` under FSDP2, so
      ``update_fsdp_plugin_peft`` and PEFT's per-adapter policy never run): adapters shard inside their layer;
    - the input embeddings (when untied) are a group; the final norm and the output embeddings (with the input
      embeddings when tied) are one group with ``reshard_after_forward=False``; the root gets the rest with
      the default, which the root resolves to no reshard;
    - ``reshard_after_forward=True`` (FULL_SHARD), ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` in the
      16-bit type where accelerate's mixed_precision is not "no" (``fsdp_mixed_precision``: the ``-mixed``
      precisions, and a pure 16-bit one the Trainer runs with bf16 / fp16), after the trainable parameters
      are upcast to fp32;
    - ``CPUOffloadPolicy()`` for offload.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mixed = fsdp_mixed_precision(setup, prof)
    if mixed and setup.method != "qlora":  # accelerate skips the upcast when the model has Params4bit
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
    mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half) if mixed else MixedPrecisionPolicy()
    kw = dict(mesh=mesh, mp_policy=mp,
              offload_policy=CPUOffloadPolicy() if setup.offload != "none" else OffloadPolicy())
    layers = tuple(layer_classes(model))
    with host_pinning_skipped():
        for m in list(model.modules())[::-1]:
            if m is not model and isinstance(m, layers):
                fully_shard(m, reshard_after_forward=True, **kw)
        emb_in, emb_out = model.get_input_embeddings(), model.get_output_embeddings()
        tied = emb_out is not None and emb_in.weight is emb_out.weight
        if not tied:
            if any(is_dtensor(p) for p in emb_in.parameters()):
                # a no-split module holding the input embeddings (BERT's BertEmbeddings) is already a group:
                # accelerate 1.16 fsdp2_prepare_model shards the embeddings again, and fully_shard takes a
                # parameter that is already a DTensor for a tensor-parallel one, whose mesh it cannot join
                # (_fsdp_param._init_sharding_spec_tp); its tied output head is left to a second group
                raise RealStackRefuses(
                    "accelerate's FSDP2 wrapping shards the input embeddings twice: the model's "
                    "_no_split_modules name a module that holds them, which becomes a group, then "
                    "accelerate makes them a group of their own and torch's fully_shard fails on the "
                    "already sharded weight")
            fully_shard(emb_in, reshard_after_forward=True, **kw)
        norm = _final_norm(model)
        tail = [m for m in ((norm, emb_in, emb_out) if tied else (norm, emb_out)) if m is not None]
        if tail:
            fully_shard(tail, reshard_after_forward=False, **kw)
        fully_shard(model, **kw)
    return model


def is_dtensor(t: torch.Tensor) -> bool:
    """Whether ``fully_shard`` already made this parameter a DTensor (its module is in a group)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


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
