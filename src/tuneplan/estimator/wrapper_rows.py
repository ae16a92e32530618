"""The rows a wrapper adds to the backward beside the layers' own (estimator/instants.py): a layer's row
folded to the larger of its start and its end (FSDP, ZeRO-3), ZeRO-3's first in-backward reduction, a
layer's end beside the next layer prefetched, FSDP2's bottom layer beside the embedding group, and the
wrappers' reductions at the backward's end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan.estimator.activations import ActivationPlan
from tuneplan.estimator.layer_end_casts import top_layer_row_casts
from tuneplan.estimator.layer_scratch import layer_backward_scratch
from tuneplan.estimator.memory_statics import MemoryStatics
from tuneplan.estimator.mlp_norm_moment import mlp_norm_row
from tuneplan.estimator.wrappers.base import TopLayer
from tuneplan.estimator.xp import maximum, minimum

if TYPE_CHECKING:
    from tuneplan.estimator.instants import Row


def first_hook_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan, bottom: Row) -> Row:
    """ZeRO-1/2's bucket in a LoRA run without checkpointing, made by the backward's first gradient hook
    (stage_1_and_2.py process_gradients -> setup_buckets, DeepSpeed 0.19.8): the top layer's last adapter
    (forward order) gives its first trained gradient, so where that is an attention projection, the layer's
    MLP (and after q/k/v the attention core) is back-propagated before the bucket exists. The top layer's
    row (G + B, every saved activation, the largest scratch) then splits in two moments:

        top = G, every saved activation, the layer's largest scratch (no bucket yet)
        first_hook = G + B, the lower layers' activations + what the top layer keeps up to its last
                     adapter (the tail released), the gradients live then (activations.first_hook_bytes)

        below_top = G + B, the lower layers' activations, the next layer's largest scratch

    Not where the hook comes first in the layer (an adapted MLP) or the moment is not derived. Returns the
    bottom layer's row (``bottom``), without the bucket where the top layer is the only one."""
    bucket = statics.wrapped.first_hook_bucket
    terms = statics.acts
    # (a fused expert stack's moment already leaves the bucket out: layer_backward_scratch's ``unmade``;
    # a trained classifier head, PEFT's modules_to_save, gives the backward's first gradient before any
    # layer: simulate, Qwen2.5-3B LoRA with 2 labels under ZeRO-2, the bucket made at ``score``'s)
    if not bucket or statics.checkpointed or terms.offload or terms.model.head_out:
        return bottom
    if any(kind[8] for kind in terms.kinds):
        return stacks_first_hook_rows(rows, statics, acts, bottom)
    if not terms.first_hook_per_token:
        return bottom
    grads, step, saved, casts, held, scratch, gathered = rows["backward_layers_top"]
    rows["backward_layers_top"] = (grads - bucket, step, saved, casts, held, scratch, gathered)
    below = acts.saved_bytes - acts.tail_bytes - acts.top_layer_bytes
    rows["backward_first_hook"] = (grads, step, below + acts.first_hook_bytes, casts, held,
                                   acts.first_hook_temp_bytes, gathered)
    if statics.n_layers > 1:
        # the layer below next, its backward's largest scratch beside every lower layer's activations: the
        # moment the top row bounded while it counted the bucket (the bottom row counts one layer's only)
        rows["backward_layer_below_top"] = (grads, step, below, casts, held, scratch, gathered)
        return bottom
    # one layer: the bottom row is the top layer's own backward, before its first hook too
    return (bottom[0] - bucket, *bottom[1:])


