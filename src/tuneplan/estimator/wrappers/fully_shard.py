"""FSDP2's groups at each instant of the step (``fully_shard`` as accelerate's ``fsdp2_prepare_model``
applies it, torch 2.13 source): what ``wrappers/fsdp.Fsdp2`` reads."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuneplan.estimator.wrappers.base import EndOfBackward, NoSyncGradients
from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.load_precision import fsdp_mixed_precision
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

# frameworks that checkpoint through transformers' ``gradient_checkpointing_enable``
# (embedding_output_requires_grad)
TRANSFORMERS_CHECKPOINTING = ("hf", "llamafactory")


@dataclass(frozen=True)
class FullyShardTerms:
    held: int  # beyond the current and the prefetched layer, unsharded through a layer's backward
    transient: int  # unsharded gradients made by the layer being back-propagated (and a tied head's)
    tail16: int  # unsharded at the loss
    pending_bottom: int  # sharded gradients not made yet at the second layer's backward
    # the embedding's backward: unsharded gradients less the shards not made yet, unsharded parameters
    end: EndOfBackward | None
    held_top: int = 0  # as ``held``, through the top layer's backward
    first_copy_out: int = 0  # the first group's own copy-out in the forward: its flat output and its params
    # the bottom layer's backward beside the prefetched embedding group: unsharded bytes, shards not made yet
    bottom_backward: tuple[int, int, int] | None = None  # embedding_prefetch: (gathered, missing, copied)


def fully_shard_terms(model: ModelSpec, setup: TrainSetup, layer_grads: int, compute_bytes: int,
                      grads: int, trainable_params: int, layer16: int = 0,
                      no_sync: NoSyncGradients | None = None) -> FullyShardTerms:
    """FSDP2 (``fully_shard``, as accelerate's ``fsdp2_prepare_model`` applies it), torch 2.13 source.

    Groups: each decoder layer; the input embeddings (untied) with ``reshard_after_forward=True``; the
    tail (final norm and output head, with the embeddings when tied) with ``reshard_after_forward=False``.

    - In the forward, ``wait_for_unshard`` keeps a group's flat all-gather output in
      ``comm_ctx.all_gather_state`` until the next group's copy-out, and the root's post-forward frees the
      last one: transformers computes the loss inside the root's forward, so at the loss the last group
      gathered (the untied tail, or the last layer when the tail gathered first at the tied embeddings)
      still has its flat buffer next to the unsharded tail.
    - A group's copy-out in the forward (``FSDPParamGroup.wait_for_unshard``, from its ``pre_forward``):
      the previous group's ``all_gather_state`` is dropped from ``comm_ctx`` but stays bound to the local
      ``prev_all_gather_state`` until the function returns, so the previous group's flat all-gather output,
      the group's own and its unsharded parameters are live together. At the bottom layer the previous
      group is the first one, the untied embeddings (resharded after their forward) or the tied tail (whose
      unsharded parameters stay too); at the top layer it is the layer below, beside every lower layer's
      saved activations (simulate: falcon-7b fp32 LoRA, the 1.1 GiB embedding's flat output beside the
      first layer's two copies); an untied tail's copy-out has the top layer's flat output beside it and
      every layer's activations (simulate: Llama-2-7B QLoRA, b1 x 64 tokens).
    - The first group's own copy-out (``first_copy_out``): its flat output beside its unsharded parameters,
      2 x embed_params x compute_bytes for untied embeddings, larger than the bottom layer's three copies
      when the embeddings outweigh two layers (QLoRA's 4-bit layers; simulate: Qwen3-4B QLoRA classifier).
    - At the loss backward only the tail is unsharded: the last layer was resharded after its forward, the
      root's post-forward freed the last all-gather result, and the backward prefetch of the last layer waits
      for the tail's pre-backward hook, which the logits' gradient fires after the loss backward.
    - ``_backward_prefetch``: a group's pre-backward all-gathers the group before it in forward order into
      one flat buffer (a layer in the param dtype), alive until that group's copy-out: two layers unsharded.
    - ``foreach_reduce`` keeps a group's flat reduce-scatter input (its unsharded gradients in the reduce
      dtype) in ``comm_ctx.reduce_scatter_state`` until the next reduce-scatter replaces it: a layer's
      backward holds the previous group's (a layer's gradients, or an untied trainable head's).
    - A group's post-backward hook is registered on its forward inputs that require grad. The embeddings'
      input ids do not: an untied embedding group, and a tied tail (which starts its forward at the
      embeddings), reshard and reduce-scatter only in the root's final callback. A tied tail stays
      unsharded through the whole backward and its head gradient waits there; at the embedding's backward
      the head's and the embedding's gradients and their sum are live (three in the param dtype).
    - The sharded gradient of a group appears after its reduce-scatter: at the second layer's backward
      (the peak near the bottom: the first one prefetches the smaller embedding group) two layers' shards
      (``missing_near_bottom``) and the embedding's (the tied tail's) are still missing. With
      ``CPUOffloadPolicy`` the sharded gradients are copied to the host as they are made: none to miss.
    - The top layer is the first back-propagated: the reduce-scatter input held through it is the tail's
      (an untied head that trains), or none; a tied tail stays unsharded. Its unsharded gradients grow as
      its activations are released (``memory_at``'s top-layer row takes the larger of its start and end)."""
    world_size, tied = setup.world_size, not model.lm_head_params
    tail = (model.lm_head_params or model.embed_params) + model.final_norm_params
    tail16 = tail * compute_bytes
    head_trains = setup.method == "full"
    # sharded gradient bytes per trainable element on the device (none under CPUOffloadPolicy: host)
    per_elem = 0 if setup.offload != "none" else grads / max(trainable_params, 1)
    layer_train = layer_grads / max(compute_bytes, 1)
    emb_grad16 = model.embed_params * compute_bytes if head_trains else 0
    if tied:
        held = layer_grads
        transient = layer_grads + emb_grad16
        end = (EndOfBackward(gradients=3 * emb_grad16 + layer_grads - -(-int(tail * per_elem) // world_size),
                             gathered=tail16) if head_trains else None)
    else:
        held = max(layer_grads, tail * compute_bytes if head_trains else 0)
        transient = layer_grads
        end = (EndOfBackward(
            gradients=emb_grad16 + layer_grads - -(-int(model.embed_params * per_elem) // world_size),
            gathered=model.embed_params * compute_bytes) if head_trains else None)
    pending = (missing_near_bottom(model, setup) * layer_train
               + ((tail if tied else model.embed_params) if head_trains else 0))
    if end is not None:
        end = max(synced_micro_batch(end, no_sync, model, trainable_params, kept=True),
                  synced_micro_batch(final_reduce_scatter(model, setup, compute_bytes, per_elem), no_sync,
                                     model, trainable_params, kept=False), key=_total)
    elif not tied and embedding_output_requires_grad(setup):
        end = frozen_embedding_copy_out(model, setup, compute_bytes, layer_grads)
    bottom = (embedding_prefetch(model, setup, layer16, layer_grads, compute_bytes,
                                 -(-int((pending - layer_train) * per_elem) // world_size))
              if not tied and model.n_layers > 1 and bottom_layer_back_propagated(model, setup) else None)
    return FullyShardTerms(held=held + (tail16 if tied else 0), transient=transient, tail16=tail16,
                           pending_bottom=-(-int(pending * per_elem) // world_size), end=end,
                           held_top=tail16 if tied else (tail * compute_bytes if head_trains else 0),
                           first_copy_out=0 if tied else 2 * model.embed_params * compute_bytes,
                           bottom_backward=bottom)


def missing_near_bottom(model: ModelSpec, setup: TrainSetup) -> int:
    """Layers whose sharded gradients are not made yet at the trained layer's backward nearest the bottom
    beside a prefetched layer (``backward_layers_bottom``), torch 2.13 ``FSDPParamGroup.post_backward``:
    a group's ``foreach_reduce`` makes its shard once its own backward ends, so at the backward of the
    layer with k layers below it the trained layers at index <= k still lack theirs. With every layer
    trained that row is the second layer's (k = 1): two layers. A freeze run with frozen layers below its
    t trained ones (t < n) back-propagates no layer below index n - t that makes gradients, so its row is
    the lowest trained layer's (k = n - t, prefetching the frozen layer below): every trained layer above
    has reduce-scattered its shard, one (its own) is missing:

        missing = 1 if method = freeze and t < n else 2

    (simulate: DeepSeek-V3 freeze at six layers, two trained, bf16, 4 GPUs: at layer 4's backward, layer
    5's fp32 shard, 1/4 of its 11.5 G elements x 4 bytes, beside layer 4's unsharded bf16 gradients)."""
    if setup.method == "freeze" and setup.freeze_trainable_layers < model.n_layers:
        return min(1, setup.freeze_trainable_layers)
    return 2


def synced_micro_batch(end: EndOfBackward, no_sync: NoSyncGradients | None, model: ModelSpec,
                       trainable_params: int, kept: bool) -> EndOfBackward:
    """The end of the backward of the micro-batch that syncs, after micro-batches accumulated unsharded
    (``set_requires_gradient_sync(False)``: ``no_sync_gradients``), where the rows count every accumulated
    unsharded gradient (``NoSyncGradients.accumulating``). Torch 2.13 ``FSDPParamGroup.post_backward``:
    each group whose post-backward fires in the backward reduce-scatters its accumulated gradient into
    its shard as the backward reaches it; only the embedding group (a tied tail), reduced in the root's
    final callback, still holds its accumulated unsharded gradient at the end:

        gradients += synced - accumulating (+ embedding group numel x accumulated bytes per element)

    the last term where the moment does not already count that gradient as the reduce-scatter input
    (``final_reduce_scatter``'s ``unsharded``); simulate: gpt2 full, bf16, two micro-batches."""
    if no_sync is None or no_sync.accumulating == no_sync.synced or not trainable_params:
        return end
    numel = ((model.lm_head_params or model.embed_params) + model.final_norm_params
             if not model.lm_head_params else model.embed_params)
    held = ceil_div(numel * no_sync.accumulating, trainable_params) if kept else 0
    return replace(end, gradients=end.gradients + no_sync.synced - no_sync.accumulating + held)


def embedding_prefetch(model: ModelSpec, setup: TrainSetup, layer16: int, layer_grads: int,
                       compute_bytes: int, pending: int) -> tuple[int, int, int]:
    """The bottom layer's backward beside the untied embedding group it prefetched (torch 2.13
    ``FSDPParamGroup._backward_prefetch``): the group before it in ``comm_ctx.post_forward_order`` is the
    embedding group (resharded after its forward), all-gathered into one flat buffer in the param dtype
    that stays until the group's copy-out (its ``pre_backward``) or, when the embedding's output does not
    require grad, until the root's final callback (``finalize_backward``: ``_all_gather_result = None``).
    Beside it the bottom layer's unsharded parameters and the layer above's reduce-scatter input
    (``comm_ctx.reduce_scatter_state``); only the bottom layer's shard (and a training embedding's) is
    not made yet:

        gathered = layer16 + embed_params x compute_bytes + layer_grads
        missing  = ceil((layer + embedding if it trains) x sharded bytes per element / world_size)

    Only where the bottom layer is back-propagated (it trains, or a freeze run's frozen layers are, for
    their input's gradient: ``embedding_output_requires_grad``): a group's pre-backward hook fires only on
    its outputs' gradients, so a freeze run's backward that ends at its lowest trained layer never reaches
    the bottom layer's, and nothing prefetches the embedding group (simulate: gemma-3-27b-it freeze of 2 of
    4 layers, no checkpointing, 2 GPUs: no embedding buffer in the backward).

    This can exceed the second layer's backward (``backward_layers_bottom``: two layers unsharded, two
    shards missing) when the embeddings outweigh a layer (a large vocabulary over a narrow model; simulate:
    TinyLlama-1.1B at two layers, fp32 freeze): an instant of its own, ``backward_bottom_layer``.

    With ``CPUOffloadPolicy`` the all-gather's input is the embedding's host shard copied to the device
    (``FSDPParam.all_gather_inputs``: ``sharded_param_data.to(self.device)``, in the param dtype), alive
    while ``foreach_all_gather`` allocates and fills the flat output (``del param_all_gather_inputs`` after
    ``all_gather_copy_in``): :math:`\\lceil e \\, b / N \\rceil` more at the prefetch, the start of the
    row (an upper bound at its end), returned apart (``copied``, of the gathered bytes): under gradient
    checkpointing the prefetch comes at the layer's pre-backward, before its recomputation, so the copy
    never meets the recomputed activations (wrapper_rows.bottom_layer_row). A freeze run's bottom layer
    below its trained ones makes no gradient:
    the row holds its activations whole and no unsharded gradient of its own, and the trained layers'
    shards are all made (``missing`` cancels the row's transient gradients, ``bottom_layer_trains``)."""
    embed16 = model.embed_params * compute_bytes
    copied = -(-embed16 // setup.world_size) if setup.offload != "none" else 0
    missing = pending if bottom_layer_trains(model, setup) else layer_grads
    return layer16 + embed16 + layer_grads + copied, missing, copied


def bottom_layer_back_propagated(model: ModelSpec, setup: TrainSetup) -> bool:
    """Whether the bottom decoder layer is back-propagated, so that its pre-backward (a group's hook fires
    on its outputs' gradients) prefetches the embedding group: it trains, or a freeze run's frozen layers
    are back-propagated for their input's gradient (``embedding_output_requires_grad``)."""
    return bottom_layer_trains(model, setup) or embedding_output_requires_grad(setup)


def bottom_layer_trains(model: ModelSpec, setup: TrainSetup) -> bool:
    """Whether the bottom decoder layer makes gradients (not below a freeze run's trained layers)."""
    return not (setup.method == "freeze" and setup.freeze_trainable_layers < model.n_layers)


def lower_layers_gathered(model: ModelSpec, setup: TrainSetup, layer16: int) -> int:
    """The decoder layers unsharded at the lower trained layer's backward (``backward_layers_bottom``):
    the layer back-propagated and the one below it that its pre-backward prefetched (torch 2.13
    ``FSDPParamGroup._backward_prefetch``: the group before it in ``comm_ctx.post_forward_order``, one
    flat buffer in the param dtype). With every layer trained that bounds any pair by the largest layer:
    ``2 x layer16``. A freeze run with frozen layers below its t trained ones (``bottom_layer_trains``)
    back-propagates only the top t layers, so the row's pairs are the trained layer k below the top
    (k = 1 .. t - 1, or the top one when t = 1) and layer k + 1 below the top, its prefetch, each at its
    own size: the prefetch below the lowest trained layer is a frozen layer, a dense one under a MoE
    stack that starts dense (DeepSeek-V3 ``first_k_dense_replace``)::

        gathered = max_k (P_k + P_{k+1}) x layer16 / P_max

    with P_k the elements of layer k below the top and ``layer16`` the largest layer's (P_max) unsharded
    bytes (simulate: DeepSeek-V3 freeze at five layers, two MoE trained, 8 GPUs: at layer 3's backward
    layer 3's 23.0 GB and the dense layer 2's 1.17 GB unsharded, not two MoE layers)."""
    n = model.n_layers
    if bottom_layer_trains(model, setup) or n < 2:
        return 2 * layer16
    trained = max(min(setup.freeze_trainable_layers, n), 1)
    pair = max(layer_params_from_top(model, k) + layer_params_from_top(model, k + 1)
               for k in range(min(1, trained - 1), trained))
    return ceil_div(layer16 * pair, max(model.largest_layer_params, 1))


def layer_params_from_top(model: ModelSpec, k: int) -> int:
    """The elements of decoder layer ``k`` below the top (0: the top one; ``layer_groups`` in layer order)."""
    for spec, count in reversed(model.layer_groups):
        if k < count:
            return spec.params
        k -= count
    return model.layer_groups[0][0].params


def embedding_output_requires_grad(setup: TrainSetup) -> bool:
    """Whether a frozen token embedding's output requires grad: transformers'
    ``gradient_checkpointing_enable`` (modeling_utils.py) calls ``enable_input_require_grads`` for every
    model whose ``main_input_name`` is ``input_ids``, a forward hook that sets ``requires_grad`` on the
    embedding's output; the HF Trainer and LLaMA-Factory enable checkpointing through it."""
    return (bool(setup.gradient_checkpointing) and setup.method != "full"
            and setup.framework in TRANSFORMERS_CHECKPOINTING)


def frozen_embedding_copy_out(model: ModelSpec, setup: TrainSetup, compute_bytes: int,
                              layer_grads: int) -> EndOfBackward:
    """A frozen, untied embedding group's copy-out in the backward (torch 2.13 ``_fully_shard``).

    ``FSDPState._register_pre_backward_hook`` hooks the group's outputs that require grad: with
    ``embedding_output_requires_grad`` the embedding's output does, so its ``pre_backward`` runs after the
    bottom layer's backward. The bottom layer's ``_backward_prefetch`` all-gathered the group (resharded
    after its forward) into one flat buffer; ``wait_for_unshard`` copies it out into the unsharded
    parameters and frees the flat output only when the copy-out returns (``_all_gather_result = None``):

        gathered = 2 x embed_params x compute_bytes

    beside every sharded gradient and the bottom layer's reduce-scatter input, which
    ``comm_ctx.reduce_scatter_states`` holds until the root's final callback (no later group reduces):
    ``gradients = layer_grads``. A frozen bottom layer (below a freeze run's trained ones) holds none: its
    ``post_backward``, which fires on its input's gradient before the embedding's ``pre_backward``, drops
    the layer above's input (the oldest beyond ``reduce_scatter_max_input_buffers`` = 1) before finding
    no gradient to reduce: ``layer_grads`` is then 0 (simulate: FSDP2 Llama-3.1-8B freeze of 2 of 3 layers,
    checkpointed, no reduce-scatter input beside the embedding's copy-out). The embedding output's gradient
    (tokens x hidden) is not counted."""
    return EndOfBackward(gradients=layer_grads if bottom_layer_trains(model, setup) else 0,
                         gathered=2 * model.embed_params * compute_bytes)


def final_reduce_scatter(model: ModelSpec, setup: TrainSetup, compute_bytes: int,
                         per_elem: float) -> EndOfBackward:
    """The embedding group's (a tied tail's) reduce-scatter in the root's final callback (the group's
    inputs do not require grad: ``fully_shard_terms``), torch 2.13 ``foreach_reduce``
    (_fully_shard/_fsdp_collectives.py): after the group reshards (its unsharded parameters freed), the
    flat reduce-scatter input and output in the reduce dtype, and, when the sharded parameters are fp32
    (accelerate's upcast: ``fsdp_mixed_precision``) the output cast to fp32 before it becomes the
    sharded gradient (copied to the host under ``CPUOffloadPolicy``). The unsharded gradient that autograd
    made in the final backward node stays live through that call (simulate: Qwen2.5-14B full, the group's
    bf16 gradient freed only when ``foreach_reduce`` returns), unlike a layer's, freed after its copy-in."""
    tied = not model.lm_head_params
    numel = ((model.lm_head_params or model.embed_params) + model.final_norm_params if tied
             else model.embed_params)
    unsharded, shard, cast = reduce_scatter_buffers(setup, numel, compute_bytes)
    pending = -(-int(numel * per_elem) // setup.world_size)
    return EndOfBackward(gradients=-pending, gathered=unsharded + shard, scratch=unsharded + cast)


def reduce_scatter_buffers(setup: TrainSetup, numel: int, compute_bytes: int) -> tuple[int, int, int]:
    """(flat input, output, fp32 cast of the output) of a group's ``foreach_reduce`` in the reduce dtype
    (the param dtype), the cast where the sharded parameters are fp32 (accelerate's upcast)."""
    unsharded = numel * compute_bytes
    upcast = fsdp_mixed_precision(setup, get_profile(setup.framework)) and compute_bytes == 2 and (
        setup.method != "qlora")
    cast = ceil_div(numel * 4, setup.world_size) if upcast else 0
    return unsharded, ceil_div(unsharded, setup.world_size), cast


def tail_reduce_scatter(model: ModelSpec, setup: TrainSetup, compute_bytes: int, layer16: int,
                        accumulated: bool) -> EndOfBackward | None:
    """An untied trained tail group's (final norm and head) reduce-scatter, before the top layer's
    backward (torch 2.13): its post-backward hook fires on its forward input's gradient, after the
    head's and the norm's backward; ``FSDPParamGroup.post_backward`` reshards it and ``foreach_reduce``
    (_fsdp_collectives.py) allocates the flat input, copies the unsharded gradients in and allocates the
    output, the gradients autograd made still bound in ``unsharded_grads`` until the call returns (the
    output copied to the host under ``CPUOffloadPolicy`` only after). The tail's pre-backward already
    prefetched the top layer (``_backward_prefetch``, one flat buffer); every layer's saved activations
    are still there:

        gathered = tail x b + ceil(tail x b / N) + layer16,  scratch = tail x b (+ fp32 cast)

    After a micro-batch accumulated unsharded the reduced gradient is the accumulated ``.grad`` itself
    (counted with the accumulated gradients), the new one added into it in place. None for a tied or a
    frozen tail (simulate: DeepSeek-R1-Distill-Llama-8B full fp32 with CPU offload, 3 layers: the peak at
    the tail's reduce-scatter output, 2.1 GB of head gradient, 3.2 GB of reduce-scatter buffers and the
    top layer's 0.9 GB flat buffer)."""
    if not model.lm_head_params or setup.method != "full" or model.n_layers < 1:
        return None
    unsharded, shard, cast = reduce_scatter_buffers(
        setup, model.lm_head_params + model.final_norm_params, compute_bytes)
    return EndOfBackward(gradients=0, gathered=unsharded + shard + layer16,
                         scratch=(0 if accumulated else unsharded) + cast)


def _total(end: EndOfBackward) -> int:
    return end.gradients + end.gathered + end.scratch
