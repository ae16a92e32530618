"""FSDP1 (``FullyShardedDataParallel``) on the fake process group (``distributed.py``), its own code.

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

from tuneplan.simulate.distributed import host_pinning_skipped, layer_classes
from tuneplan.specs.load_precision import fsdp_mixed_precision
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup

FSDP1 = "torch FullyShardedDataParallel (FSDP1)"


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


def auto_wrap_policy(model: nn.Module, peft: bool) -> Any:
    if peft:
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(model)
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes(model))


def mixed_precision(setup: TrainSetup, prof: Profile, half: torch.dtype) -> Any:
    """accelerate ``set_mixed_precision`` (param, reduce and buffer dtype alike), or None where accelerate's
    mixed_precision is "no"."""
    from torch.distributed.fsdp import MixedPrecision

    from tuneplan.estimator.wrappers.fsdp1_offload import fsdp1_param_mixed_precision

    if not fsdp1_param_mixed_precision(setup, prof):
        return None
    return MixedPrecision(param_dtype=half, reduce_dtype=half, buffer_dtype=half)


def upcast_trainable_flat_params(model: nn.Module) -> None:
    """accelerate ``Accelerator.prepare_model`` after wrapping, when its mixed_precision is not "no"
    (``fsdp_mixed_precision``): each trainable 16-bit FlatParameter becomes fp32 (``param.data.to(float32)``,
    ``_handle._orig_param_dtype = float32``), DeepSpeed's fp32 master kept in the parameter itself."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for module in FSDP.fsdp_modules(model):
        param, handle = module._flat_param, module._handle
        if param is None or handle is None:
            continue  # a unit that manages no parameters
        if param.dtype != torch.float32 and param.requires_grad:
            param.data = param.data.to(torch.float32)
            handle._orig_param_dtype = torch.float32


def wrap_fsdp1(model: nn.Module, setup: TrainSetup, prof: Profile, half: torch.dtype,
               sharding: str = "full") -> nn.Module:
    """``FullyShardedDataParallel`` as accelerate builds it for the HF Trainer (call inside
    FakeTensorMode)."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    strategy = {"full": ShardingStrategy.FULL_SHARD, "grad-op": ShardingStrategy.SHARD_GRAD_OP}[sharding]
    peft = any("lora_" in n for n, _ in model.named_parameters())
    wrapped = FSDP(
        model, sharding_strategy=strategy, auto_wrap_policy=auto_wrap_policy(model, peft),
        mixed_precision=mixed_precision(setup, prof, half),
        cpu_offload=CPUOffload(offload_params=setup.offload != "none"),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=False, limit_all_gathers=True,
        use_orig_params=True, sync_module_states=False, device_id=torch.device("cpu"),
    )
    if fsdp_mixed_precision(setup, prof):
        upcast_trainable_flat_params(wrapped)
    return wrapped


def flat_params(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp._flat_param import FlatParameter

    return [p for p in model.parameters(recurse=True) if isinstance(p, FlatParameter)] or [
        h.flat_param for h in _handles(model)]


def _handles(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in model.modules() if isinstance(m, FSDP) and m._handle is not None]

