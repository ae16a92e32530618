r"""The module trace of one step of a LoRA / QLoRA run WITHOUT checkpointing as ZeRO-3's hooks see it, and
what the coordinator's replay over it (zero3_replay.py) holds gathered: in the top decoder layer's forward
once its attention has run (before its MLP block, and at each MLP linear beside a 4-bit weight's
dequantized copy), and for dense QLoRA at the loss and through the top layer's backward.

The forward is the checkpointed run's (zero3_module_trace.step_events); the backward has no recompute,
so no ``R`` fetches: each layer's modules are fetched in reverse as autograd reaches them. DeepSpeed
fetches a module in the backward from the ``PreBackwardFunctionForModule`` its forward hook wraps the
module's outputs in (parameter_offload.py ``_pre_backward_module_hook``, ``apply_to_tensors_only``): the
function's backward runs only where that output requires grad, so these modules are never fetched again:

- the token embedding: frozen, and its output does not require grad (PEFT's
  ``prepare_model_for_kbit_training`` and the trainers call ``enable_input_require_grads`` only with
  checkpointing: fully_shard.embedding_output_requires_grad);
- the bottom layer's modules whose output requires no grad (:func:`bottom_gradient_free_modules`): its
  input is the embedding's output, so its input norm, every linear reading a gradient-free tensor
  (lora_bottom_layer.bottom_gradient_free: a targeted one's ``base_layer`` and ``lora_dropout``), the
  attention when its output linear is an untargeted such one, the norms before the MLP, its activation
  and the MLP itself where they read such tensors (a parallel block's MLP reads the layer input).

The trace (``construct_parameter_trace_from_module_trace``) is then the forward's fetches followed by the
backward's, the bottom layer's gradient-free weights used once. In the top layer's forward the prefetcher
has run ahead into the queue under ``stage3_max_live_parameters``: the layers below are kept for their
backward (within ``stage3_max_reuse_distance`` or recorded), and the round it popped at the bottom layer
for the top layer's weights past its first linear is one coalesced all-gather (``_all_gather_coalesced``)
whose flat buffer stays filed in ``__inflight_param_registry`` until its last parameter's own fetch,
beside the copies its first wait made (``AllGatherCoalescedHandle.wait``). Before the top layer's MLP
block that flat buffer is still held (its last entry is the MLP's first linear):

.. math:: G = \sum_{p\ \text{gathered}} n_p b_p + \sum_{p \in \text{round}} n_p b_p

(simulate: Phi-3-mini-4k-instruct, 4 layers, LoRA rank 32 on ``qkv_proj`` in fp16 over 8 GPUs, second
step: layer 3's ``o_proj``, ``qkv_proj.lora_B`` and ``gate_up_proj`` popped at layer 0 as one 60.06e6-element
round, 120.1 MB, its flat buffer live at layer 3's ``post_attention_layernorm`` beside every layer's weights
but layer 0's ``qkv_proj`` (no backward use, released after its forward): 969.5 MB gathered, the step's
peak.)

At the loss of a dense QLoRA run the replay holds what the forward's prefetcher ran ahead to, with its
coalesced rounds' flat buffers still filed and the copies made at a round's first wait, where the closed
form (zero3_quantized.zero3_quantized_ahead_bytes) counts each packed weight once:

.. math:: G_{loss} = \mathrm{replay}(\text{forward})_{loss}

(simulate: falcon-40b, 2 layers, QLoRA nf4 double-quant rank 16 on the MLP, fp16, parameters and
optimizer offloaded, over 2 GPUs, second step: at the loss the tied embedding, 5.3268e8 fp16 elements,
layer 1's packed attention and two 1.3422e8-byte MLP codes, each gathered alone as a copy, and two
coalesced rounds' 1.3422e8-byte flat buffers, layer 0's ``dense_4h_to_h`` round and layer 1's
``dense_h_to_4h``, filed until their last parameter's use: 1.6767e9 bytes, the replay 1.6864e9.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import quantized
from tuneplan.estimator.dequant_time import dequant_library
from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.zero3_head_pop import dequantized_bytes
from tuneplan.estimator.wrappers.zero3_module_trace import Replayed, laid_out_leaf_moe, step_events
from tuneplan.estimator.wrappers.zero3_replay import replay

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.wrappers.zero3_replay import Event
    from tuneplan.specs.model import Linear


def plain_step_events(run: Run) -> tuple[list[Event], range]:
    """:func:`zero3_module_trace.step_events` without the checkpoints' recompute (``R`` events), the
    embedding's backward fetch (where its output requires no grad), and the backward fetches of the
    bottom layer's modules whose output does not require grad (:func:`bottom_gradient_free_modules`),
    and where the top layer's backward lies among them."""
    events, top = step_events(run)
    embed = next(m for _, m, kind in events if kind == "F" and m.params
                 and m.params[0].numel == run.model.embed_params)
    free = bottom_gradient_free_modules(run, events)
    if not embedding_output_requires_grad(run.setup):
        free.add(id(embed))
    kept: list[Event] = []
    start = stop = 0
    for i, e in enumerate(events):
        if i == top.start:
            start = len(kept)
        if i == top.stop:
            stop = len(kept)
        if e[2] == "R" or (e[2] == "B" and id(e[1]) in free):
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
    input is such a one; the activation when the first MLP linear is; the MLP (or leaf MoE block) when
    every linear in it is.

    ``events`` are :func:`zero3_module_trace.step_events`' (its layer layout: the layer, its input norm's
    leaf, the attention, each linear's base weight fetched after its LoRA wrapper, then its dropout's leaf;
    the norms' leaves between the attention's release and the MLP's fetch, the activation's leaf after
    the first MLP linear; a leaf MoE block's linears inside it, not fetched one by one)."""
    spec = run.model.layer_groups[0][0]
    free = bottom_gradient_free(run.model, run.targets)
    first = next(i for i, (action, m, _) in enumerate(events) if action == "fetch" and m.role == "layer")
    span = events[first:]
    moe = laid_out_leaf_moe(run, spec)
    laid = [m for m in spec.linears if not moe or m.role == "attn"]
    weights = [i for i, (action, m, _) in enumerate(span) if action == "fetch" and m.role in ("attn", "mlp")]
    weights = weights[:len(laid)]
    out = {id(span[1][1])}  # the input norm
    # per what a linear reads, whether every linear reading it is frozen with a gradient-free input
    cut: dict[str, bool] = {}
    for i, m in zip(weights, laid, strict=True):
        targeted = m.name in run.targets
        if m.name in free:
            out |= {id(span[i][1]), *([id(span[i + 2][1])] if targeted else [])}
        cut[m.reads] = cut.get(m.reads, True) and m.name in free and not targeted
    attn = span[3][1]
    if cut.get("attn_core"):
        out.add(id(attn))
    j = next(k for k, (action, m, _) in enumerate(span) if action == "release" and m is attn) + 1
    while span[j][1].role not in ("mlp_block", "moe"):  # the norms' leaves before the MLP
        if any(m.name in free for m in spec.linears if m.reads == "mlp_in"):
            out.add(id(span[j][1]))
        j += 2
    block = [m for m in spec.linears if m.role != "attn"]
    if block and all(m.name in free and m.name not in run.targets for m in block):
        out.add(id(span[j][1]))  # the MLP / leaf MoE block: no LoRA in it, a gradient-free input
    mlp_in = [(i, m) for i, m in zip(weights, laid, strict=True) if m.reads == "mlp_in"]
    if mlp_in and cut.get("mlp_in") and mlp_in[0][1].name in free:
        out.add(id(span[mlp_in[0][0] + 2][1]))  # the activation's leaf after an untargeted linear
    return out


