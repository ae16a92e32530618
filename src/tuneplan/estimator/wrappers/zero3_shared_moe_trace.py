r"""ZeRO-3's coordinator replayed through the backward of non-leaf MoE blocks that add their shared experts
after the routed ones (``DeepseekV2Moe.forward``: ``self.gate``, ``self.experts``, then
``hidden_states + self.shared_experts(residuals)``), in a LoRA / QLoRA / freeze run under checkpointing
whose frozen expert stacks the recompute fetches for the shared experts' backward
(zero3_expert_round.zero3_recompute_every_pass). A freeze run's top ``freeze_trainable_layers`` layers
hold trained parameters: ``update_recompute_parameters`` files none of them, and their recomputed stacks
are the ones the experts' backward uses.

The prefetcher (``_fetch_sub_module_impl``, DeepSpeed 0.19.8 runtime/zero/partitioned_param_coordinator.py)
pops the trace queue under :math:`\min(M - A, B)`: at the router's backward fetch of layer ``l`` it pops
what layer ``l-1``'s recompute fetches first (its packed linears, its router) up to its ``gate_up_proj``,
which overshoots ``B``, into one coalesced round; the next fetch, with :math:`A < M`, pops its
``down_proj`` alone. ``AllGatherCoalescedHandle`` (runtime/zero/partition_parameters.py) is filed in
``__inflight_param_registry`` under every parameter of the round: its ``wait`` at the round's first
member fetched copies every member out of the flat buffer (``param.data = torch.cat(partitions)``), and
the flat buffer lives until the last member's entry is popped. So at a lower layer's experts' backward
fetch the layer below's round is still filed (its ``gate_up_proj`` entry waits for that layer's recompute)
while a member fetched earlier (a shared expert's packed weight, where the round reaches into the layer
above's) made the copies, and its ``down_proj`` is gathered beside them.

The replay (zero3_replay.py) counts gathered parameters and filed flat buffers; the recomputed stacks
which ``grouped_mm``'s saved view keeps (zero3_saved_views) after their release are added per layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import expert_stack_bytes
from tuneplan.estimator.wrappers.zero3_expert_round import zero3_recompute_every_pass
from tuneplan.estimator.wrappers.zero3_module_trace import (
    attention_backward,
    leaf,
    leaf_events,
    linear_backward,
    linear_forward,
    linear_modules,
    step_events,
    under,
)
from tuneplan.estimator.wrappers.zero3_replay import Event, Module, Param, replay
from tuneplan.specs.lora_targets import STACK_MARK

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import LayerSpec


def shared_moe_layer_events(run: Run, spec: LayerSpec, bits: int) -> tuple[list[Event], list[Event]]:
    """(forward events, backward events) of one decoder layer with a non-leaf MoE block under
    checkpointing (simulate: DeepSeek-V2-Lite, 4 layers, QLoRA fp4 over 4 GPUs, second step).

    The forward: the input norm, the attention and its linears, the norm before the MLP, the block, its
    router, its experts module (both stacks its own parameters, its activation module inside), the
    shared experts' MLP (gate, activation, up, down). The backward: the layer, the block, the shared
    MLP and its ``down_proj``, whose saved input unpacks the checkpoint: the forward recomputed up to
    the shared ``up_proj``, the block and the shared MLP left unreleased; then the shared ``up_proj``,
    the activation, ``gate_proj``, the shared MLP released, the experts' backward fetch (the stacks
    gathered again: the recompute filed them under the shared MLP, ``update_recompute_parameters``),
    the router, the block released, the attention (zero3_module_trace.attention_backward)."""
    width = run.model.hidden * (2 if run.model.norm_kind == "layer" else 1)
    in_ln, post_ln = (Module([Param(width, run.dtypes.non_block)]) for _ in range(2))
    layer, attn, block, shared, act_e, act_s = (Module(role="layer"), Module(), Module(role="moe"),
                                                Module(), Module(), Module())
    stack_b = expert_stack_bytes(run.setup.quant_bits, run.dtypes)
    linears = linear_modules(run, spec.linears, bits)
    pairs = list(zip(linears, spec.linears, strict=True))
    attn_l = [mods for mods, m in pairs if m.role == "attn"]
    router = Module([Param(m.d_in * m.d_out * m.count, stack_b) for m in spec.linears if m.role == "router"])
    experts = Module([Param(sum(m.params for m in spec.linears if m.role == "expert" and m.reads == r),
                            stack_b) for r in ("mlp_in", "mlp_mid")], role="experts")
    shared_l = [mods for mods, m in pairs if m.role == "shared_expert"]

    def forward(kind: str, shared_upto: int) -> list[Event]:
        ev: list[Event] = []
        leaf(ev, in_ln, kind)
        ev.append(("fetch", attn, kind))
        for mods in attn_l:
            ev += linear_forward(mods, kind)
        ev.append(("release", attn, kind))
        leaf(ev, post_ln, kind)
        ev.append(("fetch", block, kind))
        leaf(ev, router, kind)
        ev.append(("fetch", experts, kind))
        leaf(ev, act_e, kind)
        ev += [("release", experts, kind), ("fetch", shared, kind)]
        for i, mods in enumerate(shared_l[:shared_upto]):
            ev += linear_forward(mods, kind)
            if i == 0:
                leaf(ev, act_s, kind)
        return [*ev, ("release", shared, kind), ("release", block, kind)]

    attn.tree = under([m for mods in attn_l for m in mods])
    shared.tree = under([m for mods in shared_l for m in mods])
    block.tree = under([router, experts, shared])
    layer.tree = under([in_ln, post_ln, attn, block])
    fwd: list[Event] = [("fetch", layer, "F"), *forward("F", len(shared_l)), ("release", layer, "F")]
    last = linear_backward(shared_l[-1])
    # as zero3_module_trace.layer_events: recomputed after an untargeted weight's backward, or within a
    # targeted one's ``lora_B``, the modules it stops in left unreleased
    targeted = len(shared_l[-1]) > 1
    unfinished = [block, shared, *([shared_l[-1][0], shared_l[-1][4]] if targeted else [])]
    bwd: list[Event] = [("fetch", layer, "B"), ("fetch", block, "B"), ("fetch", shared, "B"), *last[:2]]
    bwd += [e for e in forward("R", len(shared_l) - (not targeted))
            if e[0] == "fetch" or all(e[1] is not m for m in unfinished)]
    bwd += last[2:]
    for i, mods in reversed(list(enumerate(shared_l[:-1]))):
        if i == 0:
            bwd += leaf_events(act_s)
        bwd += linear_backward(mods)
    bwd += [("release", shared, "B"), ("fetch", experts, "B"), *leaf_events(act_e),
            ("release", experts, "B"), *leaf_events(router)]
    return fwd, [*bwd, *attention_backward(block, [post_ln], attn, [(m, None) for m in attn_l], in_ln),
                 ("release", layer, "B")]


def zero3_shared_moe_backward(run: Run, prefetch_bucket: int) -> int:
    """Bytes ZeRO-3 holds gathered at the most at an MoE layer's experts' backward fetch (module doc), in a
    step with a complete trace, where zero3_expert_round.zero3_recompute_every_pass holds, every MoE
    block has a router and no stack carries LoRA; 0 for other runs.

    .. math:: G = \\max_l \\left(R_l + b_e S_l + [\\text{gathered at the fetch}]\\, b_e S_l\\right)

    with ``R_l`` the replay's gathered bytes after layer ``l``'s experts' backward fetch (its round's
    copies, and what the prefetcher filed ahead), ``S_l`` its stacks' elements: the recomputed copy the
    saved view keeps, and the round's flat buffer, held until the last copy is made where the fetch
    gathered the stacks (``AllGatherCoalescedHandle.wait``). (simulate: DeepSeek-V2-Lite, 4 layers,
    QLoRA fp4 in fp16 over 4 GPUs, batch 4 x 64: at layer 2's ``down_proj`` copy, layer 1's [router,
    ``gate_up_proj``] flat buffer, its ``gate_up_proj`` copy made at layer 2's shared ``gate_proj`` and
    its ``down_proj`` gathered alone beside layer 2's round and recomputed stacks, 7.34e9 bytes in all.)"""
    model = run.model
    moe = [spec for spec, _ in model.layer_groups if spec.moe]
    if (not zero3_recompute_every_pass(run) or not model.embed_params
            or any(not any(m.role == "router" for m in spec.linears) for spec in moe)
            # PEFT's wrapper around adapted stacks (its own modules and parameters): not laid out here
            or any(t.startswith(STACK_MARK) for t in run.targets)):
        return 0
    key = f"zero3_shared_moe:{prefetch_bucket}"
    if key not in run.memo:
        run.memo[key] = most_at_experts_backward(run, prefetch_bucket)
    most: int = run.memo[key]
    return most


def most_at_experts_backward(run: Run, prefetch_bucket: int) -> int:
    """:func:`zero3_shared_moe_backward`'s maximum over the replayed step's experts' backward fetches."""
    layers = [spec for spec, count in run.model.layer_groups for _ in range(count)]
    trained_from = (len(layers) - min(run.setup.freeze_trainable_layers, len(layers))
                    if run.setup.method == "freeze" else len(layers))
    moe_index = iter(i for i, spec in enumerate(layers) if spec.moe)

    def layer(run: Run, spec: LayerSpec, bits: int) -> tuple[list[Event], list[Event]]:
        fwd, bwd = shared_moe_layer_events(run, spec, bits)
        if next(moe_index) >= trained_from:
            # a freeze run's trained layer: every parameter requires grad (built unmarked, fresh per layer)
            for _, m, _ in fwd:
                for p in [*m.params, *(m.tree or [])]:
                    p.trained = True
        return fwd, bwd

    events, _ = step_events(run, layer)
    rows = replay(events, prefetch_bucket)
    most = 0
    for i, (action, m, kind) in enumerate(events):
        if action == "fetch" and kind == "B" and m.role == "experts":
            stacks = sum(p.numel * p.nbytes for p in m.params)
            # gathered at this fetch: its flat buffer beside the copies until the last one is made
            fresh = rows[i][0] - rows[i - 1][0] >= sum(p.numel for p in m.params)
            # a trained layer's recomputed stacks are the gathered ones, no copy kept beside them
            kept = not any(p.trained for p in m.params)
            most = max(most, rows[i][1] + stacks * (kept + fresh))
    return most
