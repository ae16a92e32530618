"""The wrappers' stream work, read while the storage tracker is entered (``stream_hooks``).

The caching allocator keeps blocks per CUDA stream and defers the reuse of a block recorded on
another stream (``record_stream``); see ``allocator.py``. On the CPU build nothing runs on a CUDA stream,
but the wrappers' stream code runs as written against ``torch.cpu``'s stand-ins (``torch.cpu.Stream``,
``torch.cpu.stream(...)``, ``torch.cpu.current_stream()``, ``torch.cpu.Event``), which keep the current
stream and otherwise do nothing. While the tracker is entered it reads, without
changing what the wrapper does:
- each block's stream: ``torch.cpu.current_stream()`` when it is allocated (FSDP1 all-gathers inside
  ``with state._device_handle.stream(unshard_stream)``, FSDP2 copies in and reduce-scatters inside its
  own streams' contexts);
- ``record_stream``: FSDP1's ``_no_dispatch_record_stream`` returns at once for a CPU tensor; the hook
  files the stream use on the block instead (the unsharded flat parameter recorded on the compute stream
  before it is freed, the autograd gradient recorded on the post-backward stream, the low-precision shard);
- when the CPU waits for the GPU: ``Event.record`` / ``Event.synchronize`` (FSDP1's rate limiter,
  ``limit_all_gathers``), ``Stream.synchronize`` (FSDP1's CPU-offload callback) and, after every
  micro-batch's backward, the HF Trainer's ``torch.isnan(tr_loss_step)`` check (``logging_nan_inf_filter``,
  default on), whose ``bool()`` waits for the compute stream;
- stream names: the attributes FSDP1 (``_runtime_utils._init_streams``) and FSDP2
  (``FSDPCommContext.lazy_init``) store their streams under.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tuneplan.simulate.tracker import StorageTracker

FSDP1_STREAMS = {"_unshard_stream": "fsdp unshard (all-gather)", "_pre_unshard_stream": "fsdp pre-unshard",
                 "_post_backward_stream": "fsdp post-backward (reduce-scatter)",
                 "_all_reduce_stream": "fsdp all-reduce"}
FSDP2_STREAMS = {"all_gather_copy_in_stream": "fully_shard all-gather copy-in",
                 "all_gather_stream": "fully_shard all-gather",
                 "reduce_scatter_stream": "fully_shard reduce-scatter",
                 "all_reduce_stream": "fully_shard all-reduce"}


@contextmanager
def stream_hooks(tracker: StorageTracker) -> Iterator[None]:
    """Let ``tracker`` see the wrappers' stream work (module docstring); every patch is undone on exit."""
    import torch

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, new: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, _ABSENT) if isinstance(owner, type)
                      else getattr(owner, name, _ABSENT)))
        setattr(owner, name, new)

    def at() -> int:
        return len(tracker.events)

    def record(self: Any, stream: Any = None) -> None:
        self._tuneplan_recorded = (tracker.stream_name(stream), at())

    def synchronize(self: Any) -> None:
        rec = getattr(self, "_tuneplan_recorded", None)
        if rec is not None:
            tracker.stream_ops.append((at(), "sync", rec[0], rec[1]))

    def stream_synchronize(self: Any) -> None:
        tracker.stream_ops.append((at(), "sync", tracker.stream_name(self), at()))

    def record_stream(tensor: torch.Tensor, stream: Any) -> None:
        tracker.record_use(tensor, stream)

    patch(torch.cpu.Stream, "synchronize", stream_synchronize)
    patch(torch.cpu.Event, "record", record)
    patch(torch.cpu.Event, "synchronize", synchronize)
    # only wrappers already imported (wrapped before the tracker is entered) are looked at
    ru, fp = (sys.modules.get(f"torch.distributed.fsdp.{m}") for m in ("_runtime_utils", "_flat_param"))
    for mod in (ru, fp):
        if mod is not None and hasattr(mod, "_no_dispatch_record_stream"):
            patch(mod, "_no_dispatch_record_stream", record_stream)
    if ru is not None and hasattr(ru, "_init_streams"):
        orig_init = ru._init_streams

        def init_streams(state: Any) -> None:
            orig_init(state)
            tracker.name_streams(state, FSDP1_STREAMS)

        patch(ru, "_init_streams", init_streams)
    fpg = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_param_group")
    ctx = getattr(fpg, "FSDPCommContext", None)
    if ctx is not None:
        orig_lazy = ctx.lazy_init

        def lazy_init(self: Any, *a: Any, **k: Any) -> Any:
            out = orig_lazy(self, *a, **k)
            tracker.name_streams(self, FSDP2_STREAMS)
            return out

        patch(ctx, "lazy_init", lazy_init)
    try:
        yield
    finally:
        for owner, name, old in reversed(saved):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


_ABSENT = object()