def stacks_first_hook_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan,
                           bottom: Row) -> Row:
    """:func:`first_hook_rows` where the top layer's adapted fused expert stacks come first
    (wrappers/reduce_buckets.first_hook_after_stacks): the bucket B is made by the first factor gradient's
    hook, once grouped_mm's backward has used and released each stack's saved effective weight (the top
    kind's fixed per-layer bytes, ``F``). The top row (G + B, every saved activation A, the stack moment's
    scratch less B: layer_scratch.layer_backward_scratch ``unmade``) splits in three moments:

        top = G, A, the layer's largest scratch S (the stacks' weight-gradient moment, no bucket yet)
        first_hook = G + B, A - F
        below_top = G + B, the lower layers' activations, the next layer's largest scratch S

    (simulate: Qwen3-30B-A3B LoRA on the stacks over 4 GPUs, ZeRO-2: the bucket is allocated after the top
    layer's two effective weights are freed). Returns the bottom row, without the bucket on one layer."""
    if not statics.wrapped.first_hook_after_stacks:
        return bottom
    bucket = statics.wrapped.first_hook_bucket
    grads, step, saved, casts, held, _, gathered = rows["backward_layers_top"]
    scratch = layer_backward_scratch(statics, acts, acts.tokens)
    rows["backward_layers_top"] = (grads - bucket, step, saved, casts, held, scratch, gathered)
    stacks = statics.acts.kinds[-1][7] if statics.acts.kinds else 0
    rows["backward_first_hook"] = (grads, step, saved - minimum(saved, int(stacks)), casts, held, 0, gathered)
    if statics.n_layers > 1:
        below = acts.saved_bytes - acts.tail_bytes - acts.top_layer_bytes
        rows["backward_layer_below_top"] = (grads, step, below, casts, held, scratch, gathered)
        return bottom
    return (bottom[0] - bucket, *bottom[1:])


def reduction_rows(rows: dict[str, Row], statics: MemoryStatics, held: Any, acts: tuple[Any, Any],
                   bottom_held: Any) -> None:
    """The wrappers' own rows at the backward's end: ZeRO-2's reductions in the layers (``acts``: the
    activations at the head's, every one saved but the head's, and the bottom layer's), ZeRO-1/2's last
    reductions and FSDP's last unit (which replaces the embedding's row)."""
    head_acts, bottom_acts = acts
    # ZeRO-2's reductions in the layers (wrappers/zero2_partition.py) where no record moment places them
    if statics.wrapped.layers_backward and not statics.wrapped.reduction_moments:
        rows["backward_reductions"] = (statics.wrapped.layers_backward, 0, bottom_acts, 0, bottom_held, 0, 0)
    if statics.wrapped.head_backward:  # the head's, before any layer's backward released an activation
        rows["backward_head_reductions"] = (statics.wrapped.head_backward, 0, head_acts,
                                            statics.autocast_copies, held, 0, 0)
    epilogue = statics.wrapped.epilogue
    if epilogue is not None:  # ZeRO's last reductions (wrappers/zero12_reductions.py, zero3_flush.py)
        rows["backward_epilogue"] = (epilogue.gradients, 0, 0, 0, 0, epilogue.reduction_copy,
                                     epilogue.gathered)
    end = statics.end_of_backward
    if end is not None:  # FSDP's last unit (wrappers/fsdp.root_unit_end, wrappers/fully_shard)
        # beside the outputs a loop holds through the backward (fsdp_qlora train.py: output = None only after
        # the step; simulate: fsdp_qlora, Meta-Llama-3-8B full fp32)
        rows["backward_embedding"] = (statics.all_grads + end.gradients, 0, 0, 0, held, end.scratch,
                                      end.gathered)


def folded_layer_row(row: Row, layer: TopLayer) -> Row:
    """A layer's backward row (its activations or recomputation A, scratch S and unsharded gradients
    ``layer.counted`` counted together) as the larger of its start and its end (wrappers/base.TopLayer;
    FSDP1's lowest trained layer: wrappers/fsdp1_bottom.py): its gradients end as ``E =
    layer.gradients_at_end`` as its activations are released, the scratch freed by then, beside
    ``layer.gathered``::

        gradients = G - counted + E,  activations = A - min(A, E),  scratch = S - min(S, E - min(A, E))"""
    grads, temp, saved, casts, held, scratch, _ = row
    at_end = layer.gradients_at_end
    freed = minimum(saved, at_end)
    if not layer.keeps_scratch:
        scratch = scratch - minimum(scratch, at_end - freed)
    return (grads - layer.counted + at_end, temp, saved - freed, casts, held, scratch, layer.gathered)


