r"""Gathered ZeRO-3 weights that a checkpoint's recompute leaves to saved views while a lower decoder layer is
back-propagated: LoRA on a model whose linears compute on a view of the weight, the coordinator replayed.

Under checkpointing a layer's backward first recomputes its forward. DeepSpeed 0.19.8's coordinator files
each frozen weight the recompute fetches under the backward module then running
(partitioned_param_coordinator.py ``update_recompute_parameters``: the top linear's ``lora_B``) and
``release_sub_module`` frees them all with that module (``ds_recompute_parameters``), whatever
``stage3_max_reuse_distance`` says. A freed parameter only has its data replaced
(partition_parameters.py ``free_param``), and transformers' ``FalconLinear.forward``
(models/falcon/modeling_falcon.py: ``input @ self.weight.T``) saved a view of the gathered weight for its
input's gradient in the recompute (every layer's input requires grad under checkpointing, PEFT's
``enable_input_require_grads``): that storage lives until the linear's own backward consumes the view,
while the linear's backward fetch gathers a second copy (zero3_saved_views.py has the forward's case).
bitsandbytes' 4-bit matmul saves no view of a 16-bit weight (QLoRA: none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.zero3_module_trace import step_events
from tuneplan.estimator.wrappers.zero3_replay import Coordinator, Event, Param
from tuneplan.estimator.wrappers.zero3_saved_views import VIEW_LINEAR_MODEL_TYPES

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def recompute_views_apply(run: Run) -> bool:
    """Whether the recompute's viewed weights outlive their release: LoRA (not 4-bit) under
    checkpointing on dense layers of a model whose linears compute on a view, in PEFT-wrapped
    transformers modules (the module trace of zero3_module_trace.step_events)."""
    model, setup = run.model, run.setup
    dense = all(not spec.moe and {m.role == "attn" for m in spec.linears} == {True, False}
                for spec, _ in model.layer_groups)
    return (model.model_type in VIEW_LINEAR_MODEL_TYPES and setup.method == "lora"
            and setup.quant_bits is None and bool(setup.gradient_checkpointing) and dense
            and bool(model.embed_params) and run.profile.model_code == "hf")


def replay_with_views(events: list[Event], prefetch_bucket: int, viewed: set[int]) -> list[int]:
    """Bytes held after each event: what the replayed coordinator holds gathered (zero3_replay.py) plus
    the weights in ``viewed`` (ids) it released between their recompute, which saved the view, and their
    own backward, which consumes it:

    .. math:: G_e = C_e + \\sum_{w \\in \\text{viewed},\\ R(w) < \\text{free}(w) < e < B(w)} n_w b_w

    ``B(w)``: the release of the weight's module in the backward (its backward has run by then). A weight
    the coordinator still holds at its backward shares the view's storage: nothing more."""
    c = Coordinator([m for action, m, _ in events if action == "fetch"], prefetch_bucket)
    saved: set[int] = set()  # viewed weights whose recompute saved a view not yet consumed
    kept: dict[int, Param] = {}  # of those, the ones the coordinator released: the view keeps them
    out = []
    for action, module, kind in events:
        if action == "fetch":
            c.fetch(module, kind)
            if kind == "R":
                saved |= {id(p) for p in module.params if id(p) in viewed}
        else:
            if kind == "B":
                # the linear's backward consumed the view before its module is released
                for p in module.params:
                    saved.discard(id(p))
                    kept.pop(id(p), None)
            before = dict(c.gathered)
            c.release(module, kind)
            kept.update({i: p for i, p in before.items() if i in saved and i not in c.gathered})
        out.append(c.gathered_bytes() + sum(p.numel * p.nbytes for p in kept.values()))
    return out


def zero3_recompute_views_lower(run: Run, prefetch_bucket: int) -> int:
    """Bytes held gathered at the most while the MLP of a decoder layer below the top is back-propagated
    (:func:`replay_with_views` over :func:`step_events`, the decoder linears' weights viewed), 0 where
    :func:`recompute_views_apply` does not hold: the instant of the lower layers' row, every activation
    the recompute made still held (past the MLP's release the attention's backward holds less).

    (simulate: falcon-40b, 4 layers, LoRA rank 64 on every linear with checkpointing in fp32 over 8 GPUs:
    at layer 1's ``dense_4h_to_h`` backward fetch the coordinator holds 1.4949e9 elements, layer 0's four
    rounds and the embedding popped ahead, and layer 1's recomputed ``query_key_value``, ``dense``,
    ``dense_h_to_4h`` and ``dense_4h_to_h`` copies, 6.795e8 elements, are kept by their views: 8.697e9
    bytes, the step's peak; falcon-40b, 3 layers, LoRA rank 8 on every linear in bf16 over 4 GPUs: the
    run's peak in layer 1's MLP backward, 6.995e9 bytes, 5.75e9 without the views.)"""
    if not recompute_views_apply(run):
        return 0
    key = f"zero3_recompute_views:{prefetch_bucket}"
    if key not in run.memo:
        events, top = step_events(run)
        # the decoder linears' weight modules (zero3_module_trace.linear_modules: role attn / mlp)
        viewed = {id(m.params[0]) for _, m, _ in events if m.role in ("attn", "mlp") and m.params}
        held = replay_with_views(events, prefetch_bucket, viewed)
        run.memo[key] = max((held[i] for i in mlp_backward(events, top.stop)), default=0)
    most: int = run.memo[key]
    return most


def mlp_backward(events: list[Event], start: int) -> list[int]:
    """Indices of the events from ``start`` on that lie in a layer's backward before its MLP block is
    released (zero3_module_trace.layer_events: the layer's fetch, the norms after the MLP, then the MLP
    block, the first module without parameters the backward fetches; the recompute within it)."""
    out: list[int] = []
    inside, block = False, None
    for i in range(start, len(events)):
        action, module, kind = events[i]
        if action == "fetch" and kind == "B" and module.role == "layer":
            inside, block = True, None
        elif inside and block is None and action == "fetch" and kind == "B" and not module.params:
            block = module
        if inside:
            out.append(i)
        if inside and action == "release" and module is block:
            inside = False
    return out
