"""Naive model parallelism (``from_pretrained(..., device_map="auto")``): one process, the layers split over
the cards by accelerate's placement rule (``estimator/placement.py``), one card busy at a time. HF Trainer
sees ``hf_device_map`` on more than one card, sets ``is_model_parallel`` and wraps nothing in DDP.

Each card is the single-GPU step of its own part of the model: the same formulas (``memory.memory_of``) on a
``Run`` that holds only the modules placed on it, so that per card
- weights, quantization metadata, LoRA adapters, their gradients and optimizer states are those of its
  modules (PEFT adds each adapter on its layer's card; torch's optimizer makes each state ``zeros_like`` its
  parameter; foreach AdamW groups by device, so the step's temporaries are per card);
- saved activations are those of its layers (under checkpointing, their inputs and one recomputed layer);
  the final norm's fp32 input on the norm's card, the head's input and the whole logits / loss chain on the
  head's card (the last card, or card 0 when the head is tied to the embedding); the embedding backward on
  the embedding's card;
- ``parallel_buffers`` at the end of the forward: the hidden states a card sends to the next (accelerate's
  ``AlignDevicesHook`` copies a layer's input to the layer's card; the sender's copy lives until then), and
  on card 0 the logits the root hook copies back to the input's card (``io_same_device``), held until the
  Trainer's ``compute_loss`` returns, before the backward;
- a cuBLAS workspace and a CUDA context on every card that runs a matmul (accelerate's ``get_max_memory``
  opens a context on every visible card).
The estimate's peak is the fullest card's; every card's figures are listed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.estimator.activations import LayerKinds
from tuneplan.estimator.memory import memory_of
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.overhead import cuda_context_bytes
from tuneplan.estimator.placement import CPU, balanced_budgets, module_tree, place
from tuneplan.estimator.run import Run
from tuneplan.estimator.types import MemoryBreakdown
from tuneplan.estimator.weights import param_plan
from tuneplan.specs.finding import Finding
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

NORM_INPUT_BYTES = 4  # activations.activation_terms: the final norm keeps its fp32 input, 4 h per token


@dataclass(frozen=True)
class Placement:
    """Where accelerate puts the model: ``card_of`` module name -> card (placement.CPU past the last one),
    the budgets it assumed (``max_memory`` per card, bytes) and the layer indices per card."""

    card_of: dict[str, int]
    budgets: tuple[float, ...]
    free: float  # each card's free memory assumed at load (inf: no card given)
    layers: tuple[tuple[int, ...], ...]  # layer indices on each card
    sizes: tuple[int, ...]  # bytes accelerate counts on each card
    cpu_bytes: int  # bytes left on the CPU

    def card(self, kind: str) -> int:
        """The card of ``name``: model.embed_tokens, model.norm, lm_head or model.layers.N."""
        return self.card_of[kind]


def placement(run: Run, accelerator: Accelerator | None) -> Placement:
    """accelerate's placement of ``run``'s model on ``run.setup.gpus`` cards of ``acc`` (no card: unbounded
    cards, so only the balancing cap decides). Free memory at load = the card's memory less its CUDA context
    (``get_max_memory`` reads ``torch.cuda.mem_get_info`` after opening one)."""
    last: tuple[Any, Placement] | None = run.memo.get("device_map")  # (card, placement) of the last card
    if last is not None and (last[0] is accelerator or last[0] == accelerator):
        return last[1]
    model, setup = run.model, run.setup
    if model.architecture != "decoder" or model.head_out:
        raise TuneplanError("the device_map estimate covers causal language models", field="device_map",
                            accepted="a decoder model without {num_labels}, or {device_map=none}")
    tree = module_tree(model, setup, run.dtypes)
    free = free_bytes(accelerator)
    budgets = balanced_budgets(tree, [free] * setup.gpus, setup.device_map, setup.quant_bits is not None)
    out = settle(run, place(tree, budgets), tuple(budgets), free)
    run.memo["device_map"] = (accelerator, out)
    return out


def settle(run: Run, found: dict[str, int], budgets: tuple[float, ...], free: float) -> Placement:
    """A placement from a device map (module name -> card, ``CPU`` for anything else): each module takes the
    card of its nearest named ancestor, as accelerate's ``dispatch_model`` reads a map."""
    tree = module_tree(run.model, run.setup, run.dtypes)
    units = [m for m in _walk(tree) if m.kind]
    where = {}
    for m in units:
        key = m.name
        while key not in found and key:
            key = key.rsplit(".", 1)[0] if "." in key else ""
        where[m.name] = found.get(key, CPU)
    cards = range(run.setup.gpus)
    layers = tuple(tuple(m.index for m in units if m.kind == "layer" and where[m.name] == k) for k in cards)
    per_card = tuple(sum(m.size for m in units if where[m.name] == k) for k in cards)
    cpu = sum(m.size for m in units if where[m.name] == CPU)
    return Placement(where, budgets, free, layers, per_card, cpu)


