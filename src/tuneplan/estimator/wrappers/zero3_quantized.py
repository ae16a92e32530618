"""What ZeRO-3's prefetcher holds gathered at the loss of a QLoRA run, whose decoder linears are
bitsandbytes ``Params4bit`` partitioned as packed bytes: their trace elements are those bytes, so the module
trace is short and the prefetcher runs ahead through it."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_LIVE_PARAMETERS, HOOKED_CONTAINERS_PER_LAYER
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_quantized_ahead_bytes(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                compute: int) -> int:
    """Bytes gathered at the loss of a QLoRA run with checkpointing once the prefetcher has run ahead to the
    token embedding's backward use (0 when it does not).

    DeepSpeed 0.19.8 partitions a bitsandbytes ``Params4bit`` (bitsandbytes/nn/modules.py) like any
    parameter: its ``ds_numel`` is the packed ``uint8`` count, ``bits / 8`` per weight. With checkpointing
    ``enable_input_require_grads`` makes the embedding's output require grad, so its backward fetch is the
    step's last parameter use (as zero3_coordinator.prefetch_reach for LoRA). Every parameter has a backward
    use; when the fetches of a layer's modules grant more than the layer holds and everything but the
    embedding fits under ``stage3_max_live_parameters`` ``M``, the round that crosses pops the embedding
    too, and all of the model is gathered at the loss:

    .. math:: G = (E + H + N) c + \\frac{b}{8} \\sum_{\\text{layers}} W

    with ``E``, ``H``, ``N`` the embedding, head and norm elements in the compute dtype ``c`` bytes, ``W``
    the layers' linear weights. (simulate: GLM-4-9B, 2 layers, QLoRA fp4 on q/v with checkpointing over 2
    GPUs: the embedding INFLIGHT beside the head and both layers' packed weights at the loss.)"""
    bits = setup.quant_bits
    if bits is None or not setup.gradient_checkpointing or not model.embed_params:
        return 0
    packed = [(spec.linear_params * bits // 8, spec.norm_params, len(spec.linears), count)
              for spec, count in model.layer_groups]
    fetches = max(n + 2 + HOOKED_CONTAINERS_PER_LAYER for _, _, n, _ in packed)
    if fetches * prefetch_bucket < max(w + norm for w, norm, _, _ in packed):
        return 0
    layers = sum((w + norm) * count for w, norm, _, count in packed)
    embed, head = model.embed_params, model.lm_head_params
    if head + model.final_norm_params + layers >= DS_MAX_LIVE_PARAMETERS:
        return 0  # a layer's parameter crosses M before the embedding: not modelled here
    norms = sum(norm * count for _, norm, _, count in packed) + model.final_norm_params
    return (embed + head + norms) * compute + layers - sum(norm * count for _, norm, _, count in packed)