def fold_bottom_rows(rows: dict[str, Row], layer: TopLayer, attention_scores: bool, held: Any,
                     acts: ActivationPlan) -> None:
    """The bottom row folded (:func:`folded_layer_row`) as ``layer.fold`` says, and, where the attention's
    backward materialises the scores' gradients (eager, SDPA's math path: ``attention_scores``) and the
    wrapper says what the layer has made by then (``TopLayer.gradients_at_attention``, ``G_attention``),
    the moment of the attention core's backward: the layer's activations A as the unfolded row counts them
    with the layer below's (one layer's more) where they are saved beside it (``attention_below_saved``:
    FSDP2), and the row's scratch S, or, where the wrapper says so (``attention_scratch_only``: FSDP2), the
    attention's own ``S_attention`` (the scores' gradients beside the saved probabilities, net of the MLP
    block's saved tensors autograd released by then: ``ActivationPlan.attention_backward_bytes``), its MLP's
    and output projection's weight gradients already made, beside the outputs the loop holds (``held``: the
    lower layers' rows', fsdp_qlora train.py's until the step)::

        gradients = G - counted + G_attention,  activations = A (+ A),  scratch = S (or S_attention)

    and, where the wrapper says what the layer has made by then, its MLP's input norm's backward
    (mlp_norm_moment.py)."""
    counted = attention_scores and bool(layer.gradients_at_attention)
    row = rows["backward_layers_bottom"]
    mid = mlp_norm_row(row, layer, acts, held)
    if mid is not None:
        rows["backward_layer_mlp_norm"] = mid
    if layer.fold == "always":
        rows["backward_layers_bottom"] = folded_layer_row(row, layer)
    if counted:
        grads, temp, saved, casts, _, scratch, _ = row
        kept = saved + saved if layer.attention_below_saved else saved
        scratch = acts.attention_backward_bytes if layer.attention_scratch_only else scratch
        rows["backward_layer_attention"] = (grads - layer.counted + layer.gradients_at_attention, temp, kept,
                                            casts, held, scratch, layer.gathered)


def top_attention_row(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan, held: Any) -> None:
    """The top layer's attention core's backward (without checkpointing), where the wrapper says what the
    layer has made by then (``TopLayer.gradients_at_attention`` with ``attention_scratch_only``: FSDP2,
    wrappers/fully_shard_attention.py) and the scores' gradients are materialised: every layer's saved
    activations but the tail's (the top layer's whole; its MLP block's release is netted in the scratch),
    the attention's own scratch ``S_attention`` (``ActivationPlan.attention_backward_bytes``), the top
    layer's MLP and o_proj weight gradients made, its other gradients not, autocast's casts but the head's::

        gradients = G_top - counted + G_attention,  activations = saved - tail,  scratch = S_attention"""
    top = statics.wrapped.top_layer
    if (top is None or not top.gradients_at_attention or not top.attention_scratch_only
            or statics.checkpointed or not any(kind[5] for kind in statics.acts.kinds)):
        return
    casts = top_layer_row_casts(statics.autocast_copies, statics.head_top_casts, 0)
    grads = statics.earlier_grads_in_layer - top.counted + top.gradients_at_attention
    rows["backward_top_attention"] = (grads, 0, acts.saved_bytes - acts.tail_bytes, casts, held,
                                      acts.attention_backward_bytes, top.gathered)


