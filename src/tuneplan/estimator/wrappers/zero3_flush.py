"""What ZeRO-3 holds gathered when its IPG bucket is first reduced in the backward, and in which layer that
comes: the layers above it back-propagated, their parameters and activations released (DeepSpeed 0.19.8
stage3.py, the order of reduce_buckets.py)."""

from __future__ import annotations

from tuneplan.estimator.wrappers.zero3_coordinator import (
    top_layers_params,
    zero3_bucket_flush,
    zero3_gathered_at_head_flush,
    zero3_gathered_in_backward,
)
from tuneplan.estimator.wrappers.zero3_first_pass import embedding_round_late
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_flush_gathered(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int, reduce_bucket: int,
                         targets: frozenset[str] = frozenset()) -> int:
    """Parameters (elements) gathered at the first in-backward reduction (zero3_bucket_flush > 0), once the
    prefetcher runs ahead: every parameter whose gradient is in the bucket has finished its backward and
    been released (``release_sub_module``), so what is still to be used
    (zero3_coordinator.zero3_gathered_in_backward less those), or the head's own flush
    (zero3_gathered_at_head_flush); not the layers kept at the turn from forward to backward, released by
    then; in the bottom layer (:func:`zero3_flush_layers_above`), after its recompute waited for a late
    round, beside the embedding's copy (zero3_first_pass.embedding_round_late)."""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    done = max(filled - (model.lm_head_params if setup.method == "full" else 0), 0)
    head_flush = zero3_gathered_at_head_flush(model, setup, prefetch_bucket, reduce_bucket)
    held = head_flush if head_flush >= 0 else zero3_gathered_in_backward(model, setup, done, targets)
    in_bottom = zero3_flush_layers_above(model, setup, reduce_bucket) == model.n_layers - 1
    return held + (embedding_round_late(model, setup, prefetch_bucket, targets) if in_bottom else 0)


def zero3_flush_layers_above(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> int:
    """Decoder layers wholly back-propagated before the first in-backward reduction (0 when it comes in the
    top layer or there is none): the gradients in the bucket, less a full fine-tune's head and final norm,
    cover them (their hooks fire in order: reduce_buckets.full_backward_gradients). Their saved activations
    have been released by then (autograd frees a node's saved tensors after its backward)."""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    if not filled:
        return 0
    layers = filled - (model.lm_head_params + model.final_norm_params if setup.method == "full" else 0)
    above = 0
    while above < model.n_layers - 1 and top_layers_params(model, above + 1) <= layers:
        above += 1
    return above


def zero3_flush_past_mlp(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> bool:
    """Whether the first in-backward reduction comes after its layer's MLP linears have been back-propagated
    (their gradients, which fire first in the layer, all in the bucket): the MLP block's saved tensors are
    released by then (activations.ActivationPlan.mlp_saved_bytes)."""
    filled = zero3_bucket_flush(model, setup, reduce_bucket)
    above = zero3_flush_layers_above(model, setup, reduce_bucket)
    if not filled:
        return False
    head = model.lm_head_params + model.final_norm_params if setup.method == "full" else 0
    in_layer = filled - head - top_layers_params(model, above)
    return in_layer >= sum(m.params for m in _layer_from_top(model, above).linears if m.role == "mlp")


def _layer_from_top(model: ModelSpec, k: int) -> LayerSpec:
    """The decoder layer ``k`` below the top (0: the top one)."""
    for spec, count in reversed(model.layer_groups):
        if k < count:
            return spec
        k -= count
    return model.layer_groups[0][0]


def zero3_flush_place(model: ModelSpec, setup: TrainSetup, reduce_bucket: int) -> tuple[int, bool]:
    """(:func:`zero3_flush_layers_above`, :func:`zero3_flush_past_mlp`)."""
    return (zero3_flush_layers_above(model, setup, reduce_bucket),
            zero3_flush_past_mlp(model, setup, reduce_bucket))
