"""QLoRA under ZeRO-3 with checkpointing: the token embedding, released after its forward, gathered again
for its backward use in a coalesced round, and where that round's copy and flat buffer are held."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.zero3_backward_embedding import embedding_round_coalesced
from tuneplan.estimator.wrappers.zero3_module_trace import zero3_replayed_gathered
from tuneplan.estimator.wrappers.zero3_quantized import (
    cut_rounds,
    embedding_released,
    gathered_entries,
    second_step_trace,
)

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero3_quantized_embedding_round(run: Run, prefetch_bucket: int) -> tuple[int, int]:
    """(bytes held beside what the loss gathers from the top layer's forward on, bytes gathered while the
    bottom layer is back-propagated) when a QLoRA run's token embedding, released after its forward, is
    gathered again for its backward use in a coalesced round under checkpointing; one of the two is 0.

    In the second step's forward (zero3_quantized.second_step_trace) the embedding
    (zero3_quantized.embedding_released) is queued again right after the forward's entries (the backward's
    other uses are AVAILABLE then, skipped uncounted); round ``k`` is popped at the ``k``-th module fetch.
    When the forward's last round has not reached its limit the embedding joins it: that round is coalesced,
    the first of its parameters the forward fetches (in the top layer) waits for it and
    ``AllGatherCoalescedHandle.wait`` gives the embedding a copy while the flat buffer stays filed under it
    until its backward fetch: ``E b_nb`` more from there through the backward. (simulate: phi-4, 4 layers,
    QLoRA fp4 rank 32 on the MLP with checkpointing and a 2-label head over 4 GPUs: layer 3's ``gate_up_proj``
    ``lora_B``, ``down_proj`` and its ``lora_A`` with the embedding in the ninth round, the copy made at that
    ``lora_B``.)

    Otherwise the first linear's base weight is fetched ``F``-th: the four PEFT wrappers, the embedding,
    the model's rotary module (transformers 5: one where the config has a rope), the decoder layer, its
    input norm, its attention, the LoRA wrapper when the linear is a target, the base layer. When the
    embedding's round comes after it, ``k > F``, ``__params_to_release`` has released that weight (its next
    use, the recompute, lies beyond ``stage3_max_reuse_distance``): the round is that weight and the
    embedding, coalesced, waited for at the bottom layer's recompute (the packed analogue of
    zero3_first_pass.embedding_round_late):

    .. math:: G = \\sum_{p \\in layer_0} B_p + 2 E\\, b_{nb}

    (the released weights' codes in the flat buffer left out: a lower bound by at most the layer).
    (simulate: gemma-7b, 4 layers, QLoRA nf4 on the MLP with checkpointing and a 2-label head over 4 GPUs:
    the 7.8643e8-element flat buffer from layer 0's ``k_proj`` beside the embedding's copy made at
    layer 0's recomputed ``q_proj``, the run's peak in layer 0's backward.)

    Dense layers in PEFT's modules: the coordinator replayed fetch by fetch instead, its rounds' flat
    buffers and copies counted where they are held (zero3_module_trace.zero3_replayed_gathered)."""
    model, setup = run.model, run.setup
    if setup.quant_bits is None or not setup.gradient_checkpointing:
        return 0, 0
    replayed = zero3_replayed_gathered(run, prefetch_bucket)
    if replayed is not None:
        # the coordinator replayed with its rounds' flat buffers and copies (zero3_module_trace.py)
        return 0, replayed.lower_backward
    trace = second_step_trace(run)
    if not trace or not embedding_released(run, trace):
        return 0, 0
    trace.append((model.embed_params, run.dtypes.non_block))
    rounds = cut_rounds(trace, prefetch_bucket, model.embed_params)
    layer = sum(b for _, b in gathered_entries(run, model.layer_groups[0][0]))
    if sum(len(r) for r in rounds) < len(trace):
        # the forward's prefetcher stopped before it: the backward pops it (zero3_backward_embedding.py)
        layers = [[n for n, _ in gathered_entries(run, spec)] for spec, count in model.layer_groups
                  for _ in range(count)]
        held = embedding_round_coalesced(layers, model.lm_head_params, prefetch_bucket)
        return 0, (layer + 2 * model.embed_params * run.dtypes.non_block if held else 0)
    first = model.layer_groups[0][0].linears[0]
    rotary = any(k.startswith("rope") for k in model.config)
    fetch = 4 + 1 + rotary + 3 + (2 if first.name in run.targets else 1)
    if len(rounds) <= fetch:
        return (model.embed_params * run.dtypes.non_block if len(rounds[-1]) > 1 else 0), 0
    return 0, layer + 2 * model.embed_params * run.dtypes.non_block