def bottom_attention_row(statics: MemoryStatics, acts: ActivationPlan, held: Any,
                         embedding_cut: Any) -> Row | None:
    """FSDP2's bottom layer at its attention core's backward, beside the embedding group it prefetched
    (:func:`bottom_layer_row`), where the scores' gradients are materialised (eager, SDPA's math path): as
    at the top layer (``top_attention_row``, wrappers/fully_shard_attention.py) the layer has made its MLP
    block's and o_proj's weight gradients ``G_attention`` (the same per layer as the top one's), its other
    gradients not, its MLP block's saved tensors released (netted in the attention's own scratch); its
    activations A are whole (recomputed, checkpointed), the embedding's host-shard copy long freed
    (simulate: FSDP2 Qwen2.5-32B freeze of both of two layers, checkpointed, CPU offload, eager, b1 x 2048:
    the peak at layer 0's ``_softmax_backward_data``, the embedding's flat all-gather output beside it)::

        gradients = G - counted + G_attention,  activations = A,  scratch = S_attention,
        gathered = the row's - C

    None where the bottom layer makes no gradient (below a freeze run's trained layers) or the wrapper
    says nothing of that moment."""
    top = statics.wrapped.top_layer
    if (top is None or not top.gradients_at_attention or not top.attention_scratch_only
            or not statics.wrapped.bottom_layer_trains or not any(kind[5] for kind in statics.acts.kinds)):
        return None
    layer = (acts.recompute_bytes if statics.checkpointed
             else acts.top_layer_bytes + acts.pinned_bytes - acts.pinned_bytes // statics.n_layers)
    grads = statics.bottom_layer_grads - embedding_cut - top.counted + top.gradients_at_attention
    return (grads, 0, layer, 0, 0 if statics.checkpointed else held, acts.attention_backward_bytes,
            statics.gathered_bottom_backward - statics.gathered_bottom_copy)


def flush_row(statics: MemoryStatics, acts: ActivationPlan, grads: Any, held: Any, backward_temp: Any) -> Row:
    """ZeRO-3's first gradient reduction (wrappers/zero3_flush.py), in the top layer or below it: the
    ``k`` layers above back-propagated, their saved activations released (autograd frees a node's saved
    tensors after its backward), the head's and the final norm's too, and the reduction's layer's MLP block
    once back-propagated (``flush_past_mlp``; the rest of the layer counted whole: an upper bound);
    checkpointed, the layers' checkpoints are left counted and the layer recomputed:

        activations = saved - tail - k x layer - mlp  (checkpointed: saved - tail + recomputed - mlp)"""
    k = statics.wrapped.gathered.flush_layers_above
    gathered = statics.wrapped.gathered.flush
    mlp = acts.mlp_saved_bytes if statics.wrapped.gathered.flush_past_mlp else 0
    # past the MLP its intermediate gradients are gone too, from the layer's first hook none has run yet
    # (zero3_flush.zero3_flush_mlp_done_scratch)
    per_token = statics.wrapped.gathered.flush_scratch_per_token
    if per_token:
        backward_temp = minimum(backward_temp, acts.tokens * per_token)
    if statics.checkpointed:
        kept = held if statics.holds_to_step else 0
        return (grads, 0, acts.saved_bytes - acts.tail_bytes + acts.recompute_bytes - mlp,
                statics.recompute_casts, kept, backward_temp, gathered)
    return (grads, 0, acts.saved_bytes - acts.tail_bytes - k * acts.top_layer_bytes - mlp,
            statics.autocast_copies, held, backward_temp, gathered)


def flush_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan, grads: Any, held: Any,
               backward_temp: Any) -> None:
    """ZeRO-3's in-backward reductions: the first one (:func:`flush_row`) and the
    largest later one in a lower layer (wrappers/zero3_lower_flush.py), the bottom layer's row with what is
    gathered there and the reduction's scratch in place of its gathered parameters; ZeRO-2's past a layer's
    (:func:`zero2_reduction_rows`)."""
    if statics.wrapped.gathered.flush:
        rows["backward_flush"] = flush_row(statics, acts, grads, held, backward_temp)
    zero2_reduction_rows(rows, statics, acts, held, backward_temp)
    lower, per_token = statics.wrapped.gathered.lower_flush
    if lower:
        bottom = rows["backward_layers_bottom"]
        scratch = minimum(bottom[5], acts.tokens * per_token) if per_token else bottom[5]
        rows["backward_lower_flush"] = (*bottom[:5], scratch, lower)


