"""DDP on the fake process group (``distributed.py``): its reducer's gradient buckets, emulated."""

from __future__ import annotations

from typing import Any

import torch

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
