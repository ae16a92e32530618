r"""The module trace of one step of a LoRA / QLoRA run WITHOUT checkpointing as ZeRO-3's hooks see it, and
what the coordinator's replay over it (zero3_replay.py) holds gathered in the top decoder layer's forward
once its attention has run: before its MLP block, and at each MLP linear beside a 4-bit weight's
dequantized copy.

Without checkpointing no layer is recomputed, and the backward hooks DeepSpeed registers (stage3
``_post_forward_module_hook`` wraps a module's outputs in ``PreBackwardFunctionForModule``, applied only to
tensors that require grad) fire only for modules whose output requires grad:

- the token embedding: frozen, and its output does not require grad (no ``enable_input_require_grads``
  without checkpointing: fully_shard.embedding_output_requires_grad), so it has no backward use;
- the bottom layer: its input is the embedding's output, so every frozen module it runs before the first
  LoRA output (``lora_A``'s, trained) has an output without grad: its input norm, the first targeted
  linear's ``base_layer`` and ``lora_dropout``, and any untargeted linear before it; and so has every
  linear lora_bottom_layer.py finds outside the graph (a parallel block's MLP, which reads the layer
  input).

The trace (``construct_parameter_trace_from_module_trace``) is then the forward's fetches followed by the
backward's, the bottom layer's frozen weights used once. In the top layer's forward the prefetcher has run
ahead into the queue under ``stage3_max_live_parameters``: the layers below are kept for their backward
(within ``stage3_max_reuse_distance`` or recorded), and the round it popped at the bottom layer for the top
layer's weights past its first linear is one coalesced all-gather (``_all_gather_coalesced``) whose flat
buffer stays filed in ``__inflight_param_registry`` until its last parameter's own fetch, beside the copies
its first wait made (``AllGatherCoalescedHandle.wait``). Before the top layer's MLP block that flat buffer
is still held (its last entry is the MLP's first linear):

.. math:: G = \sum_{p\ \text{gathered}} n_p b_p + \sum_{p \in \text{round}} n_p b_p

(simulate: Phi-3-mini-4k-instruct, 4 layers, LoRA rank 32 on ``qkv_proj`` in fp16 over 8 GPUs, second
step: layer 3's ``o_proj``, ``qkv_proj.lora_B`` and ``gate_up_proj`` popped at layer 0 as one 60.06e6-element
round, 120.1 MB, its flat buffer live at layer 3's ``post_attention_layernorm`` beside every layer's weights
but layer 0's ``qkv_proj`` (no backward use, released after its forward): 969.5 MB gathered, the step's
peak.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import quantized
from tuneplan.estimator.dequant_time import dequant_library
from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.zero3_head_pop import dequantized_bytes
from tuneplan.estimator.wrappers.zero3_module_trace import laid_out_leaf_moe, step_events
from tuneplan.estimator.wrappers.zero3_replay import Event, replay

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import Linear


def gradient_free_bottom(run: Run, events: list[Event]) -> set[int]:
    """Ids of the bottom layer's modules whose output requires no grad: its frozen leaves run before the
    first LoRA output (``lora_A``'s: the input norm, the first target's ``base_layer`` and dropout), and
    the weights of the linears lora_bottom_layer.bottom_gradient_free finds outside the graph (a parallel
    block's MLP reads the layer input: its weights too)."""
    spec = run.model.layer_groups[0][0]
    outside = bottom_gradient_free(run.model, run.targets)
    # layer_events fetches the attention's linears, then the MLP's, each in the spec's order
    names = ([m.name for m in spec.linears if m.role == "attn"]
             + [m.name for m in spec.linears if m.role != "attn"])
    start = next(i for i, (action, m, kind) in enumerate(events)
                 if action == "fetch" and kind == "F" and m.role == "layer")
    free: set[int] = set()
    weights, lora_out = 0, False
    for action, m, _ in events[start + 1:]:
        if m.role == "layer":
            break
        if action != "fetch" or m.tree is not None:
            continue
        lora_out = lora_out or any(p.trained for p in m.params)
        if m.role not in ("", "mlp_block", "moe"):  # a linear's weight module (linear_modules)
            weights += 1
            if names[weights - 1] in outside:
                free.add(id(m))
        elif not lora_out:
            free.add(id(m))
    return free


def plain_step_events(run: Run) -> list[Event]:
    """The events of one step without checkpointing: :func:`zero3_module_trace.step_events` without the
    recompute, the embedding's backward use (where its output requires no grad) and the backward hooks of
    the bottom layer's gradient-free modules (module docstring)."""
    events, _ = step_events(run)
    events = [e for e in events if e[2] != "R"]
    embed = events[4][1]  # after the four PEFT wrappers' fetches (step_events)
    free = gradient_free_bottom(run, events)
    if not embedding_output_requires_grad(run.setup):
        free.add(id(embed))
    return [e for e in events if e[2] != "B" or id(e[1]) not in free]


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
        events = plain_step_events(run)
        rows = [g for _, g in replay(events, prefetch_bucket)]
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
        events = plain_step_events(run)
        rows = [g for _, g in replay(events, prefetch_bucket)]
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
    dense = all(not spec.moe and {m.role == "attn" for m in spec.linears} == {True, False}
                for spec, _ in model.layer_groups)
    leaf_moe = all(laid_out_leaf_moe(run, spec) for spec, _ in model.layer_groups)
    return (setup.method in ("lora", "qlora") and not setup.gradient_checkpointing and (dense or leaf_moe)
            and bool(model.embed_params) and run.profile.model_code == "hf")
