"""Which card each module lands on when transformers loads a model with ``device_map="auto"`` (naive model
parallelism: one process, the layers split over its cards), by the placement rules of transformers 5 and
accelerate 1.x, read from their code:

- **Sizes** (``integrations/accelerate.compute_module_sizes``): every parameter and buffer at its load dtype;
  a weight bitsandbytes will quantize counts ``quantized_element_size`` bytes per element (4-bit 0.5, 8-bit
  1; its absmax / scales are not counted); the output head tied to the token embedding counts nothing.
- **Budgets** (``_get_device_map``): ``max_memory`` defaults to each card's free memory
  (``accelerate.utils.get_max_memory``: ``torch.cuda.mem_get_info`` once a context exists on the card).
  "auto" / "balanced" / "balanced_low_0" then cap every card but the last (``get_balanced_memory``) at
  ``total // cards + int(1.25 * biggest)``, biggest = the largest no-split block (the decoder layer class
  in ``_no_split_modules``) or leaf module (the embedding, the head); "balanced_low_0" gives card 0 only
  what the others cannot hold. "sequential" keeps the free memory. Its 90 % rule applies only to a
  single card (no ``max_memory`` given: 90 % of it, the rest "for the buffer"). A bitsandbytes quantizer
  then scales every budget by 0.90 (``adjust_max_memory``).
- **Walk** (``infer_auto_device_map``): the modules in order (the body's embedding, its layers, its final
  norm and rotary buffers, then the head), each on the current card while ``used + size`` fits its budget;
  card 0 keeps room for the largest remaining layer (it is the "main" device that would take back an
  offloaded layer), recomputed as layers are placed; a container that does not fit is split into its
  children; a no-split block that does not fit moves the walk to the next card (card 0 then counts that
  reserve as used). The head tied to the embedding goes with it. Past the last card the walk reaches the
  CPU: bitsandbytes refuses such a map, other models run with those modules offloaded.

transformers 4.x called accelerate's own ``get_balanced_memory``, whose margin is ``1.25 x max(the first
no-split block, the mean size of the modules that hold parameters)``: the same walk (the tests check it
against accelerate's ``infer_auto_device_map``), but on models whose embedding is the largest module (tied
small models) a smaller cap, so a few layers move to later cards. The rule here is transformers 5's.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.estimator.bnb_scope import bnb_replaces
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup

CPU = -1  # the card index of a module the walk leaves on the CPU
BALANCE_MARGIN = 1.25  # get_balanced_memory: buffer = int(1.25 * max(biggest no-split block, biggest leaf))
SINGLE_CARD_SHARE = 0.90  # get_balanced_memory, one card and no max_memory given: "90% is a good compromise"
QUANT_BUDGET = 0.90  # Bnb4BitHfQuantizer / Bnb8BitHfQuantizer.adjust_max_memory (quantization buffers)
ROPE_BUFFERS = 2  # rotary_emb.inv_freq and .original_inv_freq: head_dim / 2 fp32 values each (transformers 5)


@dataclass(frozen=True)
class Module:
    """A module as the walk sees it: its size in bytes, its children in registration order; ``whole``: a
    no-split block (or a module without children); ``tied``: holds the weight the head is tied to."""

    name: str
    size: int
    children: tuple[Module, ...] = ()
    no_split: bool = False
    tied: bool = False
    kind: str = ""  # embed | layer | norm | rotary | head | "" (a container)
    index: int = -1  # the layer's index

    @property
    def whole(self) -> bool:
        return not self.children or self.no_split


def load_bytes(setup: TrainSetup, dtypes: Dtypes) -> int:
    """Bytes per element a parameter is loaded in (the model's dtype at ``from_pretrained``): the trainable
    dtype for a full fine-tune, the frozen weight dtype otherwise (PEFT's later fp32 upcasts come after)."""
    return dtypes.trainable if setup.method == "full" else dtypes.frozen_weight


def layer_bytes(spec: LayerSpec, setup: TrainSetup, dtypes: Dtypes) -> int:
    """One decoder layer's size as transformers computes it. bitsandbytes quantizes the ``nn.Linear``
    weights only: transformers 5 keeps routed experts as fused 3-D parameters and routers as their own
    modules, so neither is quantized (``param_needs_quantization``: an ``nn.Linear4bit`` and not a bias)."""
    element_bytes = load_bytes(setup, dtypes)
    bits = setup.quant_bits
    total = spec.norm_params * element_bytes
    for m in spec.linears:
        weights = m.count * m.d_in * m.d_out
        total += weights * bits // 8 if bits is not None and bnb_replaces(m) else weights * element_bytes
        if m.bias:
            total += m.count * m.d_out * element_bytes
    return int(total)


def module_tree(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes) -> Module:
    """The causal LM as transformers registers it: ``model`` (embed_tokens, layers, norm, rotary_emb), then
    ``lm_head`` (0 bytes when tied: its weight is the embedding's)."""
    element_bytes = load_bytes(setup, dtypes)
    layers: list[Module] = []
    for spec, count in model.layer_groups:
        size = layer_bytes(spec, setup, dtypes)
        for _ in range(count):
            i = len(layers)
            layers.append(Module(f"model.layers.{i}", size, no_split=True, kind="layer", index=i))
    embed = Module("model.embed_tokens", (model.embed_params + model.other_params) * element_bytes,
                   tied=model.tied_embeddings, kind="embed")
    norm = Module("model.norm", model.final_norm_params * element_bytes, kind="norm")
    rotary = Module("model.rotary_emb", ROPE_BUFFERS * (model.head_dim // 2) * 4, kind="rotary")
    stack = Module("model.layers", sum(m.size for m in layers), tuple(layers))
    body_parts = (embed, stack, norm, rotary)
    body = Module("model", sum(m.size for m in body_parts), body_parts, tied=model.tied_embeddings)
    head = Module("lm_head", model.lm_head_params * element_bytes, kind="head")
    return Module("", body.size + head.size, (body, head))


def leaves(root: Module) -> list[Module]:
    """The modules the walk never splits, in order."""
    out: list[Module] = []
    todo = [root]
    while todo:
        m = todo.pop(0)
        if m.whole:
            out.append(m)
        else:
            todo = list(m.children) + todo
    return out


def balanced_budgets(root: Module, free: list[float], rule: str, quantized: bool) -> list[float]:
    """Each card's ``max_memory`` under ``rule`` (auto | balanced | balanced_low_0 | sequential) from the
    free bytes of each card (``float('inf')``: not bounded)."""
    budgets = list(free)
    n_cards = len(budgets)
    if rule != "sequential" and n_cards == 1:
        budgets[0] *= SINGLE_CARD_SHARE
    if rule != "sequential" and n_cards > 1:
        low_zero = rule == "balanced_low_0"
        per_card = root.size // (n_cards - 1 if low_zero else n_cards)
        biggest = max((m.size for m in leaves(root)), default=0)
        per_card += int(BALANCE_MARGIN * biggest)
        for i in range(n_cards - 1):
            budgets[i] = min(budgets[0] if low_zero and i == 0 else per_card, budgets[i])
        if low_zero:
            budgets[0] = min(max(0, root.size - sum(budgets[1:])), budgets[0])
    if quantized:
        budgets = [budget * QUANT_BUDGET for budget in budgets]
    return budgets


def _largest(todo: list[Module]) -> tuple[int, list[str]]:
    """The largest unsplittable module among ``todo`` and its descendants, with the names that reach it."""
    size, names = 0, []
    for m in leaves(Module("", 0, tuple(todo))):
        if m.size > size:
            size, names = m.size, [m.name]
        elif m.size == size:
            names.append(m.name)
    return size, names


def place(root: Module, budgets: list[float]) -> dict[str, int]:
    """Module name -> card (``CPU`` past the last card) for every module the walk places."""
    todo = list(root.children)
    where: dict[str, int] = {}
    used = [0.0] * len(budgets)
    card = 0
    reserve, reserve_names = _largest(todo)
    while todo:
        m = todo.pop(0)
        reserve_names = [n for n in reserve_names if n != m.name and not n.startswith(m.name + ".")]
        if not reserve_names:
            reserve, reserve_names = _largest(todo)
        if card >= len(budgets):  # past the last card: the CPU (bitsandbytes refuses, see the module doc)
            where[m.name] = CPU
            continue
        kept = reserve if card == 0 else 0
        room = budgets[card] - kept
        if used[card] + m.size <= room:
            used[card] += m.size
            where[m.name] = card
            if m.tied:  # the head shares the embedding's weight: it goes where the embedding goes
                head = next((module for module in todo if module.kind == "head"), None)
                if head is not None:
                    todo.remove(head)
                    where[head.name] = card
            continue
        if not m.whole:
            todo = list(m.children) + todo
            reserve, reserve_names = _largest(todo)
            continue
        used[card] += kept
        card += 1
        todo.insert(0, m)
    return where
