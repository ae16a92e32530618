"""Rank 0 of an N-GPU job in one CPU process: the fake process group and what every wrapper shares.

``torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=N)``
(``torch.testing._internal.distributed.fake_pg``) answers every collective at once with tensors of the
right shapes, so the wrappers run their own code on fake tensors. Nodes change nothing for rank 0's
memory: only the world size does. The wrappers themselves: ``fsdp1.py`` (``FullyShardedDataParallel``),
``fsdp2.py`` (``fully_shard``), ``ddp.py`` (DDP's reducer buckets, emulated), ``zero.py`` (DeepSpeed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


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


def layer_classes(model: nn.Module) -> set[type]:
    """accelerate ``set_auto_wrap_policy``: the classes named in the model's ``_no_split_modules``."""
    inner = model
    while hasattr(inner, "base_model") and inner.base_model is not inner:
        inner = inner.base_model
    if hasattr(inner, "model") and not hasattr(inner, "_no_split_modules"):
        inner = inner.model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    return {type(m) for m in model.modules() if type(m).__name__ in names}


@contextmanager
def gradient_sync_off(model: Any) -> Iterator[None]:
    """accelerate ``Accelerator.no_sync`` under FSDP2: ``set_requires_gradient_sync(False)`` for the
    accumulating micro-batches (each group then keeps its unsharded gradient until the synced one)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
