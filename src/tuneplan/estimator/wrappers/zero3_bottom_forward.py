"""What ZeRO-3 holds gathered when the bottom decoder layer's first linear runs its forward, once the
prefetcher runs ahead (zero3_coordinator.zero3_gathered_ahead > 0)."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import (
    embedding_used_last,
    forward_trace,
    prefetch_rounds,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_gathered_at_first_linear(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                   targets: frozenset[str] = frozenset()) -> int:
    """Elements gathered at the bottom layer's first linear's forward.

    ``PartitionedParameterCoordinator._fetch_sub_module_impl`` (DeepSpeed 0.19.8), complete trace: every
    module fetch pops one prefetch round (zero3_coordinator.prefetch_rounds); before the first linear run
    the fetches of the wrappers above the embedding (two, four under PEFT), the embedding, the decoder
    layer, its input norm, its attention and the linear (a LoRA-wrapped one and its ``base_layer``: two;
    a model-level rotary module would add one more, left out: a lower bound). By then the embedding's
    forward is over: without a backward use (LoRA without checkpointing) ``__params_to_release`` releases
    it. The round holding the first linear was waited for: ``AllGatherCoalescedHandle.wait`` gave each of
    its parameters a copy while the flat buffer stays filed under them until the last one is fetched, so
    a coalesced round (more than one parameter) is held twice:

    .. math:: G = \\sum_{r < n_{fetch}} |r| - E [\\text{no backward use}] + |r_1| [\\#r_1 > 1]

    (simulate: Mistral-7B, 2 layers, LoRA on the MLP in fp32 over 4 GPUs: 6.63e8 elements at layer 0's
    ``q_proj``, every round but the embedding's, and the copies of the q..gate round.)"""
    rounds = prefetch_rounds(forward_trace(model), prefetch_bucket)
    if not model.embed_params or len(rounds) < 2:
        return 0
    peft = setup.method in ("lora", "qlora")
    first = model.layer_groups[0][0].linears[0]
    fetches = (4 if peft else 2) + 4 + (2 if first.name in targets else 1)
    popped = sum(sum(r) for r in rounds[:fetches])
    if not embedding_used_last(model, setup):
        popped -= model.embed_params
    # the round holding the first layer's first weight (the trace's second entry)
    seen, waited = 0, rounds[0]
    for r in rounds:
        seen += len(r)
        if seen >= 2:
            waited = r
            break
    return popped + (sum(waited) if len(waited) > 1 else 0)
