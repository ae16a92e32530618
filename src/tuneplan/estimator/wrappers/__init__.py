"""The data-parallel wrappers, one file each, and the table the run is resolved against.

A wrapper (``base.Wrapper``) says what it keeps on each GPU at each instant of the step and what it
communicates; ``wrapper_for`` picks the first row of ``WRAPPERS`` that applies to the setup, once, when the
run is resolved (``estimator/run.py``). Adding a wrapper: its own file, a row here (before any row that would
also apply), and a test.
"""

from __future__ import annotations

from tuneplan.estimator.wrappers.base import Wrapper
from tuneplan.estimator.wrappers.ddp import Ddp
from tuneplan.estimator.wrappers.fsdp import Fsdp1, Fsdp2
from tuneplan.estimator.wrappers.zero import Zero1, Zero2, Zero3
from tuneplan.specs.setup import TrainSetup

__all__ = ["WRAPPERS", "Wrapper", "wrapper_for"]

WRAPPERS: tuple[Wrapper, ...] = (
    Fsdp1(),  # torch FullyShardedDataParallel (flat parameters)
    Fsdp2(),  # torch fully_shard
    Zero1(),  # DeepSpeed ZeRO stage 1 (optimizer states partitioned)
    Zero2(),  # DeepSpeed ZeRO stage 2 (and gradients)
    Zero3(),  # DeepSpeed ZeRO stage 3 (and parameters)
    Ddp(),  # DistributedDataParallel, or one process with no wrapper
)


def wrapper_for(setup: TrainSetup) -> Wrapper:
    """The wrapper that runs ``setup``: the first row of ``WRAPPERS`` that applies."""
    for wrapper in WRAPPERS:
        if wrapper.applies(setup):
            return wrapper
    raise ValueError(f"no data-parallel wrapper for zero={setup.zero}, fsdp={setup.fsdp}")
