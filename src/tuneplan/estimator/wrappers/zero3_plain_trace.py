r"""The module trace of one step of a dense QLoRA run without checkpointing as ZeRO-3's hooks see it, and
what the coordinator's replay over it (zero3_replay.py) holds gathered at the loss and through the top
decoder layer's backward.

The forward is the checkpointed run's (zero3_module_trace.step_events); the backward has no recompute,
so no ``R`` fetches: each layer's modules are fetched in reverse as autograd reaches them. The embedding's
output does not require grad (PEFT's ``prepare_model_for_kbit_training`` calls
``enable_input_require_grads`` only with ``use_gradient_checkpointing``), so its backward hook never
fires. At the loss the replay holds what the forward's prefetcher ran ahead to, with its coalesced
rounds' flat buffers still filed and the copies made at a round's first wait
(``AllGatherCoalescedHandle``, partition_parameters.py), where the closed form
(zero3_quantized.zero3_quantized_ahead_bytes) counts each packed weight once:

.. math:: G_{loss} = \mathrm{replay}(\text{forward})_{loss}

(simulate: falcon-40b, 2 layers, QLoRA nf4 double-quant rank 16 on the MLP, fp16, parameters and
optimizer offloaded, over 2 GPUs, second step: at the loss the tied embedding, 5.3268e8 fp16 elements,
layer 1's packed attention and two 1.3422e8-byte MLP codes, each gathered alone as a copy, and two
coalesced rounds' 1.3422e8-byte flat buffers, layer 0's ``dense_4h_to_h`` round and layer 1's
``dense_h_to_4h``, filed until their last parameter's use: 1.6767e9 bytes, the replay 1.6864e9.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
from tuneplan.estimator.wrappers.zero3_module_trace import Replayed, step_events
from tuneplan.estimator.wrappers.zero3_replay import replay

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.wrappers.zero3_replay import Event


def plain_step_events(run: Run) -> tuple[list[Event], range]:
    """:func:`zero3_module_trace.step_events` without the checkpoints' recompute (``R`` events), the
    embedding's backward fetch, and the backward fetches of the bottom layer's modules whose output does
    not require grad (:func:`bottom_gradient_free_modules`), and where the top layer's backward lies."""
    events, top = step_events(run)
    embed = next(m for _, m, kind in events if kind == "F" and m.params
                 and m.params[0].numel == run.model.embed_params)
    free = bottom_gradient_free_modules(run, events)
    kept: list[Event] = []
    start = stop = 0
    for i, e in enumerate(events):
        if i == top.start:
            start = len(kept)
        if i == top.stop:
            stop = len(kept)
        if e[2] == "R" or (e[2] == "B" and (e[1] is embed or id(e[1]) in free)):
            continue
        kept.append(e)
    return kept, range(start, stop)


def bottom_gradient_free_modules(run: Run, events: list[Event]) -> set[int]:
    """ids of the bottom layer's modules whose output does not require grad (lora_bottom_layer.py: no
    ``enable_input_require_grads`` without checkpointing): DeepSpeed registers a module's backward fetch
    on an output that requires grad only (parameter_offload.py ``_pre_backward_module_hook``,
    ``apply_to_tensors_only``), so they are never fetched in the backward. The input norm; a frozen linear
    reading such an input (lora_bottom_layer.bottom_gradient_free), or a targeted one's base layer and
    dropout; the attention when its output linear is such a frozen one; the norms before the MLP when its
    input is such a one; the activation when the first MLP linear is; the MLP when its down projection is.

    ``events`` are :func:`zero3_module_trace.step_events`' (its layer layout: the layer, its input norm's
    leaf, the attention, each linear's base weight fetched after its LoRA wrapper, then its dropout's leaf;
    the norms' leaves between the attention's release and the MLP's fetch, the activation's leaf after
    the first MLP linear)."""
    spec = run.model.layer_groups[0][0]
    free = bottom_gradient_free(run.model, run.targets)
    first = next(i for i, (action, m, _) in enumerate(events) if action == "fetch" and m.role == "layer")
    span = events[first:]
    weights = [i for i, (action, m, _) in enumerate(span) if action == "fetch" and m.role in ("attn", "mlp")]
    weights = weights[:len(spec.linears)]
    out = {id(span[1][1])}  # the input norm
    # per what a linear reads, whether every linear reading it is frozen with a gradient-free input
    cut: dict[str, bool] = {}
    for i, m in zip(weights, spec.linears, strict=True):
        targeted = m.name in run.targets
        if m.name in free:
            out |= {id(span[i][1]), *([id(span[i + 2][1])] if targeted else [])}
        cut[m.reads] = cut.get(m.reads, True) and m.name in free and not targeted
    attn = span[3][1]
    if cut.get("attn_core"):
        out.add(id(attn))
    j = next(k for k, (action, m, _) in enumerate(span) if action == "release" and m is attn) + 1
    while span[j][1] is span[j + 1][1]:  # the norms' leaves before the MLP
        if any(m.name in free for m in spec.linears if m.reads == "mlp_in"):
            out.add(id(span[j][1]))
        j += 2
    mlp_in = [(i, m) for i, m in zip(weights, spec.linears, strict=True) if m.reads == "mlp_in"]
    if mlp_in and cut.get("mlp_in") and mlp_in[0][1].name in free:
        out.add(id(span[mlp_in[0][0] + 2][1]))  # the activation's leaf after an untargeted linear
    if cut.get("mlp_mid"):
        out.add(id(span[j][1]))
    return out


def zero3_replayed_plain(run: Run, prefetch_bucket: int) -> Replayed | None:
    """What a dense QLoRA run without checkpointing in PEFT's modules holds gathered (at the loss, the
    most in the top layer's backward, the most at a lower layer's MLP weight's backward fetch), from
    :func:`plain_step_events` replayed; None for other runs."""
    model, setup = run.model, run.setup
    dense = all(not spec.moe and {m.role == "attn" for m in spec.linears} == {True, False}
                for spec, _ in model.layer_groups)
    if (setup.quant_bits is None or setup.gradient_checkpointing or not dense or not model.embed_params
            or run.profile.model_code != "hf"):
        return None
    key = f"zero3_replay_plain:{prefetch_bucket}"
    if key not in run.memo:
        events, top = plain_step_events(run)
        rows = [g for _, g in replay(events, prefetch_bucket)]
        loss = max(i for i in range(top.start) if events[i][2] == "F")
        most = max((rows[i] for i in top if events[i][0] == "release"), default=0)
        lower = max((rows[i] for i in range(top.stop, len(events))
                     if events[i][0] == "fetch" and events[i][1].role == "mlp"), default=0)
        run.memo[key] = Replayed(rows[loss], most, lower)
    replayed: Replayed = run.memo[key]
    return replayed
