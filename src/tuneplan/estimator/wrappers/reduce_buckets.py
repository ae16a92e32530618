"""DeepSpeed's gradient reduction order and its IPG bucket, shared by ZeRO-1/2 (stage_1_and_2.py) and ZeRO-3
(stage3.py): which gradients fire in which order in one backward, and how they fill the reduce bucket."""

from __future__ import annotations

from tuneplan.specs.model import LayerSpec, ModelSpec


def full_backward_gradients(model: ModelSpec, embedding: bool = True) -> list[int]:
    """A full fine-tune's gradients (elements) in the order their hooks fire: the untied head, the final
    norm, then each layer from the top, its linears last-to-first (its norms counted after them), and the
    token embedding last (tied to the head, its gradient is complete only after the embedding's backward);
    without ``embedding``, up to the bottom layer."""
    order = [model.lm_head_params, model.final_norm_params, *layer_gradients_from_top(model, model.n_layers)]
    return [n for n in [*order, model.embed_params if embedding else 0] if n]


def layer_gradients_from_top(model: ModelSpec, k: int) -> list[int]:
    """The gradients (elements) of the top ``k`` decoder layers in the order their hooks fire: each layer
    from the top, its linears last-to-first, its norms counted after them."""
    order: list[int] = []
    for spec, count in reversed(model.layer_groups):
        take = min(count, k)
        per_layer = [m.params // m.count for m in reversed(spec.linears) for _ in range(m.count)]
        per_layer.append(spec.norm_params)
        order += per_layer * take
        k -= take
        if k <= 0:
            break
    return [n for n in order if n]


def bucket_fills(gradients: list[int], reduce_bucket: int) -> list[int]:
    """Elements in the IPG bucket at each reduction of one backward, the epilogue's last: a gradient that
    would take the bucket past ``reduce_bucket_size`` reduces what it holds first (DeepSpeed 0.19.8
    ``reduce_independent_p_g_buckets_and_remove_grads``, stage_1_and_2.py and stage3.py alike)."""
    return [sum(fill) for fill in bucket_members(gradients, reduce_bucket)]


def bucket_members(gradients: list[int], reduce_bucket: int) -> list[list[int]]:
    """The gradients (elements) of each reduction of :func:`bucket_fills`."""
    fills: list[list[int]] = []
    filled: list[int] = []
    for numel in gradients:
        if filled and sum(filled) + numel > reduce_bucket:
            fills.append(filled)
            filled = []
        filled.append(numel)
    return [*fills, filled] if filled else fills


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
