"""The module trace of one step of a dense QLoRA run under checkpointing as ZeRO-3's hooks see it (fetches
and releases, forward, the checkpoints' recompute and backward), and what the coordinator's replay over it
(zero3_replay.py) holds gathered at the loss and through the top decoder layer's backward."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from tuneplan.estimator.bnb_scope import expert_stack_bytes, quantized
from tuneplan.estimator.wrappers.reduce_buckets import zero3_leaf_moe
from tuneplan.estimator.wrappers.zero3_replay import Event, Module, Param, replay

if TYPE_CHECKING:
    from collections.abc import Callable

    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import LayerSpec, Linear

    LayerEvents = Callable[[Run, LayerSpec, int], tuple[list[Event], list[Event]]]


def leaf(events: list[Event], module: Module, kind: str) -> None:
    """A module without submodules: its fetch, then its release after it ran."""
    events += [("fetch", module, kind), ("release", module, kind)]


def linear_modules(run: Run, linears: tuple[Linear, ...], bits: int) -> list[list[Module]]:
    """Per linear of a layer in forward order, the modules a fetch runs: the linear alone, or as PEFT's LoRA
    ``Linear.forward`` runs them (peft/tuners/lora/layer.py) the wrapper, whose external parameter is
    ``lora_A`` (zero3_coordinator.forward_trace), ``base_layer``, ``lora_dropout``, ``lora_A``, ``lora_B``.
    A 4-bit weight is its packed codes, ``b/8`` a weight and one byte an element (zero3_quantized.py)."""
    out = []
    adapter, rank = run.dtypes.adapter, run.setup.rank
    for m in linears:
        packs = run.setup.quant_bits is not None and quantized(m, run.profile.model_code)
        numel = m.d_in * m.d_out * bits // 8 if packs else m.d_in * m.d_out
        weight = Module([Param(numel, 1 if packs else run.dtypes.compute)]
                        + ([Param(m.d_out, run.dtypes.compute)] if m.bias else []), role=m.role)
        if m.name in run.targets:
            a, b = Param(rank * m.d_in, adapter, True), Param(m.d_out * rank, adapter, True)
            out.append([Module([a], tree=[a, *weight.params, b]), weight, Module(), Module([a]), Module([b])])
        else:
            out.append([weight])
    return out


def layer_events(run: Run, spec: LayerSpec, bits: int) -> tuple[list[Event], list[Event]]:
    """(forward events, backward events) of one decoder layer under checkpointing.

    The forward: the layer, its input norm, the attention and its linears (a ``q_norm`` / ``k_norm`` after
    ``q_proj`` / ``k_proj`` where the layer has them), the norms before the MLP (Gemma-2/3: two), the MLP
    and its linears with the activation module after the first, the norm after it (Gemma-2/3). The
    backward (the simulation's coordinator: Llama-3.1-70B, 3 layers, QLoRA fp4 on q/v with checkpointing
    over 4 GPUs): the layer, the norm after the MLP, the MLP and its last linear, whose saved input unpacks
    the checkpoint: the forward recomputed without the layer's own hook up to that linear (non-reentrant
    ``checkpoint`` stops there, the MLP's forward left unfinished); then the MLP's other modules in
    reverse, the MLP released, the norms before it, the attention's linears in reverse (a LoRA wrapper,
    ``lora_B``, ``lora_A``, dropout, base layer), the input norm."""
    width = run.model.hidden * (2 if run.model.norm_kind == "layer" else 1)
    qk = (spec.norm_params - spec.n_norms * width) // 2  # q_norm / k_norm inside the attention

    def norm(n: int) -> Module:
        return Module([Param(n, run.dtypes.non_block)])

    # the input norm, the norms between the attention and the MLP, those after it (Gemma-2/3's four)
    in_ln, mid, after = norm(width), [norm(width) for _ in range(1 + (spec.n_norms >= 4))], (
        [norm(width)] if spec.n_norms >= 4 else [])
    layer, attn, act = Module(role="layer"), Module(), Module()
    linears = linear_modules(run, spec.linears, bits)
    attn_l = [(mods, norm(qk) if qk > 0 and m.name in ("q_proj", "k_proj") else None)
              for mods, m in zip(linears, spec.linears, strict=True) if m.role == "attn"]
    moe = leaf_moe_block(run, spec, linears)
    mlp = moe or Module(role="mlp_block")
    mlp_l = [] if moe else [mods for mods, m in zip(linears, spec.linears, strict=True) if m.role != "attn"]

    def forward(kind: str, mlp_upto: int) -> list[Event]:
        ev: list[Event] = []
        leaf(ev, in_ln, kind)
        ev.append(("fetch", attn, kind))
        for mods, qk_norm in attn_l:
            ev += linear_forward(mods, kind)
            if qk_norm is not None:
                leaf(ev, qk_norm, kind)
        ev.append(("release", attn, kind))
        for m in mid:
            leaf(ev, m, kind)
        ev.append(("fetch", mlp, kind))
        for i, mods in enumerate(mlp_l[:mlp_upto]):
            ev += linear_forward(mods, kind)
            if i == 0:
                leaf(ev, act, kind)
        return [*ev, ("release", mlp, kind)]

    # what a leaf module's release walks in them (zero3_replay.Module.walked)
    attn.tree = under([m for mods, qk_norm in attn_l for m in [*mods, *([qk_norm] if qk_norm else [])]])
    mlp.tree = under([m for mods in mlp_l for m in mods]) if moe is None else None
    layer.tree = under([in_ln, *mid, *after, attn, mlp])
    fwd: list[Event] = [("fetch", layer, "F"), *forward("F", len(mlp_l))]
    for m in after:
        leaf(fwd, m, "F")
    fwd.append(("release", layer, "F"))
    if moe is not None:
        return fwd, [*leaf_moe_backward(layer, after, moe, forward("R", 0)),
                     *attention_backward(mlp, mid, attn, attn_l, in_ln), ("release", layer, "B")]
    last = linear_backward(mlp_l[-1])
    # recomputed after its weight's backward, or within ``lora_B``'s (its saved input), which the frozen
    # weights the recompute fetched then go with (update_recompute_parameters)
    first = 2
    bwd: list[Event] = [("fetch", layer, "B")]
    for m in reversed(after):
        leaf(bwd, m, "B")
    bwd += [("fetch", mlp, "B"), *last[:first]]
    # the recompute stops at the forward's last saved tensor: the MLP's product with an untargeted last
    # linear, inside a targeted one's ``lora_B``; the modules it stops in are not released
    targeted = len(mlp_l[-1]) > 1
    unfinished = [mlp, *([mlp_l[-1][0], mlp_l[-1][4]] if targeted else [])]
    bwd += [e for e in forward("R", len(mlp_l) - (not targeted))
            if e[0] == "fetch" or all(e[1] is not m for m in unfinished)]
    bwd += last[first:]
    for i, mods in reversed(list(enumerate(mlp_l[:-1]))):
        if i == 0:
            leaf(bwd, act, "B")
        bwd += linear_backward(mods)
    return fwd, [*bwd, *attention_backward(mlp, mid, attn, attn_l, in_ln), ("release", layer, "B")]


def under(modules: list[Module]) -> list[Param]:
    """Every parameter under ``modules`` (their trees), once each."""
    found = [p for m in modules for p in (m.params if m.tree is None else m.tree)]
    return list({id(p): p for p in found}.values())


def leaf_moe_backward(layer: Module, after: list[Module], block: Module,
                      recompute: list[Event]) -> list[Event]:
    """A layer's backward down to its leaf MoE block's release: the block has no hooked submodule, so its
    backward fetch, then the checkpoint's recompute, which stops inside the block (its saved tensors), the
    block left unreleased there."""
    return [("fetch", layer, "B"), *[e for m in reversed(after) for e in leaf_events(m)],
            ("fetch", block, "B"), *[e for e in recompute if e[0] == "fetch" or e[1] is not block]]


def leaf_events(module: Module) -> list[Event]:
    """A module without submodules in the backward: its fetch and release."""
    return [("fetch", module, "B"), ("release", module, "B")]


def attention_backward(mlp: Module, mid: list[Module], attn: Module,
                       attn_l: list[tuple[list[Module], Module | None]], in_ln: Module) -> list[Event]:
    """A layer's backward from its MLP's release down: the norms before the MLP, the attention's linears
    in reverse (a ``q_norm`` / ``k_norm`` before its projection), the input norm."""
    bwd: list[Event] = [("release", mlp, "B")]
    for m in reversed(mid):
        leaf(bwd, m, "B")
    bwd.append(("fetch", attn, "B"))
    for mods, qk_norm in reversed(attn_l):
        if qk_norm is not None:
            leaf(bwd, qk_norm, "B")
        bwd += linear_backward(mods)
    bwd.append(("release", attn, "B"))
    leaf(bwd, in_ln, "B")
    return bwd


def laid_out_leaf_moe(run: Run, spec: LayerSpec) -> bool:
    """Whether ``spec`` is an MoE layer whose block :func:`leaf_moe_block` lays out."""
    return (spec.moe and zero3_leaf_moe(run.model, run.profile.model_code == "hf")
            and not any(m.name in run.targets for m in spec.linears if m.role == "expert"))


def leaf_moe_block(run: Run, spec: LayerSpec, linears: list[list[Module]]) -> Module | None:
    """A ZeRO-3 leaf MoE block (reduce_buckets.zero3_leaf_moe: DeepSpeed's ``DEFAULT_LEAF_MODULE_CLASSES``)
    as one module: its fetch gathers every parameter under it (``iter_params(recurse=True)``) in
    registration order (``ds_id``): Qwen3-MoE's experts then router, Mixtral's and Qwen2-MoE's router,
    experts, shared expert and its gate. The routed experts are transformers 5's two fused stacks
    (``gate_up_proj`` [E, 2f, h], ``down_proj`` [E, h, f]), never quantized (bnb_scope). None where the
    block is not a leaf, or the experts carry LoRA (PEFT's wrapper around the stacks: not laid out here)."""
    if not laid_out_leaf_moe(run, spec):
        return None
    experts = [m for m in spec.linears if m.role == "expert"]
    width = expert_stack_bytes(run.setup.quant_bits, run.dtypes)
    stacks = [Param(sum(m.params for m in experts if m.reads == reads), width)
              for reads in ("mlp_in", "mlp_mid")]
    # the spec's order, the stacks where the experts are (Qwen3-MoE registers its experts first)
    lead = run.model.model_type.startswith("qwen3_moe")
    params = list(stacks) if lead else []
    for mods, m in zip(linears, spec.linears, strict=True):
        if m is experts[0] and not lead:
            params += stacks
        elif m.role in ("router", "shared_expert"):
            params += [p for mod in mods for p in mod.params]
    return Module(list({id(p): p for p in params}.values()), role="moe", leaf=True)


def linear_forward(mods: list[Module], kind: str) -> list[Event]:
    """A linear's forward events (:func:`linear_modules`): the LoRA wrapper around its four modules."""
    if len(mods) == 1:
        return [("fetch", mods[0], kind), ("release", mods[0], kind)]
    wrapper, *inner = mods
    ev: list[Event] = [("fetch", wrapper, kind)]
    for m in inner:
        leaf(ev, m, kind)
    return [*ev, ("release", wrapper, kind)]


def linear_backward(mods: list[Module]) -> list[Event]:
    """A linear's backward events: the LoRA wrapper around ``lora_B``, ``lora_A``, dropout, base layer."""
    if len(mods) == 1:
        return [("fetch", mods[0], "B"), ("release", mods[0], "B")]
    wrapper, base, dropout, a, b = mods
    ev: list[Event] = [("fetch", wrapper, "B")]
    for m in (b, a, dropout, base):
        leaf(ev, m, "B")
    return [*ev, ("release", wrapper, "B")]


def step_events(run: Run, moe_layer: LayerEvents | None = None) -> tuple[list[Event], range]:
    """The events of one step of a dense QLoRA run under checkpointing, and where the top layer's backward
    lies among them: the four wrappers (``PeftModel``, ``LoraModel``, the task model, the base model), the
    embedding, the rotary module where the config has a rope, the layers, the final norm, the head (tied:
    the embedding's weight); the backward's hooks from the head down to the embedding's, whose output
    requires grad under checkpointing (``enable_input_require_grads``)."""
    model, dtypes = run.model, run.dtypes
    bits = run.setup.quant_bits or 16
    wrappers = [Module() for _ in range(4)]
    embed = Module([Param(model.embed_params, dtypes.non_block)])
    head = Module([Param(model.lm_head_params, dtypes.non_block)] if model.lm_head_params else embed.params)
    final_norm = Module([Param(model.final_norm_params, dtypes.non_block)])
    # ``moe_layer`` lays out the MoE layers where a caller replays non-leaf blocks
    layers = [(moe_layer if moe_layer is not None and spec.moe else layer_events)(run, spec, bits)
              for spec, count in model.layer_groups for _ in range(count)]
    # the base model holds the embedding, the layers and the final norm; the wrappers above it the head too
    wrappers[3].tree = under([embed, *[e[1] for fwd, _ in layers for e in fwd[:1]], final_norm])
    for w in wrappers[:3]:
        w.tree = under([wrappers[3], head])
    ev: list[Event] = [("fetch", w, "F") for w in wrappers]
    leaf(ev, embed, "F")
    if any(k.startswith("rope") for k in model.config):
        leaf(ev, Module(), "F")
    for fwd, _ in layers:
        ev += fwd
    # a classification head is PEFT's ``ModulesToSaveWrapper`` around its trained copy: two fetches
    score = [Module()] if run.setup.num_labels is not None else []
    leaf(ev, final_norm, "F")
    ev += [("fetch", m, "F") for m in score]
    leaf(ev, head, "F")
    ev += [("release", m, "F") for m in score]
    ev += [("release", w, "F") for w in reversed(wrappers)]
    ev += [("fetch", w, "B") for w in wrappers[:3]] + [("fetch", m, "B") for m in score]
    leaf(ev, head, "B")
    ev.append(("fetch", wrappers[3], "B"))
    leaf(ev, final_norm, "B")
    top = range(len(ev), len(ev) + len(layers[-1][1]))
    for _, bwd in reversed(layers):
        ev += bwd
    leaf(ev, embed, "B")
    return [*ev, *[("release", w, "B") for w in reversed(wrappers)]], top


class Replayed(NamedTuple):
    """Bytes ZeRO-3 holds gathered (parameters, and the flat buffers of coalesced rounds still filed) in a
    step with a complete trace: at the loss, the most between module fetches of the top decoder layer's
    backward, and the most while a lower layer's MLP weight is back-propagated (where its row's scratch,
    the dequantized weight, is made)."""

    at_loss: int
    top_backward: int
    lower_backward: int


def replayed_step(run: Run, prefetch_bucket: int) -> tuple[list[Event], range, list[int]]:
    """:func:`step_events` (the events, the top layer's backward span) and the bytes the replayed
    coordinator (zero3_replay.replay) holds after each event, made once per run and prefetch bucket:
    every reading of the replay below shares it (none depends on the batch, the length or the
    accumulation)."""
    key = f"zero3_step_rows:{prefetch_bucket}"
    if key not in run.memo:
        events, top = step_events(run)
        run.memo[key] = (events, top, [g for _, g in replay(events, prefetch_bucket)])
    out: tuple[list[Event], range, list[int]] = run.memo[key]
    return out


def zero3_replayed_gathered(run: Run, prefetch_bucket: int) -> Replayed | None:
    """What a dense QLoRA run under checkpointing holds gathered (:class:`Replayed`), from
    :func:`step_events` replayed (zero3_replay.py); None for other runs.

    At the loss: what the forward's prefetcher ran ahead to, fetch by fetch, under
    ``stage3_max_live_parameters`` with the LoRA matrices over the persistence threshold counted among
    the gathered elements (simulate: DeepSeek-R1-Distill-Llama-8B, 4 layers, QLoRA nf4 rank 128 on every
    linear with checkpointing over 2 GPUs: ``__n_available_params`` 1.0035e9 from layer 0's ``q_proj`` to
    the loss, the head among them, the embedding not; without the LoRA matrices, 3.98e7 elements, the
    head and the packed layers hold under ``M``).

    In the top layer's backward, its MLP's backward releases the weights its recompute fetched, ``A``
    drops under ``M`` and the prefetcher resumes; when what the queue holds before the embedding's
    backward use is kept gathered (the lower layers, recorded by the forward's prefetcher), the embedding
    is popped alone and held from the top layer's attention on:

    .. math:: G = \\sum_{i < L-1} \\sum_{p \\in i} n_p b_p + E\\, b_{nb} + \\sum_{\\text{LoRA} \\in L-1} n b_a

    (simulate: Llama-3.1-70B-Instruct, 3 layers, QLoRA fp4 rank 16 on q/v with checkpointing and a 2-label
    head over 4 GPUs: ``__n_available_params`` 1.9075e9 at layer 2's ``o_proj`` in the second step, the
    embedding gathered at its attention's fetch; the peak in its softmax backward.)

    In the lower layers, whether the embedding's round is coalesced (its copy beside the flat buffer) or
    alone, and where it is popped (simulate: Llama-3.1-405B, 2 layers, QLoRA nf4 rank 4 on the MLP in fp32
    over 8 GPUs: the embedding popped alone in layer 0's MLP backward, beside ``gate_proj``'s dequantized
    weight; Qwen2.5-14B, 3 layers, QLoRA on the MLP over 2 GPUs: popped alone, no copy). The replay's
    count matches the simulation's coordinator at every fetch of the second step for these and for
    Mistral-7B-v0.2 (3 layers, LoRA on the MLP, a 1-label head: the embedding released after its forward
    and popped with the top ``down_proj``'s ``lora_B`` in a coalesced round) and
    DeepSeek-R1-Distill-Llama-8B."""
    if not replayable(run):
        return None
    key = f"zero3_replay:{prefetch_bucket}"
    if key not in run.memo:
        events, top, rows = replayed_step(run, prefetch_bucket)
        loss = max(i for i in range(top.start) if events[i][2] == "F")

        def most(span: range) -> int:
            return max((rows[i] for i in span if events[i][0] == "release"), default=0)

        # the lower layers' recompute, and their MLP weights' backward, where their rows' scratch (a
        # dequantized weight) is made
        lower = max((rows[i] for i in range(top.stop, len(events)) if events[i][0] == "fetch"
                     and (events[i][2] == "R" or events[i][1].role == "mlp")), default=0)
        run.memo[key] = Replayed(rows[loss], most(top), lower)
    replayed: Replayed = run.memo[key]
    return replayed


def replayable(run: Run) -> bool:
    """Whether :func:`zero3_replayed_gathered` replays the run: QLoRA with dense layers, or LoRA with leaf
    MoE blocks (leaf_moe_block), under checkpointing, in PEFT-wrapped transformers modules."""
    model, setup = run.model, run.setup
    dense = all(not spec.moe and {m.role == "attn" for m in spec.linears} == {True, False}
                for spec, _ in model.layer_groups)
    leaf_moe = all(laid_out_leaf_moe(run, spec) for spec, _ in model.layer_groups)
    # transformers' modules wrapped by PEFT (hf, LLaMA-Factory): the module layout above
    peft = run.profile.model_code == "hf"
    # QLoRA's dense layers (the packed weights' closed forms elsewhere), LoRA's leaf MoE blocks
    laid_out = dense if setup.quant_bits is not None else setup.method == "lora" and leaf_moe
    return laid_out and bool(setup.gradient_checkpointing) and bool(model.embed_params) and peft


def zero3_replayed_forward(run: Run, prefetch_bucket: int) -> int:
    """Bytes gathered at the most through the bottom decoder layer's forward of a step with a complete
    trace, from :func:`step_events` replayed, for leaf MoE blocks (:func:`laid_out_leaf_moe`) in a LoRA or
    QLoRA run under checkpointing; 0 for other runs.

    From the wrappers' fetches on the prefetcher pops what the trace holds ahead under
    ``min(M - A, B)``: the embedding alone, then rounds each ending with a fused stack (over ``B``), the
    next layer's stacks among them once the bottom block's are gathered; a coalesced round's copies are
    made at its first wait, its flat buffer held until the last of its parameters is fetched
    (simulate: Qwen3-30B-A3B, 2 layers, QLoRA fp4 in fp32 with optimizer and parameter offload over 4
    GPUs, second step: the embedding, layer 0's ``down_proj`` and ``gate_up_proj`` copy, layer 1's
    ``gate_up_proj`` flat buffer and copy at layer 0's MoE block, the step's peak.)"""
    model, setup = run.model, run.setup
    leaf_moe = all(laid_out_leaf_moe(run, spec) for spec, _ in model.layer_groups)
    if (not leaf_moe or setup.method not in ("lora", "qlora") or not setup.gradient_checkpointing
            or not model.embed_params or run.profile.model_code != "hf"):
        return 0
    key = f"zero3_replay_forward:{prefetch_bucket}"
    if key not in run.memo:
        events, _, rows = replayed_step(run, prefetch_bucket)
        bottom = next(i for i, (action, m, kind) in enumerate(events)
                      if action == "release" and kind == "F" and m.role == "layer")
        run.memo[key] = max(rows[:bottom + 1])
    most: int = run.memo[key]
    return most
