"""DeepSpeed's gradient reduction order and its IPG bucket, shared by ZeRO-1/2 (stage_1_and_2.py) and ZeRO-3
(stage3.py): which gradients fire in which order in one backward, and how they fill the reduce bucket."""

from __future__ import annotations

from functools import lru_cache

from tuneplan.estimator.fused_expert_lora import expert_stacks
from tuneplan.specs.model import LayerSpec, ModelSpec


def full_backward_gradients(model: ModelSpec, embedding: bool = True) -> list[int]:
    """A full fine-tune's gradients (elements) in the order their hooks fire: the untied head, the final
    norm, then each layer from the top, its linears last-to-first (its norms counted after them), and the
    token embedding last (tied to the head, its gradient is complete only after the embedding's backward);
    without ``embedding``, up to the bottom layer."""
    return list(_full_backward_gradients(model, embedding))


# the orders and the bucket fills below depend only on the frozen model spec (and a count), made once per
# spec and size: every ZeRO formula of a setup walks the same backward (zero3_flush.py, zero3_lower_flush.py,
# zero3_head_flush_rounds.py, zero12_reductions.py); the public functions hand out fresh lists
@lru_cache(maxsize=256)
def _full_backward_gradients(model: ModelSpec, embedding: bool) -> tuple[int, ...]:
    order = [model.lm_head_params, model.final_norm_params, *_layer_gradients_from_top(model, model.n_layers)]
    return tuple(n for n in [*order, model.embed_params if embedding else 0] if n)


def layer_gradients_from_top(model: ModelSpec, k: int) -> list[int]:
    """The gradients (elements) of the top ``k`` decoder layers in the order their hooks fire: each layer
    from the top, its linears last-to-first, its norms counted after them."""
    return list(_layer_gradients_from_top(model, k))


@lru_cache(maxsize=256)
def _layer_gradients_from_top(model: ModelSpec, k: int) -> tuple[int, ...]:
    order: list[int] = []
    for spec, count in reversed(model.layer_groups):
        take = min(count, k)
        order += layer_hook_order(spec) * take
        k -= take
        if k <= 0:
            break
    return tuple(n for n in order if n)


