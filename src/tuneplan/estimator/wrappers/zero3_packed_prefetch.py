"""What ZeRO-3's prefetcher gathers beside a decoder layer of 4-bit QLoRA codes: packed bytes, and no more
than the backward still uses below the layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import layer_gathered_bytes
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero3_layer_and_prefetch_bytes(run: Run, prefetch_bucket: int) -> int:
    """Bytes gathered in a decoder layer: the layer (base.layer_gathered_bytes) and what the prefetcher holds
    beside it, ``stage3_prefetch_bucket_size`` ``B`` elements in 16 bits; under QLoRA at most the packed
    codes the trace still holds after the top layer.

    DeepSpeed 0.19.8 partitions a bitsandbytes ``Params4bit`` like any parameter: its ``ds_numel`` is the
    packed ``uint8`` count, so ``_fetch_sub_module_impl``'s bucket of ``B`` elements is ``B`` bytes of codes
    (one byte each), and it pops only what the trace holds after the current module: in the backward the
    layers below, ``L_{packed}`` each, and the 16-bit embedding only where checkpointing's
    ``enable_input_require_grads`` gives it a backward use (fully_shard.embedding_output_requires_grad):

    .. math:: P = \\min(B, (n - 1) L_{packed} + E \\cdot 2 [\\text{embedding used}])

    (simulate: phi-2, 2 layers, QLoRA of q and v over 4 GPUs: about 28 MB of codes gathered at the top
    layer's backward, never the 100 MB of a 16-bit bucket)."""
    compute, layer = run.dtypes.compute, layer_gathered_bytes(run)
    if run.setup.quant_bits is None:
        return layer + prefetch_bucket * compute
    model = run.model
    below = (model.n_layers - 1) * layer + (
        model.embed_params * compute if embedding_output_requires_grad(run.setup) else 0)
    return layer + min(prefetch_bucket, below)
