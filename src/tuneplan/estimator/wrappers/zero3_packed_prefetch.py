"""What ZeRO-3's prefetcher gathers beside a decoder layer of 4-bit QLoRA codes: packed bytes, and no more
than the backward still uses below the layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
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
    layers below, ``L_{packed}`` each, less, without checkpointing, the bottom layer's linears whose input
    does not require grad (lora_bottom_layer.bottom_gradient_free: released after their forward, never
    fetched again; their codes, ``b / 8`` bytes per weight, and 16-bit biases: ``F``), and the 16-bit
    embedding only where checkpointing's ``enable_input_require_grads`` gives it a backward use
    (fully_shard.embedding_output_requires_grad):

    .. math:: P = \\min(B, (n - 1) L_{packed} - F + E \\cdot 2 [\\text{embedding used}])

    (simulate: phi-2, 2 layers, QLoRA of q and v over 4 GPUs: at the top layer's backward its codes and
    layer 0's ``dense``, 28 MB; layer 0's q, k, v, fc1 and fc2 released after their forward.)"""
    model, setup, compute, layer = run.model, run.setup, run.dtypes.compute, layer_gathered_bytes(run)
    bits = setup.quant_bits
    if bits is None:
        return layer + prefetch_bucket * compute
    free = bottom_gradient_free(model, run.targets) if not setup.gradient_checkpointing else frozenset()
    unused = sum(m.count * (m.d_in * m.d_out * bits // 8 + (m.d_out * compute if m.bias else 0))
                 for m in model.layer_groups[0][0].linears if m.name in free)
    below = max((model.n_layers - 1) * layer - unused, 0) + (
        model.embed_params * compute if embedding_output_requires_grad(setup) else 0)
    return layer + min(prefetch_bucket, below)
