"""DDP (``torch.nn.parallel.DistributedDataParallel``), and one process with no wrapper.

With ``gradient_as_bucket_view=False`` (the default) DDP keeps a full replica on each GPU plus flat gradient
buckets the size of all trainable gradients, allocated at wrap time; gradients are all-reduced once per
optimizer step (``no_sync`` while accumulating). On one GPU nothing wraps the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.links import ring_factor
from tuneplan.estimator.wrappers.base import (
    NCCL_BYTES,
    Buckets,
    Collectives,
    Resident,
    Wrapper,
    WrapperMemory,
)
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.links import Link
    from tuneplan.estimator.optimizer import OptimizerPlan
    from tuneplan.estimator.run import Run

DDP_BUCKET_BYTES = 25 * 1024**2  # PyTorch DDP bucket_cap_mb=25: the last bucket's all-reduce is exposed


class Ddp(Wrapper):
    name = "ddp"

    @classmethod
    def applies(cls, setup: TrainSetup) -> bool:
        return not setup.zero and not setup.fsdp

    def memory(self, run: Run, optimizer: OptimizerPlan) -> WrapperMemory:
        params = run.param_plan
        weights = params.weight_bytes + params.adapter_bytes
        adapters = min(params.adapter_bytes, weights)
        grads = params.trainable_params * params.trainable_bytes
        states, temp = optimizer.states, optimizer.temp
        if run.setup.world_size == 1:
            return WrapperMemory(Resident(weights=weights - adapters, adapters=adapters, states=states,
                                          optimizer_temp=temp, gradients=grads, host=0, nccl=0))
        resident = Resident(weights=weights - adapters, adapters=adapters, states=states, optimizer_temp=temp,
                            gradients=grads, host=0, nccl=NCCL_BYTES)
        return WrapperMemory(resident,
                             Buckets(persistent=grads),
                             notes=("DDP: full replica per GPU plus gradient buckets the size of the "
                                    "gradients",))

    def ring_collectives(self, run: Run, *, grad_bytes: int, gathered_bytes: int, link: Link) -> Collectives:
        grads = run.param_plan.trainable_params * grad_bytes
        per_step = grads * ring_factor("all_reduce", run.setup.world_size) / (link.gbs * 1e9)
        return Collectives(per_step=per_step,
                           notes=("DDP: ring all-reduce of the gradients once per optimizer step "
                                  "(no_sync while accumulating)",))

    def last_bucket_bytes(self, run: Run, grad_bytes: int) -> float:
        return DDP_BUCKET_BYTES