def replayed_plain_step(run: Run, prefetch_bucket: int) -> tuple[list[Event], range, list[int]]:
    """:func:`plain_step_events` and the bytes the replayed coordinator holds after each event, made once
    per run and prefetch bucket for every reading below (zero3_module_trace.replayed_step's counterpart)."""
    key = f"zero3_plain_rows:{prefetch_bucket}"
    if key not in run.memo:
        events, top = plain_step_events(run)
        run.memo[key] = (events, top, [g for _, g in replay(events, prefetch_bucket)])
    out: tuple[list[Event], range, list[int]] = run.memo[key]
    return out


def zero3_gathered_past_top_attention(run: Run, prefetch_bucket: int) -> int:
    """Bytes gathered at the most in the top decoder layer's forward past its attention block, from
    :func:`plain_step_events` replayed: parameters and flat buffers still filed before its MLP block's
    fetch, then at each MLP linear's forward with, for a 4-bit weight, what bitsandbytes dequantizes beside
    it (zero3_head_pop.dequantized_bytes); 0 for runs this trace does not lay out
    (:func:`plain_replayable`). (simulate: phi-4, 4 layers, QLoRA fp4 with double quantization on the MLP
    in fp16 over 8 GPUs, a 2-step accumulation: at layer 3's ``down_proj`` the head's round, popped at
    layer 0, held twice (flat buffer and copy) beside every layer's packed MLP codes, 2608.66 MB as the
    replay counts, and the 5120 x 17920 weight dequantized, the step's peak.)"""
    if not plain_replayable(run):
        return 0
    key = f"zero3_plain_top:{prefetch_bucket}"
    if key not in run.memo:
        events, _, rows = replayed_plain_step(run, prefetch_bucket)
        top = max(i for i, (action, m, kind) in enumerate(events)
                  if action == "fetch" and kind == "F" and m.role == "layer")
        # the top layer's MLP container (or leaf MoE block), fetched after its attention and norms
        mlp = next(i for i in range(top, len(events))
                   if events[i][0] == "fetch" and events[i][1].role in ("mlp_block", "moe"))
        done = next(i for i in range(mlp, len(events))
                    if events[i][0] == "release" and events[i][1] is events[mlp][1])
        spec = run.model.layer_groups[-1][0]
        scratch = iter([top_dequant(run, m) for m in spec.linears if m.role != "attn"])
        most = rows[mlp - 1]
        for i in range(mlp, done):
            action, m, _ = events[i]
            if action == "fetch" and m.tree is None and m.role not in ("", "mlp_block", "moe"):
                most = max(most, rows[i] + next(scratch, 0))
        run.memo[key] = most
    gathered: int = run.memo[key]
    return gathered