def free_bytes(accelerator: Accelerator | None) -> float:
    """A card's free memory when the model loads: its memory less the CUDA context accelerate opens first."""
    return float("inf") if accelerator is None else float(accelerator.memory_bytes - cuda_context_bytes())


def assumed_max_memory(setup: TrainSetup, accelerator: Accelerator | None) -> dict[int, int] | None:
    """The ``max_memory`` the estimate assumes ({card: free bytes}, what accelerate's default reads), for a
    recipe to pass explicitly; None without a card (accelerate then reads the cards it runs on) or on one
    card, where a given max_memory would turn off the 90 % rule the estimate assumes."""
    if accelerator is None or setup.gpus == 1:
        return None
    return {k: int(free_bytes(accelerator)) for k in range(setup.gpus)}


def _walk(root: Any) -> list[Any]:
    out, todo = [], [root]
    while todo:
        m = todo.pop(0)
        out.append(m)
        todo = list(m.children) + todo
    return out


def card_run(run: Run, where: Placement, card: int) -> Run:
    """``run`` restricted to the modules on ``card``: its layers, and the embedding, final norm and head where
    they landed; the transfer copies of the module doc in ``parallel_buffers`` at the end of the forward."""
    model, setup, dtypes = run.model, run.setup, run.dtypes
    mine = where.layers[card]
    embed, norm, head = (where.card(k) == card for k in ("model.embed_tokens", "model.norm", "lm_head"))
    head = head and (model.lm_head_params > 0 or model.tied_embeddings)
    sub = _sub_model(model, mine, embed, norm, head)
    sub_setup = setup
    if setup.method == "freeze":  # the last N layers of the model train: those of them on this card
        first = model.n_layers - setup.freeze_trainable_layers
        sub_setup = setup.replace(freeze_trainable_layers=sum(1 for i in mine if i >= first))
    if not mine and setup.is_lora:  # no layer here, so no LoRA target either
        sub_setup = sub_setup.replace(targets=None)
    params = param_plan(sub, sub_setup, dtypes, quant_lm_head=run.profile.quantizes_lm_head)
    kinds = LayerKinds(_kinds_of(run, mine), embedding_dropout=run.layers.embedding_dropout and embed)
    part = Run(model=sub, setup=sub_setup, profile=run.profile, dtypes=dtypes, targets=run.targets,
               param_plan=params, layers=kinds, attn=run.attn, loss=run.loss if head else "upcast",
               optimizer=run.optimizer, wrapper=run.wrapper)
    statics = memory_statics(part)
    full_acts = memory_statics(run).acts
    tail = (NORM_INPUT_BYTES * model.hidden if norm else 0) + (
        full_acts.tail_per_head_token - NORM_INPUT_BYTES * model.hidden if head else 0)
    acts = replace(statics.acts, tail_per_head_token=tail, model=model if embed else statics.acts.model,
                   method=statics.acts.method if embed else "lora")
    embedding = statics.embedding_into_buffer if embed else None
    part.memo["memory"] = replace(statics, acts=acts, embedding_into_buffer=embedding,
                                  gathered_at_forward_end=_copies(run, where, card))
    return part


def _sub_model(model: ModelSpec, layers: tuple[int, ...], embed: bool, norm: bool, head: bool) -> ModelSpec:
    """The model with only ``layers`` (in order, grouped as the model groups them) and the non-block modules
    the card holds; no head: no vocabulary to project on (the logits chain and the head's autocast copy)."""
    kinds = [spec for spec, count in model.layer_groups for _ in range(count)]
    groups: list[tuple[Any, int]] = []
    for i in layers:
        if groups and groups[-1][0] is kinds[i]:
            groups[-1] = (kinds[i], groups[-1][1] + 1)
        else:
            groups.append((kinds[i], 1))
    return replace(model, layer_groups=tuple(groups), n_layers=len(layers),
                   embed_params=model.embed_params if embed else 0,
                   other_params=model.other_params if embed else 0,
                   final_norm_params=model.final_norm_params if norm else 0,
                   lm_head_params=model.lm_head_params if head else 0,
                   vocab=model.vocab if head else 0)


