"""QLoRA under ZeRO-3 with several micro-batches a step: the first pass with a complete module trace (the
first step's second micro-batch) follows the record pass, which released the persistent parameters too, so
the prefetcher's round that pops the token embedding's backward use holds the forward's persistent tail."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.zero3_coordinator import DS_PARAM_PERSISTENCE_THRESHOLD
from tuneplan.estimator.wrappers.zero3_quantized import cut_rounds, embedding_released, second_step_trace

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero3_quantized_record_release_copy(run: Run, prefetch_bucket: int) -> int:
    """Bytes a QLoRA run's token embedding holds beside what the loss gathers, from the top layer's forward
    through the backward, in the first pass with a complete trace when a step has several micro-batches
    (0 otherwise).

    DeepSpeed 0.19.8: in record mode ``release_sub_module`` releases every parameter of a module, the
    persistent ones too (the ``ds_persist`` filter is in ``__params_to_release``, complete trace only), and
    with gradient accumulation no ``_post_step`` gathers them again before the next micro-batch. In that
    pass the final norm and a persistent (classifier) head are NOT_AVAILABLE entries of the queue between
    the forward's last packed weights and the embedding's backward use (the embedding released after its
    forward: zero3_quantized.embedding_released). When the rounds (zero3_quantized.cut_rounds, one a module
    fetch) reach the embedding before the forward fetches the final norm, the norm and the embedding are
    popped in one round: ``all_gather_coalesced`` gathers them into one flat buffer,
    ``AllGatherCoalescedHandle.wait`` at the first fetch of a member, in the forward, gives each a copy
    (``torch.cat(partitions)``), and the flat buffer stays filed under the embedding until its backward
    fetch, the step's last; the loss already counts the embedding once
    (zero3_quantized.zero3_quantized_ahead_bytes):

    .. math:: \\Delta G = E\\, b_{nb}

    (the round's smaller members, persistent tails and linears released after their forward, left out).
    The forward's fetches before the final norm are counted from below: the four PEFT wrappers, the
    embedding, and per decoder layer the layer, its attention and MLP and each linear (a LoRA target's
    wrapper, base layer, dropout and two matrices). (simulate: gemma-2-27b, 2 layers, QLoRA fp4 rank 4 on
    the MLP with checkpointing and a 1-label head, two micro-batches over 8 GPUs: a 1.17968e9-element fp16
    flat buffer popped at layer 0's ``v_proj`` with the score head, the final norm and the embedding, its
    1.179648e9 copy made at layer 1's ``down_proj``, both held through layer 1's backward, the run's
    peak.)"""
    model, setup = run.model, run.setup
    norm, head = model.final_norm_params, model.lm_head_params
    if (setup.quant_bits is None or not setup.gradient_checkpointing or setup.grad_accum < 2
            or not 0 < norm <= DS_PARAM_PERSISTENCE_THRESHOLD):
        return 0
    trace = second_step_trace(run)
    if not trace or not embedding_released(run, trace):
        return 0
    # the final norm runs before the head: an LM head (past the threshold, second_step_trace's last
    # entry) follows it in the queue, a persistent head joins it
    lm_head = [trace.pop()] if head > DS_PARAM_PERSISTENCE_THRESHOLD else []
    tail = [(norm, run.dtypes.non_block)] + ([(head, run.dtypes.non_block)] if head and not lm_head else [])
    queue = [*trace, *tail, *lm_head, (model.embed_params, run.dtypes.non_block)]
    rounds = cut_rounds(queue, prefetch_bucket, model.embed_params)
    if sum(map(len, rounds)) < len(queue) or tail[0] not in rounds[-1]:
        return 0  # the prefetcher stops before the embedding, or a round closed after the tail
    wrappers = 4  # PeftModel, LoraModel, the task model and its base model
    fetches = wrappers + 1 + sum(
        (3 + sum((5 if m.name in run.targets else 1) * m.count for m in spec.linears)) * count
        for spec, count in model.layer_groups)
    return model.embed_params * run.dtypes.non_block if len(rounds) <= fetches else 0