def zero3_gathered_past_top_mlp_output(run: Run, prefetch_bucket: int) -> int:
    """Bytes gathered at the most in the top decoder layer's backward once its MLP's output linear has been
    back-propagated, from :func:`plain_step_events` replayed: that linear is the layer's first backward
    fetch of a weight, and its release (stage3 ``_post_backward_module_hook`` -> ``release_sub_module``)
    drops its weight and, where a coalesced round's flat buffer was filed until that weight's own fetch,
    the flat buffer too; the most over every later event of the layer's backward (the prefetcher may
    gather the layer below before the top one ends). The MLP's activation backward, the layer's largest
    scratch, runs past that release (autograd runs the activation's node after the output linear's);
    0 for runs this trace does not lay out or with MoE blocks. (simulate: phi-2, 4 layers, LoRA on the
    attention in bf16 over 8 GPUs: at layer 3's gelu backward 432.5 MB gathered, the replay's row after
    ``fc2``'s backward release; 485.2 MB before it.)"""
    if not plain_replayable(run) or any(spec.moe for spec, _ in run.model.layer_groups):
        return 0
    key = f"zero3_plain_top_backward:{prefetch_bucket}"
    if key not in run.memo:
        events, _, rows = replayed_plain_step(run, prefetch_bucket)
        # the top layer is the backward's first layer fetched
        start = next(i for i, (action, m, kind) in enumerate(events)
                     if action == "fetch" and kind == "B" and m.role == "layer")
        layer = events[start][1]
        end = next(i for i in range(start + 1, len(events))
                   if events[i][0] == "release" and events[i][1] is layer)
        # the MLP block's first backward fetch: the output linear's weight, or PEFT's wrapper holding it
        block = next(i for i in range(start + 1, end) if events[i][1].role == "mlp_block")
        first = next(i for i in range(block + 1, end) if events[i][0] == "fetch"
                     and (events[i][1].tree is not None or events[i][1].role == "mlp"))
        output = events[first][1]
        released = next(i for i in range(first + 1, end)
                        if events[i][0] == "release" and events[i][1] is output)
        run.memo[key] = max(rows[released:end + 1])
    gathered: int = run.memo[key]
    return gathered


def top_dequant(run: Run, m: Linear) -> int:
    """Bytes bitsandbytes dequantizes beside a 4-bit weight's forward (0: not a bnb 4-bit weight)."""
    setup, code = run.setup, run.profile.model_code
    bnb_4bit = setup.quant_bits == 4 and dequant_library(setup, code) == "bitsandbytes"
    if not bnb_4bit or not quantized(m, code):
        return 0
    return dequantized_bytes(m, setup.double_quant, run.dtypes.compute)


def plain_replayable(run: Run) -> bool:
    """Whether the run is a LoRA / QLoRA run without checkpointing over PEFT-wrapped transformers modules,
    with dense layers or leaf MoE blocks (the layouts zero3_module_trace lays out)."""
    model, setup = run.model, run.setup
    leaf_moe = all(laid_out_leaf_moe(run, spec) for spec, _ in model.layer_groups)
    return (setup.method in ("lora", "qlora") and not setup.gradient_checkpointing
            and (dense_layers(run) or leaf_moe) and bool(model.embed_params)
            and run.profile.model_code == "hf")


def dense_layers(run: Run) -> bool:
    """Whether every layer is dense, with attention and MLP linears."""
    return all(not spec.moe and {m.role == "attn" for m in spec.linears} == {True, False}
               for spec, _ in run.model.layer_groups)


def zero3_replayed_plain(run: Run, prefetch_bucket: int) -> Replayed | None:
    """What a dense QLoRA run without checkpointing in PEFT's modules holds gathered (at the loss, the
    most in the top layer's backward, the most at a lower layer's MLP weight's backward fetch), from
    :func:`plain_step_events` replayed; None for other runs."""
    if run.setup.quant_bits is None or not plain_replayable(run) or not dense_layers(run):
        return None
    key = f"zero3_replay_plain:{prefetch_bucket}"
    if key not in run.memo:
        events, top, rows = replayed_plain_step(run, prefetch_bucket)
        loss = max(i for i in range(top.start) if events[i][2] == "F")
        most = max((rows[i] for i in top if events[i][0] == "release"), default=0)
        lower = max((rows[i] for i in range(top.stop, len(events))
                     if events[i][0] == "fetch" and events[i][1].role == "mlp"), default=0)
        run.memo[key] = Replayed(rows[loss], most, lower)
    replayed: Replayed = run.memo[key]
    return replayed
