"""What ZeRO-3 keeps of the top decoder layer from its forward to its backward once the output head's two
fetches put it past ``stage3_max_reuse_distance`` (DeepSpeed 0.19.8,
runtime/zero/partitioned_param_coordinator.py).

``__params_to_release`` walks the traced modules after the one it releases, adding up their parameters, and
keeps those met again before the count reaches the distance ``D``. Between a top-layer linear's forward and
its backward the trace holds the head twice, its forward fetch and its backward one (the head's weight gives
its input's gradient in every method): ``2 P_head``, so with ``2 P_head >= D`` the distance keeps no
top-layer linear (zero3_coordinator.zero3_layers_kept). Two other paths keep part of it:

- the prefetcher's record. ``_fetch_sub_module_impl`` pops the trace queue while ``numel_prefetching <
  min(max_live - n_available, prefetch_bucket)``; the queue waits at the head's backward use once the head's
  forward one is popped, and when the top layer's releases bring ``n_available`` under
  ``stage3_max_live_parameters`` ``M`` it pops the head's backward use (gathered: not counted), then the top
  layer's parameters in backward order. One still gathered is recorded in
  ``__most_recent_step_id_param_fetched_for``, which ``__params_to_release`` honours (not released); one
  already released is gathered again. Both are held at the loss, up to the one whose pop brings the count
  to ``M`` or past it (:func:`zero3_recorded_at_loss`).
- a ZeRO-3 leaf MoE block (reduce_buckets.zero3_leaf_moe): the walk lists a traced module's parameters with
  ``recurse=z3_leaf_module(submodule_to_release)``, so for a leaf block every wrapper's whole subtree. The
  causal-LM model's backward fetch comes right after the head's forward: with ``P_norm + P_head < D`` the
  walk meets it and keeps the whole top block (:func:`zero3_leaf_block_kept`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.reduce_buckets import zero3_leaf_moe
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    linear_entries,
    zero3_layers_kept,
)
from tuneplan.estimator.wrappers.zero3_leaf_embedding import LEAF_BLOCK_ROLES
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero3_leaf_block_kept(model: ModelSpec, setup: TrainSetup, head_params: int) -> int:
    """Elements of the top layer's leaf MoE block kept from its forward to its backward (module doc): the
    block's parameters when ``P_norm + P_head < D``, 0 for other models.

    (simulate: Qwen2-57B-A14B, 3 and 4 layers, full fine-tune over 4 and 8 GPUs: the head 5.45e8 elements,
    the top block's 1.982e9 not released after its forward, the attention's linears released.)"""
    if not zero3_leaf_moe(model, get_profile(setup.framework).model_code == "hf"):
        return 0
    if head_params + model.final_norm_params >= DS_MAX_REUSE_DISTANCE:
        return 0
    spec = model.layer_groups[-1][0]
    return sum(m.params for m in spec.linears if m.role in LEAF_BLOCK_ROLES)


def layer_parameters(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                     spec: LayerSpec) -> list[tuple[int, bool]]:
    """One decoder layer's partitioned parameters (elements) in forward order, per linear ``lora_A``, the
    weight, ``lora_B`` (zero3_coordinator.linear_entries), each with whether it is a weight; empty with
    stacked experts (fetched as fused stacks)."""
    if any(m.count != 1 for m in spec.linears):
        return []
    rank = setup.rank if setup.method == "lora" else 0
    return [(n, j == 1) for m in spec.linears for j, n in enumerate(linear_entries(m, rank, targets)) if n]


def recorded_walk(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                  head_params: int) -> tuple[int, int]:
    """(elements gathered at the loss from the head on, weight elements of the top layer recorded while
    still gathered), 0s where the walk does not apply.

    At the top layer's forward the head and the layer are gathered (the prefetcher ran to the head's
    forward use), ``N_0 = P_head + P_top``; each linear's forward releases it, and the first release that
    brings the count under ``M`` lets the prefetcher pop the head's backward use, then the layers'
    parameters from the top one's last (under checkpointing each recompute fetches its layer in forward
    order), to the lowest trained layer under freeze. Those of the top layer after that release are still
    gathered (recorded), the others gathered again, until the count reaches ``M`` or the queue ends."""
    layers = [spec for spec, count in reversed(model.layer_groups) for _ in range(count)]
    if setup.method == "freeze" and not embedding_output_requires_grad(setup):
        layers = layers[:setup.freeze_trainable_layers]
    walks = [layer_parameters(model, setup, targets, spec) for spec in layers]
    if not walks or not all(walks) or setup.method not in ("full", "lora", "freeze"):
        return 0, 0
    top = walks[0]
    available, first_room = head_params + sum(n for n, _ in top), len(top)
    for i, (n, _) in enumerate(top):
        available -= n
        if available < DS_MAX_LIVE_PARAMETERS:
            first_room = i
            break
    total, recorded = head_params, 0
    for depth, walk in enumerate(walks):
        order = list(range(len(walk))) if setup.gradient_checkpointing else list(range(len(walk)))[::-1]
        for i in order:
            if total >= DS_MAX_LIVE_PARAMETERS:
                return total, recorded
            total += walk[i][0]
            recorded += walk[i][0] if depth == 0 and i > first_room and walk[i][1] else 0
    return total, recorded


def zero3_recorded_at_loss(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                           head_params: int, layers_kept: int) -> int:
    """Elements gathered at the loss when no top-layer linear is kept by the distance (``layers_kept``
    zero) and no leaf block is: the head and the layers' parameters the prefetcher recorded or gathered
    again, in backward order, up to the one that brings the count to ``M`` or past it (module doc,
    :func:`recorded_walk`):

    .. math:: G = P_{head} + \\min_k \\{ \\textstyle\\sum_{i \\le k} p_i :
              P_{head} + \\sum_{i \\le k} p_i \\ge M \\}

    (simulate: Qwen2.5-32B, 2 layers, freeze over 2 GPUs: the head 7.786e8, the top layer's ``down_proj``
    recorded and its ``up_proj`` gathered again, 1.0617e9 at the loss; falcon-40b, 2 layers, LoRA on the
    MLP: the tied embedding 5.327e8, ``dense_4h_to_h`` recorded, ``dense_h_to_4h`` gathered again with
    their adapters, 1.0723e9.)"""
    if layers_kept or zero3_leaf_block_kept(model, setup, head_params):
        return 0
    return recorded_walk(model, setup, targets, head_params)[0]


def zero3_recorded_unreleased(model: ModelSpec, setup: TrainSetup, targets: frozenset[str],
                              head_params: int, layers_kept: int) -> int:
    """Weight elements of the top layer the prefetcher recorded while still gathered: never released after
    their forward, so no saved view holds a released copy of them (:func:`recorded_walk`; falcon-40b,
    2 layers, LoRA on the MLP: ``dense_4h_to_h``)."""
    if layers_kept or zero3_leaf_block_kept(model, setup, head_params):
        return 0
    return recorded_walk(model, setup, targets, head_params)[1]


def zero3_recorded_bytes(run: Run, head_params: int) -> int:
    """:func:`zero3_recorded_at_loss` in the compute dtype, for 16-bit layers (0 with quantized ones)."""
    model, setup = run.model, run.setup
    if setup.quant_bits is not None:
        return 0
    kept = zero3_layers_kept(model, head_params)
    return zero3_recorded_at_loss(model, setup, run.targets, head_params, kept) * run.dtypes.compute
