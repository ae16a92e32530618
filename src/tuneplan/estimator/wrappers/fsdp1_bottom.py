"""FSDP1's lowest back-propagated trained unit: what is gathered and which gradients exist at its backward
(and, alike, the top layer's unit at its attention core: :func:`top_unit`).

The HF Trainer's FSDP1 (``use_orig_params=True``, ``BackwardPrefetch.BACKWARD_PRE``; simulate/fsdp1.py) on a
full or freeze fine-tune, one unit per decoder layer and the root unit (embeddings, final norm, lm_head):

- Its own sharded gradient is not made yet: ``_post_backward_hook`` makes each unit's shard only when the
  unit's flat gradient is complete, and the optimizer's ``zero_grad`` set the previous step's to None. A full
  fine-tune's root unit, whose post-backward runs last, has none either (``root_unit_end``).
- Its gradient is made as its activations are released and ends, as every layer's does, as the views'
  gradients beside the flat gradient autograd concatenates from them (the views' backward is a ``cat``):
  ``2 x buffer`` (the top layer alike: ``wrappers/base.TopLayer``).
- Nothing below it is prefetched unless the backward continues below it. ``_get_handle_to_prefetch``
  (torch 2.13 ``torch/distributed/fsdp/_runtime_utils.py``) prefetches the next handle in reverse forward
  order only if ``_needs_pre_backward_unshard``, which ``_register_pre_backward_hooks`` sets only when the
  unit's forward output requires grad. A full fine-tune's bottom layer has only the root below it, never
  resharded after the forward (``_post_forward_reshard``: ``not state._is_root``). Under ``freeze`` the
  layers below the trained ones output no gradient-requiring tensor, so the backward stops at the lowest
  trained layer with nothing prefetched, unless checkpointing's ``enable_input_require_grads`` makes the
  embedding's output require grad (``fully_shard.embedding_output_requires_grad``): every frozen layer is
  then back-propagated for its input's gradient, and the next one is prefetched.

So, with ``L`` one layer unsharded (and its held device copy under CPU offload), ``L'`` the frozen layer
below it alike (its own size: :func:`below_layer_share`), ``R`` the root, ``b`` the layer's unsharded
gradient, ``s`` its shard, at the lowest back-propagated trained layer::

    gathered = R + L (+ L' if a frozen layer below is back-propagated),  pending = s (+ the root's)
    gradients at its end = 2 b (+ the head's gradient waiting in the root, full fine-tune)

(under ``no_sync`` accumulation, one trained layer's accumulated unsharded gradient fewer than all of them:
:func:`unsynced_at_bottom`; under CPU offload the frozen layer below holds its shard's device copy,
``ceil(L / N)``, even where the trained layers' ``MixedPrecision`` low-precision shards are freed once
gathered: ``fsdp1_offload.frozen_layer_copy``)

and at the layer above it, which has the lowest one prefetched beside it and its shard not made either::

    gathered = R + 2 L,  pending = 2 s (+ the root's)

The bottom row is the larger of the two: the layer above when nothing below the lowest is prefetched and
``L > s`` (16-bit layers over more than 2 GPUs: simulate, FSDP1 Llama-2-7b full over 8 GPUs, the peak at
the layer above the bottom one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.base import TopLayer
from tuneplan.estimator.wrappers.fsdp1_adapter_units import next_layer_at_attention_core
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import ModelSpec


# the linears of a layer's MLP block, back-propagated before its attention: a dense MLP, or a MoE block's
# routed experts, their router and a shared expert (the block's forward runs them all after the attention)
MLP_BLOCK_ROLES = ("mlp", "shared_expert", "expert", "router")


def layers_below_back_propagated(run: Run) -> bool:
    """Whether the backward continues below the lowest trained layer (a frozen layer under it, back-propagated
    for its input's gradient: the module docstring)."""
    setup = run.setup
    return (setup.method == "freeze" and setup.freeze_trainable_layers < run.model.n_layers
            and embedding_output_requires_grad(setup))


def bottom_unit(run: Run, buffers: int, head_wait: int, layer16: int, root16: int,
                grads: int, below_copy: int = 0) -> tuple[TopLayer | None, int]:
    """(the bottom row's layer as a :class:`TopLayer`, the sharded gradient bytes not made yet then) by the
    module docstring: ``buffers`` the layer's unsharded gradient as ``Buckets.in_layers`` counts it,
    ``head_wait`` the root's gradient made at the loss, ``layer16`` / ``root16`` one layer and the root
    unsharded with their held shard copies, ``grads`` every trainable parameter's sharded gradient bytes
    summed over the GPUs, ``below_copy`` what the frozen layer below holds beyond ``layer16`` (its host
    shard's device copy where the trained layers have none: ``fsdp1_offload.frozen_layer_copy``).
    (None, 0) where it does not apply: LoRA (PEFT's per-adapter units:
    ``backward_layer_end``) and one-layer models."""
    setup = run.setup
    if setup.method not in ("full", "freeze") or run.model.n_layers < 2:
        return None, 0
    shard, root_shard = pending_shards(run, grads)
    trained = (run.model.n_layers if setup.method == "full"
               else min(setup.freeze_trainable_layers, run.model.n_layers))
    layers, pending, below = 1, 1, 0
    if layers_below_back_propagated(run):
        below = below_layer_share(run, layer16 + below_copy)
    elif trained > 1 and layer16 > shard:
        layers, pending = 2, 2
    kept = kept_shards_above(run, trained - pending)
    # the row is the layer above the lowest: at its attention core's backward the trained layer below has
    # its activations saved beside it (not checkpointed: its input only), and the layer's own MLP block's
    # are released (netted in the attention's own scratch, as FSDP2's: wrappers/fully_shard_attention.py)
    above = layers == 2 and not setup.gradient_checkpointing
    bottom = TopLayer(counted=buffers, gradients_at_end=2 * buffers + head_wait + kept,
                      gathered=root16 + layers * layer16 + below, keeps_scratch=False,
                      gradients_at_attention=head_wait + kept + attention_moment_gradients(run),
                      attention_scratch_only=above, attention_below_saved=above)
    return bottom, pending * shard + root_shard + unsynced_at_bottom(run, buffers, trained)


def top_unit(run: Run, buffers: int, at_end: int, gathered: int, head_wait: int, layer_end: int) -> TopLayer:
    """The top layer's unit (``buffers`` its unsharded gradient, ``at_end`` the gradients live at its end,
    ``gathered`` the root and two layers unsharded: the next one prefetched at its pre-backward). A full or
    freeze fine-tune's top layer at its attention core's backward (eager, SDPA's math path:
    ``wrapper_rows.top_attention_row``) has made its MLP block's and o_proj's weight gradients, each view's
    live until the layer's cat (:func:`attention_moment_gradients`), beside the head's waiting in the root
    (``head_wait``), and its MLP block's saved tensors are released (the attention's own scratch; simulate:
    FSDP1 Mistral-7B full fp16-mixed, three layers, eager: the peak at the top layer's fp32 cast of the
    probabilities' gradient). PEFT's per-adapter units (``layer_end``: what a layer's end holds unsharded,
    0 without them) and LoRA: not counted, but what is unsharded then, ``layer_end`` where the layer below
    is gathered before the core's backward (fsdp1_adapter_units.next_layer_at_attention_core)."""
    attention = 0
    gathered_at_attention = layer_end if layer_end and next_layer_at_attention_core(run) else 0
    if run.setup.method in ("full", "freeze") and not layer_end:
        attention = head_wait + attention_moment_gradients(run)
    return TopLayer(counted=buffers, gradients_at_end=at_end, gathered=gathered, keeps_scratch=False,
                    gradients_at_attention=attention, attention_scratch_only=bool(attention),
                    gathered_at_attention=gathered_at_attention)


def below_layer_share(run: Run, largest: int) -> int:
    """The frozen layer below the lowest trained one, prefetched beside it, where ``largest`` is what the
    largest layer holds gathered: the layers' gathered bytes scale with their parameters, and the layer
    below may be smaller than the trained ones (DeepSeek-V3's dense first layers under its MoE ones:
    ``first_k_dense_replace``; simulate: FSDP1 DeepSeek-V3 3 dense + 2 MoE layers, freeze of the top 2,
    the dense layer 2's 1.17 GB gathered beside the MoE layer 3's 23 GB)::

        below = largest x params(layer n - trained - 1) / params(largest layer)"""
    model, setup = run.model, run.setup
    index = model.n_layers - min(setup.freeze_trainable_layers, model.n_layers) - 1
    return largest * layer_params_at(model, index) // max(model.largest_layer_params, 1)


def layer_params_at(model: ModelSpec, index: int) -> int:
    """The parameters of decoder layer ``index`` (0 the bottom one): the layer groups run in model order."""
    for spec, count in model.layer_groups:
        if index < count:
            return spec.params
        index -= count
    return model.largest_layer_params


def attention_moment_gradients(run: Run) -> int:
    """The weight gradients a trained decoder layer has made when its attention core is back-propagated:
    autograd has run its MLP's linears and its attention output projection (the last attention linear in
    forward order) already, each view's gradient live until the flat parameter's cat at the layer's end
    (``fsdp1_root_end`` docstring; simulate: fsdp_qlora, Llama-3.1-405B full fp32, SDPA's math path: the
    MLP's three and o_proj's fp32 weight gradients beside the scores' gradients; a MoE block's routed
    experts and router alike: FSDP1 Mixtral-8x22B freeze, the experts' grouped_mm weight gradients beside
    the scores' gradients)::

        sum_{m in MLP block} n_m d_in d_out b_grad + d_in d_out(o_proj) b_grad"""
    from tuneplan.estimator.wrappers.fp32_gathers import unsharded_grad_bytes

    return attention_moment_elements(run) * unsharded_grad_bytes(run)


def attention_moment_elements(run: Run) -> int:
    """The weight elements of :func:`attention_moment_gradients` (the largest layer's)."""
    most = 0
    for spec, _ in run.model.layer_groups:
        attn = [m for m in spec.linears if m.role == "attn"]
        made = sum(m.count * m.d_in * m.d_out for m in spec.linears if m.role in MLP_BLOCK_ROLES)
        most = max(most, made + (attn[-1].count * attn[-1].d_in * attn[-1].d_out if attn else 0))
    return most


def kept_shards_above(run: Run, above: int) -> int:
    """The device shards the ``above`` trained layers back-propagated before this one keep under CPU offload
    with ``use_orig_params=False`` (fsdp_qlora train.py, ``Profile.fsdp_flat_params_only``): each unit's
    reduce-scattered shard stays on the device as ``_saved_grad_shard``, the host copy's source
    (``_runtime_utils._accumulate_sharded_grad``, ``_offload_grad``), until ``_finalize_params``'
    ``prepare_gradient_for_optim`` deletes it at the very end of the backward (as at the root unit's end:
    ``fsdp1_root_end.root_unit_end``; simulate: fsdp_qlora, Llama-3.1-405B full fp32 offloaded, the top
    layer's 6 GB shard live through the layer below's backward)::

        kept = above x ceil(layer x b_grad / N)

    0 without offload (the shards are the gradients every row counts) or with ``use_orig_params=True``."""
    from tuneplan.estimator.wrappers.fp32_gathers import unsharded_grad_bytes

    setup = run.setup
    if setup.offload == "none" or not run.profile.fsdp_flat_params_only or above < 1:
        return 0
    return above * -(-run.model.largest_layer_params * unsharded_grad_bytes(run) // setup.world_size)


def pending_shards(run: Run, grads: int) -> tuple[int, int]:
    """(a trained layer's sharded gradient, a full fine-tune's root unit's) on one GPU, where FSDP1 makes them
    in the backward (the module docstring); ``grads`` every trainable parameter's sharded gradient bytes
    summed over the GPUs. Accumulating micro-batches are left as they are counted; under CPU offload the
    shards live on the host: (0, 0)::

        shard = ceil(layer x grads / trainable / N)"""
    setup, model = run.setup, run.model
    if setup.offload != "none" or setup.grad_accum > 1:
        return 0, 0
    trainable = max(run.param_plan.trainable_params, 1)
    per_elem = grads / trainable
    if setup.method == "freeze":
        # the trained layers are whole layers (weights.trainable_params): one's share
        layer = trainable // max(min(setup.freeze_trainable_layers, model.n_layers), 1)
        return -(-int(layer * per_elem) // setup.world_size), 0
    root = model.params_non_block if setup.method in run.profile.fsdp_root_embeddings else 0
    return (-(-int(model.largest_layer_params * per_elem) // setup.world_size),
            -(-int(root * per_elem) // setup.world_size))


def unsynced_at_bottom(run: Run, buffers: int, trained: int) -> int:
    """The one trained layer's accumulated unsharded gradient (``buffers`` bytes) not alive at the lowest
    trained layer's backward under ``no_sync`` accumulation (``fsdp.accumulates_unsharded``), which every
    micro-batch's count of all trained units' unsharded gradients includes: in an accumulating micro-batch
    the lowest layer's own is only being made (its ``cat``, counted by ``gradients_at_end``), and in the
    syncing one ``_post_backward_hook`` (torch ``_runtime_utils.py``) has reduce-scattered and freed those of
    the layers above (``_free_storage`` of the unsharded gradient), leaving the lowest layer's own:
    ``trained - 1`` unit gradients either way, one fewer (simulate: FSDP1 stablelm-base-alpha-3b freeze,
    two trained layers, 2 micro-batches under CPU offload). 0 with one trained layer or no accumulation."""
    from tuneplan.estimator.wrappers.fsdp import accumulates_unsharded

    if run.setup.grad_accum < 2 or trained < 2 or not accumulates_unsharded(run):
        return 0
    return buffers
