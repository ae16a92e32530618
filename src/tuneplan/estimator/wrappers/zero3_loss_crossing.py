"""The parameter that crosses ZeRO-3's live limit at the loss: which backward uses the prefetcher has
recorded there, in the order the backward fetches them (DeepSpeed 0.19.8,
``PartitionedParameterCoordinator``)."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, linear_entries
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def backward_queue(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> list[int]:
    """Elements of the partitioned parameters in the order the backward fetches them: the untied head,
    then each decoder layer from the top, its linears in reverse (``lora_B`` before the weight, ``lora_A``
    after it, each when over ``stage3_param_persistence_threshold``), or under checkpointing in forward
    order (the layer's recompute fetches them before its backward). Empty for routed experts (their
    fused stacks are fetched as one parameter, zero3_coordinator.largest_ds_parameter)."""
    rank = setup.rank if setup.method == "lora" else 0
    queue = [model.lm_head_params] if model.lm_head_params else []
    for spec, count in reversed(model.layer_groups):
        layer: list[int] = []
        for m in spec.linears:
            if m.count != 1:
                return []
            layer += linear_entries(m, rank, targets)
        order = layer if setup.gradient_checkpointing else layer[::-1]
        queue += [n for n in order if n] * count
    return queue


def zero3_reach_at_loss(model: ModelSpec, setup: TrainSetup, targets: frozenset[str], reach: int) -> int:
    """Elements gathered at the loss once the prefetcher has run ahead, ``reach`` bounded by the parameter
    that crosses the limit.

    ``_fetch_sub_module_impl`` pops while ``numel_prefetching < min(max_live - n_available,
    prefetch_bucket)``, and ``__params_to_release`` keeps what it recorded: from the head on, the backward
    uses in the order of :func:`backward_queue`, up to the first one whose pop brings the count to
    ``stage3_max_live_parameters`` ``M`` or past it. Not ``M`` plus the largest parameter: the one that
    crosses is where the queue's running sum reaches ``M``.

    .. math:: G = \\min_k \\{ \\textstyle\\sum_{i \\le k} p_i : \\sum_{i \\le k} p_i \\ge M \\}

    (simulate: Llama-2-70b, 2 layers, LoRA without checkpointing over 2 GPUs: the head 2.62e8, the top
    layer's down, up and gate 2.35e8 each (9.67e8 < 1e9), its o_proj 6.7e7 crossing: 1.034e9 elements at
    the loss, not 1.235e9.) ``reach`` where the queue is unknown or never reaches ``M``."""
    if setup.method not in ("lora", "full"):
        return reach
    total = 0
    for n in backward_queue(model, setup, targets):
        total += n
        if total >= DS_MAX_LIVE_PARAMETERS:
            return min(reach, total)
    return reach