def zero2_reduction_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan, held: Any,
                         backward_temp: Any) -> None:
    """ZeRO-2's reductions in the layers (wrappers/zero2_partition.py): each record moment, its gradients
    and buffers G beside what is saved then, as at ZeRO-3's first reduction (:func:`flush_row`): the ``k``
    trained layers above back-propagated, their saved tensors released (autograd frees a node's saved
    tensors after its backward), the head's and the final norm's too, and, where the gradient's hook fires
    past its layer's MLP block (zero2_partition.past_mlp), the block's saved tensors (``mlp`` =
    ActivationPlan.mlp_saved_bytes) with the block's scratch but its input's gradients (t x T,
    zero2_partition.past_mlp_scratch_per_token); checkpointed, the checkpoints are left counted and the layer
    recomputed (the rest of the layer counted whole: an upper bound). The last record is the largest G::

        activations = saved - tail - k x layer - [past] mlp
                      (checkpointed: saved - tail + recomputed - [past] mlp)
        scratch = [past] min(S, t x T)

    And where the bottom layer's reduction past its MLP block makes the partition P, which the bottom row
    (gradients G, its activations or recomputation A, scratch S) lacks, the moments after it:

        gradients = G + P,  activations = A - mlp,  scratch = S"""
    wrapped = statics.wrapped
    moments = wrapped.reduction_moments
    mlp = acts.mlp_saved_bytes
    layer_acts = acts.saved_bytes - acts.tail_bytes
    past_scratch = minimum(backward_temp, acts.tokens * wrapped.past_mlp_scratch)
    if statics.checkpointed:
        layer_acts, held = layer_acts + acts.recompute_bytes, held if statics.holds_to_step else 0
    for j, (grads, above, past) in enumerate(moments, 1):
        saved = layer_acts if statics.checkpointed else layer_acts - above * acts.top_layer_bytes
        name = "backward_reductions" if j == len(moments) else f"backward_reductions_{j}"
        rows[name] = ((grads, 0, saved - minimum(saved, mlp), 0, held, past_scratch, 0) if past
                      else (grads, 0, saved, 0, held, 0, 0))
    if wrapped.partition_at_bottom:
        grads, temp, layer, casts, bottom_held, scratch, gathered = rows["backward_layers_bottom"]
        rest = layer - minimum(layer, mlp)
        rows["backward_bottom_past_mlp"] = (grads + wrapped.partition_at_bottom, temp, rest, casts,
                                            bottom_held, scratch, gathered)


def layer_end_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan, tokens: Any,
                   grads: tuple[Any, Any], bottom_acts: Any, bottom_held: Any) -> None:
    """The rows at a layer's backward end, beside the next layer it prefetched (when the wrapper gathers
    something there: ``statics.gathered_layer_end``)."""
    top_grads, bottom_grads = grads
    # a lower layer's end: the next layer prefetched beside it (wrappers.base.Gathered layer_end), its
    # activations counted as at the bottom row (an upper bound: they are being freed), its scratch freed;
    # or, later, the base linears back-propagated after the prefetch: bitsandbytes' dequantized weight with
    # the gradients it makes, beside the same activations (layer_end_dequant), the row holding the larger
    # of the two moments
    fixed, per_token = statics.layer_end_dequant
    end_acts, end_temp = bottom_acts, 0
    derived = bool(statics.acts.layer_end_per_token)  # per run: acts' bytes are arrays in a grid
    if statics.checkpointed and derived:
        # the moment itself (activations.ActivationPlan.layer_end_bytes): the checkpoints, what the
        # recomputed layer keeps up to its first adapter, the gradients live then
        end_acts, end_temp = acts.checkpoint_bytes + acts.layer_end_bytes, acts.layer_end_temp_bytes
    dequant = layer_end_dequant(statics, tokens)
    end_scratch = maximum(dequant, end_temp)
    if statics.checkpointed and not derived:
        # the moment not derived: the row counts the whole recomputed layer, an upper bound of what it
        # keeps at the dequantized linear, which the dequantized weight and its gradients replace
        end_scratch = maximum(fixed + tokens * per_token - end_acts, end_temp) if fixed else end_temp
    # checkpointed under autocast: the recomputed casts of the linears up to the first adapted one
    # (weights.recompute_casts_to_first_target), whose backward comes after the prefetch
    rows["backward_layer_end"] = (bottom_grads, 0, end_acts, statics.layer_end_casts, bottom_held,
                                  end_scratch, statics.gathered_layer_end)
    if not statics.checkpointed:
        # the top layer's end alike, every lower layer's activations still saved, the tail released,
        # its own counted whole (an upper bound: they are being freed); under checkpointing the bottom
        # row's recomputation bound already exceeds the lower layers' checkpoints (simulate: FSDP1
        # CPUOffload, Yi-1.5-34B LoRA all-linear)
        top_acts, top_temp = acts.saved_bytes - acts.tail_bytes, 0
        if derived:
            # the moment itself (as under checkpointing): the top layer keeps what it saved up to its first
            # adapter, the gradients live then, in place of its whole activations
            top_acts = top_acts - acts.top_layer_bytes + acts.layer_end_bytes
            top_temp = acts.layer_end_temp_bytes
        top_temp = maximum(dequant, top_temp)
        # beside the casts autocast saved that are not back-propagated yet (layer_end_casts.py)
        rows["backward_top_layer_end"] = (top_grads, 0, top_acts, statics.top_layer_end_casts, bottom_held,
                                          top_temp, statics.gathered_layer_end)