def _kinds_of(run: Run, layers: tuple[int, ...]) -> tuple[Any, ...]:
    """The saved-activation ledgers of ``layers``: ``run.layers`` lists the active layers' kinds in order
    from the first layer that records anything (a freeze run's first trainable one)."""
    setup, n_layers = run.setup, run.model.n_layers
    first = n_layers - setup.freeze_trainable_layers if setup.method == "freeze" else 0
    per_layer = [layer_acts for layer_acts, count in run.layers.kinds for _ in range(count)]
    out: list[tuple[Any, int]] = []
    for i in layers:
        if i < max(first, 0):
            continue
        layer_acts = per_layer[i - max(first, 0)]
        if out and out[-1][0] is layer_acts:
            out[-1] = (layer_acts, out[-1][1] + 1)
        else:
            out.append((layer_acts, 1))
    return tuple(out)


def _path(run: Run, where: Placement) -> list[int]:
    """The card of every step of the forward, in order: embedding, each layer, final norm, head."""
    layers = [where.card(f"model.layers.{i}") for i in range(run.model.n_layers)]
    return [where.card("model.embed_tokens"), *layers, where.card("model.norm"), where.card("lm_head")]


def hand_over_bytes(run: Run, where: Placement) -> tuple[int, int]:
    """(bytes of one hidden-state hand-over: tokens x hidden at the residual dtype, the logits the root hook
    copies back to card 0: tokens x vocabulary at the logits' dtype, none under a fused linear loss, which
    returns no logits, or when the head is on card 0)."""
    setup, model = run.setup, run.model
    tokens = setup.batch * setup.seq
    hidden = tokens * model.hidden * run.dtypes.residual
    logits = 0
    if where.card("lm_head") != 0 and run.loss != "fused_linear":
        logits = tokens * model.head_width * memory_statics(run).logit_bytes
    return hidden, logits


def _copies(run: Run, where: Placement, card: int) -> int:
    """Bytes live at the end of the forward on ``card`` beyond its own step: the hidden states it has sent
    on (once per hand-over to another card), and on card 0 the logits copied back."""
    path = _path(run, where)
    sends = sum(1 for here, there in zip(path, path[1:], strict=False) if here == card and there != card)
    hidden, logits = hand_over_bytes(run, where)
    return sends * hidden + (logits if card == 0 else 0)


def copy_seconds(run: Run, accelerator: Accelerator) -> tuple[float, str]:
    """Seconds per micro-batch of the copies between cards, and the link they cross: each hand-over's hidden
    states forward and their gradient backward, the logits to card 0 once. Nothing hides them: one card
    works at a time and the next waits for its input (``Tensor.to`` on the default stream). The link is the
    one a collective between the cards would use (``links.intra_node_link``: NVLink, PCIe peer-to-peer, or
    through host memory where the card has no peer-to-peer)."""
    from tuneplan.estimator.links import intra_node_link

    where = placement(run, accelerator)
    path = _path(run, where)
    hand_overs = sum(1 for here, there in zip(path, path[1:], strict=False) if here != there)
    hidden, logits = hand_over_bytes(run, where)
    link = intra_node_link(accelerator, run.setup.gpus)
    seconds = (2 * hand_overs * hidden + logits) / (link.gbs * 1e9)
    return seconds, f"{link.name}: {link.gbs:g} GB/s ({link.source})"


@dataclass
class CardMemory:
    """One card's figures: what is on it and its step's peak."""

    card: int
    modules: str  # in words: "embeddings, layers 0-39"
    placed_bytes: int  # as accelerate sized it at load
    budget_bytes: float  # the max_memory accelerate gave the card
    breakdown: MemoryBreakdown

    def to_dict(self) -> dict[str, Any]:
        breakdown = self.breakdown
        return {"card": self.card, "modules": self.modules, "placed_bytes": self.placed_bytes,
                "max_memory_bytes": None if self.budget_bytes == float("inf") else int(self.budget_bytes),
                "allocated_peak_bytes": breakdown.allocated_peak_bytes,
                "reserved_peak_bytes": breakdown.reserved_peak_bytes,
                "device_peak_bytes": breakdown.device_peak_bytes, "peak_instant": breakdown.peak_instant,
                "components": dict(breakdown.components)}


