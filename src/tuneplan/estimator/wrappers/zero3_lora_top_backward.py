r"""What ZeRO-3 holds gathered through the top decoder layer's backward in a dense 16-bit LoRA run under
checkpointing, from the coordinator replayed over the step's module trace (zero3_module_trace.step_events,
zero3_replay.py), in place of the closed form's bound (zero3_coordinator.zero3_gathered_in_backward).

DeepSpeed 0.19.8 ``PartitionedParameterCoordinator``: the closed form bounds ``__n_available_params`` by
``stage3_max_live_parameters`` ``M`` plus the largest layer parameter, the one a prefetch round crossing
``M`` may pop. Under checkpointing the top layer's MLP backward releases the frozen weights its recompute
fetched (``update_recompute_parameters``, filed under the backward module running), so ``A`` falls under
``M`` before the prefetcher resumes, and what it pops then is the trace ahead (the lower layers recorded
by the forward's prefetcher, then the embedding, popped alone), not ``M`` plus a crossing parameter:

.. math:: G_{top} = \max_{\text{release} \in \text{top layer's backward}} R

with ``R`` the replay's gathered bytes (parameters and the coalesced rounds' flat buffers still filed).
The forward's most, from the same replay: the untied head popped alone beside the layers kept gathered
(:func:`zero3_lora_forward_bytes`); the lower layers' recompute beside the embedding popped past the top
layer and the rounds still filed (:func:`zero3_lora_lower_backward_bytes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.lora_bottom_layer import parallel_block
from tuneplan.estimator.wrappers.zero3_module_trace import replayed_step

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def dense_lora_replayable(run: Run) -> bool:
    """A 16-bit LoRA run with dense sequential decoder layers (attention, then the norms before the MLP,
    then the MLP: the order zero3_module_trace.layer_events fetches them in; not a parallel block, whose
    MLP reads the layer input beside the attention) under checkpointing, in PEFT-wrapped transformers
    modules (hf, LLaMA-Factory), with a token embedding."""
    model, setup = run.model, run.setup
    dense = all(not spec.moe and not parallel_block(model, spec)
                and {m.role == "attn" for m in spec.linears} == {True, False}
                for spec, _ in model.layer_groups)
    return (dense and setup.method == "lora" and setup.quant_bits is None
            and bool(setup.gradient_checkpointing) and bool(model.embed_params)
            and run.profile.model_code == "hf")


def zero3_lora_top_backward_bytes(run: Run, prefetch_bucket: int) -> int:
    """Bytes gathered at the most between module fetches of the top decoder layer's backward (the
    replay's count at each release there) of a dense 16-bit LoRA run under checkpointing; 0 for other
    runs.

    (simulate: Llama-2-70b-hf, 2 layers, LoRA rank 4 on q/v in fp32 with checkpointing over 2 GPUs, second
    step: 4.4711e9 bytes gathered at the loss and through layer 1's backward between fetches, layer 0 and
    the embedding (1.1178e9 elements), where the closed form's ``M`` plus ``gate_proj`` counts 1.2349e9.)"""
    if not dense_lora_replayable(run):
        return 0
    key = f"zero3_lora_top_backward:{prefetch_bucket}"
    if key not in run.memo:
        events, top, rows = replayed_step(run, prefetch_bucket)
        run.memo[key] = max((rows[i] for i in top if events[i][0] == "release"), default=0)
    most: int = run.memo[key]
    return most


def zero3_lora_forward_bytes(run: Run, prefetch_bucket: int) -> tuple[int, int, bool]:
    r"""(bytes gathered at the most through the forward, the decoder layers whose forward ran before, whether
    the module fetched then is in its layer's MLP block) of a dense 16-bit LoRA run under checkpointing,
    from the replay's count after each fetch or release up to the loss (a module's forward runs after its
    fetch); (0, 0, False) for other runs.

    ``_fetch_sub_module_impl`` pops a round while fewer than ``min(M - A, B)`` elements are taken: once the
    queue ahead holds only parameters kept gathered, the next NOT_AVAILABLE one is popped alone as soon
    as ``A < M``, however large: the untied head, popped at a norm's fetch beside the layers the
    forward's prefetcher kept for their backward use:

    .. math:: G_{fwd} = \max_{\text{event} \le \text{loss}} R

    (simulate: Yi-1.5-34B, 4 layers, LoRA rank 64 on q/v in bf16 with checkpointing over 4 GPUs, second
    step: at layer 2's ``post_attention_layernorm`` the head, 64000 x 7168, alone, beside layers 0 to 2's
    MLP weights and layer 3's attention round, 2.9159e9 bytes, the step's peak.)"""
    if not dense_lora_replayable(run):
        return 0, 0, False
    key = f"zero3_lora_forward:{prefetch_bucket}"
    if key not in run.memo:
        events, top, rows = replayed_step(run, prefetch_bucket)
        loss = max(i for i in range(top.start) if events[i][2] == "F")
        best, layers, mlp = (0, 0, False), 0, False
        for i, (action, m, _) in enumerate(events[:loss + 1]):
            if action == "release" and m.role == "layer":
                layers, mlp = layers + 1, False
            mlp = mlp or m.role == "mlp"
            if rows[i] > best[0]:
                best = (rows[i], layers, mlp)
        run.memo[key] = best
    out: tuple[int, int, bool] = run.memo[key]
    return out


def zero3_lora_lower_backward_bytes(run: Run, prefetch_bucket: int) -> int:
    """Bytes gathered at the most while a layer below the top is back-propagated in a dense 16-bit LoRA
    run under checkpointing: the replay's count at each of their recompute's fetches, where the layer's
    recomputed activations are held; 0 for other runs.

    Past the top layer the prefetcher has popped the embedding (its last use) beside the lower layers it
    kept; a lower layer's recompute regathers its frozen weights, filed under the backward module running
    (``update_recompute_parameters``), beside them (simulate: Qwen2.5-72B-Instruct, 4 layers, LoRA rank 16
    on q/v in bf16 with checkpointing over 8 GPUs, second step: 4.7373e9 bytes gathered at layer 0's
    recomputed ``up_proj``, the step's peak.)"""
    if not dense_lora_replayable(run):
        return 0
    key = f"zero3_lora_lower_backward:{prefetch_bucket}"
    if key not in run.memo:
        events, top, rows = replayed_step(run, prefetch_bucket)
        run.memo[key] = max((rows[i] for i in range(top.stop, len(events))
                             if events[i][0] == "fetch" and events[i][2] == "R"), default=0)
    most: int = run.memo[key]
    return most
