"""What ZeRO-3 holds gathered around a tied output head whose weight is the token embedding's, once the
head has run: at the loss, where the embedding is already counted against ``stage3_max_live_parameters``,
and in the backward, once the head's backward has released it (the checkpointed layers' recomputation and
backward lie between it and the embedding's own backward use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    embedding_used_last,
    largest_ds_parameter,
    layer_fetches,
    prefetch_rounds,
    tied_embedding_fills_live,
)
from tuneplan.estimator.wrappers.zero3_lower_layers import zero3_gathered_in_lower_layers
from tuneplan.estimator.wrappers.zero3_quantized import gathered_entries
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def tied_reach_at_loss(model: ModelSpec, setup: TrainSetup, queued: int) -> int | None:
    """Parameters (elements) gathered at the loss when the prefetcher has run ahead and the head is tied
    to the token embedding whose backward is the step's last use; ``None`` when that is not the case
    (zero3_coordinator.prefetch_reach then applies).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops while ``numel_prefetching < min(max_live -
    n_available, prefetch_bucket)`` and skips AVAILABLE parameters without counting them. The tied head's
    forward fetched the embedding's weight last: it is AVAILABLE and already in ``n_available``, so the
    round that crosses ``stage3_max_live_parameters`` ``M`` is one of layer parameters, not the embedding
    popped at the end of the queue; what is gathered is bounded by ``M`` plus the largest layer parameter:

    .. math:: G = \\min(Q,\\ M + p_{max})

    (simulate: gemma-7b, 2 layers, LoRA with checkpointing over 2 GPUs: at the loss the embedding's
    7.864e8 elements and the top layer's MLP, 1.0687e9 in all, against 1.3401e9 for every parameter.)"""
    if model.lm_head_params or not embedding_used_last(model, setup):
        return None
    largest = largest_ds_parameter(model, get_profile(setup.framework).model_code == "hf")
    return min(max(queued, 0), DS_MAX_LIVE_PARAMETERS + largest)


def tied_embedding_released_in_backward(model: ModelSpec, setup: TrainSetup) -> bool:
    """Whether a tied embedding that filled ``stage3_max_live_parameters`` through the forward
    (zero3_coordinator.tied_embedding_fills_live) is released after the head's backward.

    ``__params_to_release`` (DeepSpeed 0.19.8) keeps a parameter only if a module using it lies within
    ``stage3_max_reuse_distance`` ``D`` elements of the module order from there: the embedding's next use
    is its own backward, the step's last (zero3_coordinator.embedding_used_last), after every decoder
    layer's backward and, under checkpointing, its recomputed forward too:

    .. math:: \\text{released} \\iff (1 + [\\text{checkpointing}])\\,(P - E) \\ge D"""
    if not tied_embedding_fills_live(model) or not embedding_used_last(model, setup):
        return False
    passes = 2 if setup.gradient_checkpointing else 1
    return passes * (model.params_total - model.embed_params) >= DS_MAX_REUSE_DISTANCE


def zero3_tied_regathered(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                          targets: frozenset[str] = frozenset()) -> int:
    """Parameters (elements) gathered through the layers' backward once the tied embedding, released after
    the head's backward (:func:`tied_embedding_released_in_backward`), no longer holds the prefetcher (0
    otherwise, or when a layer's fetches cannot grant more than it holds, or with quantized weights).

    With the embedding off ``n_available`` every module fetch pops ``min(M - n_available,
    prefetch_bucket)`` again (``_fetch_sub_module_impl``): from the top layer's recomputation on the queue
    runs ahead through the layers below to the embedding's backward use, and the round that crosses ``M``
    pops the embedding back (zero3_lower_layers.zero3_gathered_in_lower_layers); with every layer under
    ``M`` this happens in the top layer already, while its first round is still held twice: the first fetch
    after the release (the recomputed layer's, parameterless) popped the top layer's leading linears as one
    coalesced round, and ``AllGatherCoalescedHandle.wait`` gave each of them a copy while the flat buffer
    stays filed under them until the round's last parameter is fetched (zero3_bottom_forward's rule):

    .. math:: G = G_{lower} + |r_1|\\,[\\#r_1 > 1]\\,[P - E < M]

    (simulate: gemma-3-12b, 4 layers, LoRA on all linears with checkpointing over 8 GPUs in fp16: the
    embedding's 1.0069e9 elements freed after the loss and gathered again at layer 3's recomputed
    ``k_proj`` beside the four layers' 8.965e8, and the copies of layer 3's q..gate round, 1.0617e8.)"""
    if setup.quant_bits is not None or not tied_embedding_released_in_backward(model, setup):
        return 0
    if layer_fetches(model, targets) * prefetch_bucket < model.largest_layer_params:
        return 0
    top = model.layer_groups[-1][0]
    first = prefetch_rounds([m.params // m.count for m in top.linears for _ in range(m.count)],
                            prefetch_bucket)[:1]
    held_twice = sum(first[0]) if first and len(first[0]) > 1 else 0
    if model.params_total - model.embed_params >= DS_MAX_LIVE_PARAMETERS:
        held_twice = 0
    return zero3_gathered_in_lower_layers(model, setup) + held_twice


def zero3_quantized_tied_regathered(run: Run) -> int:
    """Bytes gathered through the layers' backward of a QLoRA run with checkpointing whose tied embedding
    filled ``stage3_max_live_parameters`` ``M`` through the forward and is released after the head's
    backward (0 otherwise): the embedding again, beside every layer's packed codes.

    On the packed trace (zero3_quantized module doc) the layers hold ``P`` trace elements. The head's
    forward reuses the embedding ``P < D`` elements on, so ``__params_to_release`` (DeepSpeed 0.19.8)
    keeps it from its forward to the head's backward, and with ``E >= M`` nothing is prefetched
    (zero3_coordinator.tied_embedding_fills_live). Its next use, its own backward (checkpointing's
    ``enable_input_require_grads``), lies past every layer's recompute and backward, ``2 P >= D``: it is
    released there and ``n_available`` falls to the layers kept. From the top layer's recompute on,
    ``_fetch_sub_module_impl`` pops rounds of ``min(M - n_available, prefetch_bucket)`` off the queue; with
    ``P < M`` the layers released after their forward are popped back and the embedding crosses ``M``:

    .. math:: G = E\\, b_{nb} + \\sum_{\\text{layers}} \\sum_p B_p

    (simulate: gemma-3-27b-it, 4 layers, QLoRA nf4 rank 4 on the MLP with checkpointing over 4 GPUs: the
    embedding's 1.4096e9 elements freed after the head's backward and gathered again at layer 3's
    recomputed ``post_attention_layernorm``, beside the layers' 8.2575e8 packed codes, the run's peak at
    layer 3's ``down_proj``.)"""
    model, setup = run.model, run.setup
    embed = model.embed_params
    if (setup.quant_bits is None or not setup.gradient_checkpointing or model.lm_head_params
            or embed < DS_MAX_LIVE_PARAMETERS):
        return 0
    layers = [(gathered_entries(run, spec), count) for spec, count in model.layer_groups]
    elements = sum(n * count for entries, count in layers for n, _ in entries)
    if not elements < DS_MAX_LIVE_PARAMETERS <= 2 * elements or elements >= DS_MAX_REUSE_DISTANCE:
        return 0
    return embed * run.dtypes.non_block + sum(b * count for entries, count in layers for _, b in entries)
