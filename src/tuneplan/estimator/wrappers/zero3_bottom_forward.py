"""What ZeRO-3 holds gathered when the bottom decoder layer's first linear runs its forward, once the
prefetcher runs ahead (zero3_coordinator.zero3_gathered_ahead > 0)."""

from __future__ import annotations

from tuneplan.estimator.compute import has_rotary
from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_REUSE_DISTANCE,
    PEFT_MODULES_PER_TARGET,
    embedding_used_last,
    forward_trace,
    prefetch_rounds,
)
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_gathered_at_first_linear(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                   targets: frozenset[str] = frozenset()) -> int:
    """Elements gathered at the bottom layer's linears' forward: the most at any of them.

    ``PartitionedParameterCoordinator._fetch_sub_module_impl`` (DeepSpeed 0.19.8), complete trace: every
    module fetch pops one prefetch round (zero3_coordinator.prefetch_rounds); before the first linear run
    the fetches of the wrappers above the embedding (two, four under PEFT), the embedding, the decoder
    layer, its input norm, its attention and the linear (a LoRA-wrapped one and its ``base_layer``: two;
    the model-level rotary module, transformers 5's ``rotary_emb`` run after the embedding: one more).
    By then the embedding's forward is over: without a backward use (LoRA without checkpointing, freeze)
    ``__params_to_release`` releases it unless a tied head reuses it (:func:`embedding_kept_in_forward`),
    and the later rounds are cut against ``stage3_max_live_parameters`` without it
    (:func:`prefetch_rounds`' ``released``). The round holding the first linear was waited for:
    ``AllGatherCoalescedHandle.wait`` gave each of its parameters a copy while the flat buffer stays filed
    under them until the last one is fetched, so a coalesced round (more than one parameter) is held
    twice:

    .. math:: G = \\sum_{r < n_{fetch}} |r| - E [\\text{released}] + |r_1| [\\#r_1 > 1]

    At each later linear one more fetch (two for a LoRA-wrapped one, whose dropout, ``lora_A`` and
    ``lora_B`` fetch three more after it; the post-attention norm and the MLP container two more) pops
    another round, the linears before it with no backward use have been released after their forward
    (:func:`bottom_layer_released`), and its own round, when coalesced, is held twice; the largest of these
    (simulate: stablelm-base-alpha-3b, 3 layers, LoRA on the MLP over 4 GPUs: 6.418e8 elements at layer 0's
    ``dense``, after ``query_key_value`` was released).

    (simulate: Mistral-7B, 2 layers, LoRA on the MLP in fp32 over 4 GPUs: 6.63e8 elements at layer 0's
    ``q_proj``, every round but the embedding's, and the copies of the q..gate round; DeepSeek-R1-Distill-
    Llama-8B, 3 layers, freeze of the top 2 over 4 GPUs: 1.2551e9 at layer 0's ``o_proj``, every layer's
    rounds, the head's popped there past the released embedding, and the o and gate copies of the q..gate
    round, q, k and v released.)"""
    peft = setup.method in ("lora", "qlora")
    released = 0 if embedding_kept_in_forward(model, setup) else model.embed_params
    # the wrappers' fetches and the embedding's own pop their rounds before its forward ends and
    # ``__release_param`` takes it off ``n_available``: the later rounds are cut against what is left
    wrappers = 4 if peft else 2
    rounds = prefetch_rounds(forward_trace(model), prefetch_bucket, (wrappers + 1, released))
    if not model.embed_params or len(rounds) < 2:
        return 0
    linears = model.layer_groups[0][0].linears
    fetches = wrappers + 4 + (1 if has_rotary(model) else 0)
    best, seen, role = 0, 1, linears[0].role  # the trace's entries before the linear: the embedding
    free = bottom_layer_released(model, setup, targets)
    for m in linears:
        # into the MLP block: the post-attention norm's and the MLP container's fetches
        fetches += (2 if m.role != role else 0) + (2 if m.name in targets else 1)
        role = m.role
        popped = sum(sum(r) for r in rounds[:fetches])
        # the round holding this linear's weight (the trace's next entry), waited for at its fetch
        waited, count = rounds[-1], 0
        for r in rounds:
            count += len(r)
            if count > seen:
                waited = r
                break
        best = max(best, popped - released + (sum(waited) if len(waited) > 1 else 0))
        # a linear with no backward use is released after its forward (``__params_to_release``)
        released += m.params // m.count * m.count if m.name in free else 0
        seen += m.count
        # a LoRA-wrapped linear's dropout, lora_A and lora_B fetch after its base layer's forward
        fetches += PEFT_MODULES_PER_TARGET - 1 if m.name in targets else 0
    return best


def embedding_kept_in_forward(model: ModelSpec, setup: TrainSetup) -> bool:
    """Whether the token embedding stays gathered after its forward: its backward fetch is the step's last
    use (zero3_coordinator.embedding_used_last), or a tied head reuses its weight within the reuse distance.

    ``__params_to_release`` (partitioned_param_coordinator, DeepSpeed 0.19.8) keeps a parameter met again
    while walking the trace's later modules until ``stage3_max_reuse_distance`` ``D`` elements are passed:
    a tied head's module (``lm_head``, whose weight is the embedding's) comes after the decoder layers and
    the final norm, so the embedding is kept through the forward when

    .. math:: P_{total} - E < D

    (simulate: falcon-7b, 3 layers, freeze over 8 GPUs: the 2.955e8-element embedding gathered beside
    layer 0's rounds at ``query_key_value`` in the second micro-batch's forward)."""
    if embedding_used_last(model, setup):
        return True
    return (bool(model.embed_params) and not model.lm_head_params
            and model.params_total - model.embed_params < DS_MAX_REUSE_DISTANCE)


def bottom_layer_released(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> frozenset[str]:
    """Names of the bottom layer's linears with no backward use, released after their forward by
    ``__params_to_release`` (DeepSpeed 0.19.8: not used again within the reuse distance): in a LoRA run
    without checkpointing those whose input does not require grad (lora_bottom_layer.bottom_gradient_free);
    under ``freeze`` with a frozen bottom layer, all of them, as the backward stops at the lowest trained
    layer (zero3_coordinator.zero3_backward_uses) unless the embedding's output requires grad."""
    if setup.method == "lora" and not setup.gradient_checkpointing:
        return bottom_gradient_free(model, targets)
    if (setup.method == "freeze" and not embedding_output_requires_grad(setup)
            and setup.freeze_trainable_layers < model.n_layers):
        return frozenset(m.name for m in model.layer_groups[0][0].linears)
    return frozenset()