def layer_end_dequant(statics: MemoryStatics, tokens: Any) -> Any:
    """What a LoRA layer's end holds later than the prefetch, when its base linears up to the first adapted
    one are back-propagated: bitsandbytes' dequantized weight with the gradients it makes
    (``statics.layer_end_dequant``: ``MatMul4Bit.backward``) beside the activations the layers below still
    keep (back-propagated after this layer; under checkpointing their checkpoints) and what this layer
    keeps up to that adapter, so the row's activations stay, and the next layer gathered, less the shard
    its all-gather read, freed once gathered (``Gathered.layer_end_transient``: ``post_unshard`` drops it):

        scratch = W_deq + t (h b_res + grads) - transient

    (simulate: fsdp_qlora, Llama-2-70B QLoRA with CPU offload, the top layer's gate projection dequantized
    after its adapter prefetched the layer below: 469,762,048 bytes beside that layer's 151 MB of saved
    activations; checkpointed: the HF Trainer, Llama-2-70B QLoRA at 4 layers with CPU offload). 0 where
    the wrapper's layer end has no dequantized linear."""
    fixed, per_token = statics.layer_end_dequant
    if not fixed:
        return 0
    return maximum(fixed + tokens * per_token - statics.wrapped.gathered.layer_end_transient, 0)


def bottom_layer_row(statics: MemoryStatics, acts: ActivationPlan, held: Any, backward_temp: Any,
                     embedding_cut: Any) -> Row:
    """FSDP2's bottom layer beside the embedding group it prefetched (wrappers/fully_shard.
    embedding_prefetch): that group is held through the whole layer, so, as at the top layer
    (``TopLayer``), the row is the larger of the layer's start (its activations or recomputation, none of
    its unsharded gradients) and its end (its gradients made, its activations released):

        activations = layer activations - min(layer activations, its unsharded gradients)

    The embedding's host-shard copy C (CPU offload) lives only at the prefetch, the layer's
    ``pre_backward`` (torch ``FSDPParamGroup._backward_prefetch``; ``foreach_all_gather`` deletes its inputs
    once copied in), before any of the layer's gradients G and scratch S exist: beside its activations A,
    or, checkpointed, before the layer is recomputed, beside none of them. So the row holds
    max(C (+ A unless checkpointed), G + A - freed + S) beside the rest rather than their sum (simulate:
    FSDP2 Qwen2.5-72B freeze, two layers, CPU offload, b1 x 128: the bottom layer's 1.76 GB of weight
    gradients made after the embedding's 1.25 GB host-shard copy is freed)."""
    top = statics.wrapped.top_layer
    layer = (acts.recompute_bytes if statics.checkpointed
             else acts.top_layer_bytes + acts.pinned_bytes - acts.pinned_bytes // statics.n_layers)
    own = top.counted if top is not None and statics.wrapped.bottom_layer_trains else 0
    freed = minimum(layer, own)
    gathered, copied = statics.gathered_bottom_backward, statics.gathered_bottom_copy
    if copied:
        beside = 0 if statics.checkpointed else layer
        gathered = gathered - copied + maximum(copied + beside - (own + layer - freed) - backward_temp, 0)
    return (statics.bottom_layer_grads - embedding_cut, 0, layer - freed, 0,
            0 if statics.checkpointed else held, backward_temp, gathered)


def bottom_backward_rows(rows: dict[str, Row], statics: MemoryStatics, acts: ActivationPlan, held: Any,
                         backward_temp: Any, embedding_cut: Any) -> None:
    """A sharding wrapper's bottom layer in its backward (FSDP's / ZeRO-3's gathered bottom layer): the
    whole layer (bottom_layer_row) and, where it has one, the moment at its attention core
    (bottom_attention_row); nothing where the wrapper keeps no bottom layer gathered there."""
    if not statics.gathered_bottom_backward:
        return
    rows["backward_bottom_layer"] = bottom_layer_row(statics, acts, held, backward_temp, embedding_cut)
    attention_row = bottom_attention_row(statics, acts, held, embedding_cut)
    if attention_row is not None:
        rows["backward_bottom_attention"] = attention_row