def layer_hook_order(spec: LayerSpec) -> list[int]:
    """One layer's gradients (elements) in hook order: its linears last-to-first, its norms after them."""
    return [*(m.params // m.count for m in reversed(spec.linears) for _ in range(m.count)), spec.norm_params]


def bucket_fills(gradients: list[int], reduce_bucket: int) -> list[int]:
    """Elements in the IPG bucket at each reduction of one backward, the epilogue's last: a gradient that
    would take the bucket past ``reduce_bucket_size`` reduces what it holds first (DeepSpeed 0.19.8
    ``reduce_independent_p_g_buckets_and_remove_grads``, stage_1_and_2.py and stage3.py alike)."""
    return [sum(fill) for fill in bucket_members(gradients, reduce_bucket)]


def bucket_members(gradients: list[int], reduce_bucket: int) -> list[list[int]]:
    """The gradients (elements) of each reduction of :func:`bucket_fills`."""
    return [list(fill) for fill in _bucket_members(tuple(gradients), reduce_bucket)]


@lru_cache(maxsize=256)
def _bucket_members(gradients: tuple[int, ...], reduce_bucket: int) -> tuple[tuple[int, ...], ...]:
    fills: list[list[int]] = []
    filled: list[int] = []
    held = 0  # sum(filled), kept as the bucket fills (left to right, as sum adds)
    for numel in gradients:
        if filled and held + numel > reduce_bucket:
            fills.append(filled)
            filled, held = [], 0
        filled.append(numel)
        held += numel
    return tuple(map(tuple, [*fills, filled] if filled else fills))


def layer_tensors(spec: LayerSpec, transformers_code: bool = True) -> list[int]:
    """A decoder layer's trainable tensors (elements) in module order, its norms as one last entry. Under
    transformers' model code a MoE layer's routed experts are two tensors, not one per expert: transformers
    5 builds them as fused 3-D parameters (``*Experts``: ``gate_up_proj`` of E x 2f x h and ``down_proj``
    of E x h x f, e.g. modeling_qwen3_moe.py), listed where the first expert projection is (gate and up
    fused, then down); other model code: one tensor per expert projection."""
    if not transformers_code:
        return [*(m.params // m.count for m in spec.linears for _ in range(m.count)), spec.norm_params]
    linears = [m.params for m in spec.linears if m.role != "expert"]
    experts = [m.params for m in spec.linears if m.role == "expert"]
    if experts:
        at = next(i for i, m in enumerate(spec.linears) if m.role == "expert")
        linears[at:at] = [sum(experts[:-1]), experts[-1]] if len(experts) > 1 else experts
    return [*linears, spec.norm_params]


# DeepSpeed 0.19.8 runtime/zero/leaf_module_config.py ``DEFAULT_LEAF_MODULE_CLASSES``: transformers'
# Mixtral, Qwen2-MoE and Qwen3-MoE sparse MoE blocks are ZeRO-3 leaf modules unless the config says otherwise
DS_LEAF_MOE_TYPES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe"})


def zero3_leaf_moe(model: ModelSpec, transformers_code: bool) -> bool:
    """Whether ZeRO-3 treats the model's MoE blocks as leaf modules (:data:`DS_LEAF_MOE_TYPES`, under
    transformers' model code, whose block classes those are)."""
    return transformers_code and model.model_type.removesuffix("_text") in DS_LEAF_MOE_TYPES


def leaf_layer_turns(model: ModelSpec, spec: LayerSpec) -> list[tuple[int, int]]:
    """One MoE decoder layer's gradients under ZeRO-3 leaf MoE blocks, in the order they reach the IPG
    bucket, each as (elements, elements of the block's gradients live at its turn).

    stage3.py (DeepSpeed 0.19.8) ``create_reduce_and_remove_grad_hooks`` gives a leaf module's parameters no
    gradient hook of their own: one ``register_full_backward_hook`` on the block runs, once its whole
    backward is done, ``reduce_ready_partitions_and_remove_grads`` for each of them in parameter order (the
    optimizer groups', which follow the module's registration order: Qwen3-MoE ``experts`` then ``gate``,
    Mixtral and Qwen2-MoE ``gate`` first; the experts fused as ``gate_up_proj`` then ``down_proj``). So all
    of the block's gradients exist when the first is handled, and the one at turn ``j`` sees those from
    ``j`` on still live (``__add_grad_to_ipg_bucket`` has copied the earlier ones into the bucket and
    dropped them). The attention's linears (non-leaf: a hook each) follow, last-to-first, then the norms."""
    router = [m.params for m in spec.linears if m.role == "router"]
    experts = [m.params for m in spec.linears if m.role == "expert"]
    fused = [sum(experts[:-1]), experts[-1]] if len(experts) > 1 else experts
    shared = [m.params for m in spec.linears if m.role == "shared_expert"]
    leaf = [*fused, *router] if model.model_type.startswith("qwen3_moe") else [*router, *fused, *shared]
    leaf = [n for n in leaf if n]
    turns = [(n, sum(leaf[i:])) for i, n in enumerate(leaf)]
    rest = [m.params for m in reversed(spec.linears) if m.role not in ("router", "expert", "shared_expert")]
    return turns + [(n, n) for n in [*rest, spec.norm_params] if n]


def zero3_leaf_backward_turns(model: ModelSpec, full: bool, k: int) -> list[tuple[int, int]]:
    """(elements, elements live at the turn) of the gradients of one ZeRO-3 backward with leaf MoE blocks,
    in bucket order: a full fine-tune's (``full``: the untied head and the final norm first) or the top
    ``k`` layers' (:func:`leaf_layer_turns` per MoE layer; a dense layer as in
    :func:`layer_gradients_from_top`)."""
    turns = [(n, n) for n in (model.lm_head_params, model.final_norm_params) if n] if full else []
    for spec, count in reversed(model.layer_groups):
        take = min(count, k)
        if any(m.role == "expert" for m in spec.linears):
            per_layer = leaf_layer_turns(model, spec)
        else:
            per_layer = [(n, n) for n in layer_hook_order(spec) if n]
        turns += per_layer * take
        k -= take
        if k <= 0:
            break
    return turns



@lru_cache(maxsize=256)
def backward_turns(model: ModelSpec, full: bool, k: int, leaf: bool) -> tuple[tuple[int, int], ...]:
    """(elements, elements of gradients live at its turn) of each gradient of one ZeRO-3 backward up to the
    bottom layer (zero3_flush.zero3_backward_turns): a full fine-tune's (``full``) or the top ``k``
    layers', :func:`zero3_leaf_backward_turns` with ``leaf`` MoE blocks; none when ``k`` is 0 and the run
    is not full. Made once per spec and kind (frozen, hashable)."""
    if not (full or k):
        return ()
    if leaf:
        return tuple(zero3_leaf_backward_turns(model, full, k))
    order = _full_backward_gradients(model, False) if full else _layer_gradients_from_top(model, k)
    return tuple((n, n) for n in order)


@lru_cache(maxsize=256)
def backward_turn_gradients(model: ModelSpec, full: bool, k: int, leaf: bool) -> tuple[int, ...]:
    """The gradients (elements) of :func:`backward_turns`, in the order they reach the bucket."""
    return tuple(n for n, _ in backward_turns(model, full, k, leaf))


def first_hook_after_stacks(model: ModelSpec, targets: frozenset[str], rank: int) -> bool:
    """Whether a LoRA run's first gradient hook (ZeRO-1/2's ``setup_buckets``) comes after the top layer's
    adapted fused expert stacks are back-propagated: the stacks (estimator/fused_expert_lora.py) are its
    MLP's only adapters (PEFT moves the v4 MLP names onto them; the router's backward follows the experts'),
    so the first factor gradients are theirs, made once grouped_mm's backward has used, and autograd
    released, each stack's saved effective weight."""
    top = model.layer_groups[-1][0]
    if not expert_stacks(top, targets, rank):
        return False
    return not any(m.name in targets for m in top.linears if m.role in ("mlp", "shared_expert"))
