"""What ZeRO-3 holds gathered while the layers below the top are back-propagated, once the prefetcher
has reached the token embedding, the step's last parameter use."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, embedding_used_last
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_gathered_in_lower_layers(model: ModelSpec, setup: TrainSetup) -> int:
    """Parameters (elements) gathered while a layer below the top is back-propagated once the prefetcher
    has popped the token embedding, the step's last use (0 when it is not the last use).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops until ``n_available`` crosses
    ``stage3_max_live_parameters`` ``M``: once the layers left before the embedding hold less than
    ``M``, the round that crosses pops the embedding ``E`` too. The most gathered is at the highest layer
    ``k`` whose layers ``0..k`` hold under ``M``: those layers and the embedding,

    .. math:: G = \\max_{k:\\ \\sum_{i \\le k} P_i < M} \\sum_{i \\le k} P_i + E

    (simulate: Llama-3.3-70B, 3 layers, LoRA with checkpointing over 8 GPUs: 1.9063e9 elements through
    layer 1's attention backward, layer 0's 8.556e8 and the embedding's 1.0507e9.)"""
    if not embedding_used_last(model, setup):
        return 0
    best = below = 0
    for spec, count in model.layer_groups:
        for _ in range(count):
            below += spec.linear_params + spec.norm_params
            if below < DS_MAX_LIVE_PARAMETERS:
                best = below
    return best + model.embed_params if best else 0