def describe(run: Run, where: Placement, card: int) -> str:
    """The modules on ``card`` in words."""
    parts = [name for key, name in (("model.embed_tokens", "embeddings"),) if where.card(key) == card]
    mine = where.layers[card]
    if mine:
        parts.append(f"layers {mine[0]}-{mine[-1]}" if len(mine) > 1 else f"layer {mine[0]}")
    if where.card("model.norm") == card:
        parts.append("final norm")
    if where.card("lm_head") == card:
        parts.append("lm_head (tied to the embeddings)" if run.model.tied_embeddings else "lm_head")
    return ", ".join(parts) or "nothing"


def card_memories(run: Run, accelerator: Accelerator | None,
                  where: Placement | None = None) -> tuple[Placement, list[CardMemory]]:
    """Every card's memory under accelerate's placement (or ``where``)."""
    where = where or placement(run, accelerator)
    cards = []
    for k in range(run.setup.gpus):
        if where.sizes[k] == 0 and not where.layers[k]:
            # nothing placed: only the context accelerate opened on it
            breakdown = MemoryBreakdown({}, "none", {}, 0, cuda_context_bytes())
        else:
            breakdown = memory_of(card_run(run, where, k))
        cards.append(CardMemory(k, describe(run, where, k), where.sizes[k], where.budgets[k], breakdown))
    return where, cards


def device_map_breakdown(run: Run, accelerator: Accelerator | None,
                         where: Placement | None = None) -> MemoryBreakdown:
    """The fullest card's breakdown, with every card's figures (``per_card``) and the placement in the notes
    (``where``: a placement from elsewhere, e.g. transformers' own, instead of the formula's)."""
    where, cards = card_memories(run, accelerator, where)
    fullest = max(cards, key=lambda card: card.breakdown.device_peak_bytes)
    breakdown = fullest.breakdown
    setup = run.setup
    budget = ", ".join("unbounded" if card_budget == float("inf") else f"{card_budget / 2**30:.2f}"
                       for card_budget in where.budgets)
    free = "; free memory = the card's less its CUDA context" if accelerator is not None else \
        "; no card given, so only the balancing cap splits the layers"
    notes = [f"device_map={setup.device_map}: one process, the layers split over {setup.gpus} cards, one "
             f"busy at a time; figures are card {fullest.card}'s, the fullest",
             f"placement as accelerate computes it (max_memory per card: {budget} GiB{free})"]
    notes += [f"card {card.card}: {card.modules}; "
              f"{card.breakdown.device_peak_bytes / 2**30:.2f} GiB device peak"
              for card in cards]
    if where.cpu_bytes:
        notes.append(spill_text(where))
    notes.append("parallel_buffers: the hidden states a card sends to the next, and on card 0 the logits "
                 "copied back to the input's card, at the end of the forward")
    # a shallow copy, not dataclasses.replace: memory_of's breakdown builds its parts on read
    out = copy.copy(breakdown)
    out.notes = notes + list(breakdown.notes)
    out.per_card = [card.to_dict() for card in cards]
    return out


def spill_text(where: Placement) -> str:
    return (f"{where.cpu_bytes / 2**30:.2f} GiB of the model does not fit within the cards' max_memory: "
            "accelerate leaves it on the CPU")


def spill_finding(run: Run, accelerator: Accelerator | None) -> Finding | None:
    """An error when the placement reaches the CPU: bitsandbytes refuses such a map (``validate_environment``:
    "Some modules are dispatched on the CPU or the disk"); a 16-bit model would copy those weights over the
    host link at every use, which is not a plan."""
    where = placement(run, accelerator)
    if not where.cpu_bytes:
        return None
    why = ("bitsandbytes refuses a map with modules on the CPU" if run.setup.quant_bits is not None
           else "the offloaded weights would cross the host link at every forward and backward")
    return Finding("error", "device-map-spills-to-cpu", f"{spill_text(where)}; {why}",
                   fix="more cards ({gpus}), larger cards, or a smaller method ({method=qlora})",
                   source="transformers integrations/accelerate.py infer_auto_device_map; "
                          "quantizer_bnb_4bit.py validate_environment")


def refuse_in_search(value: Any) -> None:
    """The planner and the sweep evaluate each candidate as one data-parallel card (grids of one ``Run``); a
    device_map plan is a set of cards estimated one at a time, so a search refuses it rather than show the
    whole model on one card."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    if any(v not in (None, "none") for v in values):
        raise TuneplanError("the planner searches data-parallel plans; a plan with the layers split over the "
                            "cards is estimated one at a time", field="device_map",
                            accepted="an estimate with {device_map}, or {device_map=none}")
