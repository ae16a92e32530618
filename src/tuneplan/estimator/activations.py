"""Saved activations of the whole model: the layers (``layer_saved.layer_activations``, one ledger walk per
kind of layer), what lives outside them (final norm, head input, embedding dropout), and what gradient
checkpointing, activation offload and bitsandbytes' pinned inputs make of that sum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.estimator.activation_terms import ActivationTerms, LayerKinds, activation_terms
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.layer_saved import layer_activations
from tuneplan.estimator.saved_tensors import LayerActs, embedding_backward_at
from tuneplan.estimator.xp import int_for, maximum
from tuneplan.specs.lora_targets import STACK_MARK
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

__all__ = ["ActivationPlan", "ActivationTerms", "LayerActs", "LayerKinds", "activation_plan",
           "activation_terms", "activations_at", "layer_activations", "layer_kinds", "saved_at"]


@dataclass(slots=True)
class ActivationPlan:
    """The saved activations at one shape (ints) or at every shape of a grid (int64 arrays). Not frozen, with
    slots, every field positional (the terms and the shape first): one is made per estimate, a frozen
    dataclass's ``__init__`` costs several times as much and keyword arguments a sixth of a microsecond."""

    # the terms and the shape the moments below are read from (the scalar estimate reads none of them on a
    # single GPU: they are products of the tokens, made when a row that reads them is built)
    terms: ActivationTerms
    tokens: Any  # batch x seq
    seq: Any
    saved_bytes: int  # all saved activations at the end of forward (layers + embedding/final norm)
    top_layer_bytes: int  # one layer's saved activations (the one recomputed / freed first)
    checkpoint_bytes: int  # layer inputs kept under gradient checkpointing (0 otherwise)
    recompute_bytes: int  # one layer's activations rebuilt during backward under checkpointing
    # the largest layer's activation gradients (a fused expert stack's moment aside); checkpointed: beside
    # recompute_bytes they make the largest layer kind's recomputation plus its own scratch (saved_at)
    backward_temp_bytes: int
    offloaded_bytes: int = 0  # checkpoints moved to host memory (Unsloth)
    # The token-embedding gradient is the last one backward makes (full fine-tune): the bottom layer runs
    # without it, and the embedding backward adds its own transients on top of all the other gradients.
    embedding_grad_bytes: int = 0
    embedding_backward_bytes: int = 0
    # bitsandbytes-held 4-bit matmul inputs of every layer and of a quantized lm_head (LayerActs.pinned)
    pinned_bytes: int = 0
    # what the final norm and the head keep (in saved_bytes): released before the top layer's backward
    tail_bytes: int = 0
    # a fused expert stack's weight gradient and the gradients beside it (LayerActs.backward_per_layer)
    expert_stack_bytes: int = 0

    @property
    def mlp_saved_bytes(self) -> Any:
        """What the largest layer's MLP block keeps (in top_layer_bytes / recompute_bytes; LayerActs.
        mlp_saved): ``t x mlp_saved_per_token``."""
        terms, tokens = self.terms, self.tokens
        return int_for(tokens)(tokens * terms.mlp_saved_per_token) if terms.mlp_saved_per_token else 0

    @property
    def attention_backward_bytes(self) -> Any:
        """Eager attention's backward scratch, ``backward_temp_bytes``' attention term (0: none, or
        checkpointed): of the terms it takes the larger of, the scores' gradients net of what the layer
        released before them (the MLP block's saved tensors), ``max_k (t s x per_pos_k + t x offset_k)``."""
        tokens, seq = self.tokens, self.seq
        attention: Any = 0
        for kind in self.terms.kinds:
            if kind[5]:
                attention = maximum(attention, tokens * seq * kind[5] + tokens * kind[6])
        return int_for(tokens)(attention)

    @property
    def layer_end_bytes(self) -> Any:
        """Under checkpointing, when a recomputed layer's first LoRA adapter starts its backward: what the
        layer keeps beyond its checkpoint (without checkpointing, with what aliases its input, its own
        saved tensor; 0: not derived, or activations offloaded; ActivationTerms)."""
        terms, tokens = self.terms, self.tokens
        # an eager attention's O(s) part, where the adapter follows it (ActivationTerms.layer_end_per_pos)
        scores = tokens * self.seq * terms.layer_end_per_pos if terms.layer_end_per_token else 0.0
        if terms.checkpointed:
            return int_for(tokens)(tokens * terms.layer_end_per_token + scores)
        if terms.offload:
            return 0
        # without checkpointing the layer's input is its own saved tensor: the moment counts what aliases it
        end = terms.layer_end_per_token
        return int_for(tokens)(tokens * (end + terms.layer_end_alias_per_token if end else 0.0) + scores)

    @property
    def upper_backward_temp_bytes(self) -> Any:
        """``backward_temp_bytes`` over the kinds above the lower ones (ActivationTerms.lower_kinds): the
        scratch beside every saved activation, at the top layer's backward; a lower kind's own scratch
        comes once the layers above it have released theirs (none without checkpointing: saved_at)."""
        terms, tokens = self.terms, self.tokens
        folded = terms.upper_temp_per_token  # once per run (activation_terms), where it applies
        if folded is not None:
            return int_for(tokens)(tokens * folded)
        if not terms.lower_kinds or terms.checkpointed or terms.offload:
            return self.backward_temp_bytes
        seq = self.seq
        upper: Any = 0
        for kind in terms.kinds[terms.lower_kinds:]:
            temp = tokens * kind[4]
            if kind[5]:
                temp = maximum(temp, tokens * seq * kind[5] + tokens * kind[6])
            upper = maximum(upper, temp)
        return int_for(tokens)(upper)

    @property
    def layer_end_temp_bytes(self) -> Any:
        """... and the activation gradients live then (0: not derived, or activations offloaded)."""
        terms, tokens = self.terms, self.tokens
        if terms.offload and not terms.checkpointed:
            return 0
        return int_for(tokens)(tokens * terms.layer_end_temp_per_token)

    @property
    def first_hook_bytes(self) -> Any:
        """Without checkpointing, when the largest layer's first trained gradient is ready (its last LoRA
        adapter's): what it keeps (0: not derived, checkpointed or offloaded; ActivationTerms)."""
        terms, tokens = self.terms, self.tokens
        if terms.checkpointed or terms.offload:
            return 0
        return int_for(tokens)(tokens * terms.first_hook_per_token)

    @property
    def first_hook_temp_bytes(self) -> Any:
        """... and the activation gradients live then (0: not derived, checkpointed or offloaded)."""
        terms, tokens = self.terms, self.tokens
        if terms.checkpointed or terms.offload:
            return 0
        return int_for(tokens)(tokens * terms.first_hook_temp_per_token)


def layer_kinds(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes, targets: frozenset[str], attn: str,
                python_model_code: bool, quant_saves_input: bool = False, litgpt_code: bool = False,
                expand_kv: bool = False, unsloth_code: bool = False) -> LayerKinds:
    """Each group of identical layers counted once (the planner calls this for 100+-layer models); a
    freeze run records nothing below its first trainable layer, and a frozen-embedding run's first active
    layer reads an input without gradient, which makes it a kind of its own."""
    layer_no = 0
    first_trainable = model.n_layers - setup.freeze_trainable_layers if setup.method == "freeze" else 0
    first_active = first_trainable if setup.method == "freeze" else 0
    if setup.is_lora:
        first_active = first_adapted_layer(model, setup, targets)
    out: list[tuple[LayerActs, int]] = []
    lower = 0
    for spec, count in model.layer_groups:
        start, end = layer_no, layer_no + count
        layer_no = end
        if setup.is_lora and start < first_active:
            # LoRA layers below the first adapter read and make nothing that needs a gradient: autograd
            # records nothing (DeepSeek with mlp targets under transformers 5: the dense first layer's MLP
            # loses its adapters to the fused experts, estimator/fused_expert_lora.py)
            out.append((LayerActs(0.0, 0.0, 0.0, 0.0), min(end, first_active) - start))
            start = min(end, first_active)
            if start >= end:
                continue
        if setup.method == "freeze":
            trainable_start = max(start, first_trainable)
            if trainable_start >= end:
                continue  # nothing upstream needs a gradient: autograd records nothing in these layers
            start = trainable_start
        if setup.method != "full" and start <= first_active < end:
            # embeddings frozen: the first layer that trains reads an input without gradient
            out.append((layer_activations(model, spec, setup, dtypes, targets, setup.method == "freeze", attn,
                                          python_model_code, quant_saves_input, input_requires_grad=False,
                                          litgpt_code=litgpt_code, expand_kv=expand_kv,
                                          unsloth_code=unsloth_code), 1))
            start += 1
            lower = len(out)
        if end > start:
            trainable = setup.method in ("full", "freeze")
            out.append((layer_activations(model, spec, setup, dtypes, targets, trainable, attn,
                                          python_model_code, quant_saves_input, litgpt_code=litgpt_code,
                                          expand_kv=expand_kv,
                                          unsloth_code=unsloth_code), end - start))
    emb_dropout = model.dropouts[2] > 0 and not (litgpt_code or expand_kv)
    return LayerKinds(tuple(out), embedding_dropout=emb_dropout, lower_kinds=lower if lower < len(out) else 0)


def first_adapted_layer(model: ModelSpec, setup: TrainSetup, targets: frozenset[str]) -> int:
    """The index of the first layer holding a LoRA adapter (a targeted linear or fused expert stack; 0
    when none has one)."""
    layer_no = 0
    for spec, count in model.layer_groups:
        if (any(m.name in targets for m in spec.linears)
                or (any(m.role == "expert" for m in spec.linears)
                    and any(t.startswith(STACK_MARK) for t in targets))):
            return layer_no
        layer_no += count
    return 0


def activation_plan(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes, targets: frozenset[str], attn: str,
                    gc_offload: bool, python_model_code: bool, quant_saves_input: bool = False,
                    litgpt_code: bool = False, quant_lm_head: bool = False,
                    expand_kv: bool = False, unsloth_code: bool = False) -> ActivationPlan:
    kinds = layer_kinds(model, setup, dtypes, targets, attn, python_model_code, quant_saves_input,
                        litgpt_code, expand_kv, unsloth_code)
    return activations_at(model, setup, dtypes, kinds, setup.batch, setup.seq, gc_offload=gc_offload,
                          quant_saves_input=quant_saves_input, litgpt_code=litgpt_code,
                          quant_lm_head=quant_lm_head, expand_kv=expand_kv)


def activations_at(model: ModelSpec, setup: TrainSetup, dtypes: Dtypes, kinds: LayerKinds, batch: Any,
                   seq: Any, *, gc_offload: bool, quant_saves_input: bool = False, litgpt_code: bool = False,
                   quant_lm_head: bool = False, expand_kv: bool = False) -> ActivationPlan:
    """:func:`saved_at` with the terms resolved from the arguments (``litgpt_code`` and ``expand_kv`` are
    already in ``kinds``)."""
    terms = activation_terms(model, setup, dtypes, kinds, gc_offload=gc_offload,
                             quant_saves_input=quant_saves_input, quant_lm_head=quant_lm_head)
    return saved_at(terms, batch, seq)


def saved_at(terms: ActivationTerms, batch: Any, seq: Any) -> ActivationPlan:
    """The saved activations at ``batch`` x ``seq`` (Python ints, or numpy arrays of a grid: see ``xp``).

    A layer kind keeps ``t * per_token + t * s * per_token_per_pos + per_layer`` bytes (t = batch * seq
    tokens, s key positions of eager attention; per_layer: what does not scale with tokens, e.g. a LoRA'd
    fused expert stack's effective weight); the model keeps the sum over its layers plus the tail (per
    head token, what the final norm and the head keep; per token, the embedding-dropout mask); under gradient
    checkpointing only each layer's input (t x residual bytes x hidden) plus the largest layer recomputed
    in backward, beside its own scratch (one layer is recomputed and back-propagated at a time, utils/
    checkpoint.py): ``recompute = max_k R_k``, ``backward_temp = max_k (R_k + T_k) - recompute`` (R_k, T_k:
    kind k's recomputation and scratch; T_k's attention term is net of k's own MLP block's release)."""
    # (no in-place += below: on a grid an operand may broadcast to a larger shape than the accumulator)
    tokens = batch * seq
    to_int = int_for(tokens)  # the builtin on Python numbers (the scalar estimate), else the array-aware one
    total = 0.0
    biggest = 0.0
    biggest_recompute = 0.0  # a recomputed layer without what aliases its checkpointed input
    biggest_backward_temp = 0.0
    moment = 0.0  # checkpointed: the largest of a kind's recomputed layer plus its own scratch
    expert_stack = 0.0
    pinned = 0.0
    # (terms that are zero for a kind, and the recomputed layer without checkpointing, are skipped: the scalar
    # estimate is a few microseconds, and each product costs a tenth of one)
    checkpointed = terms.checkpointed
    linear = terms.linear
    if linear is not None:  # the kinds folded once per run (activation_terms.LinearKinds)
        for per_token, count in linear.counts:
            total = total + tokens * per_token * count
        biggest = tokens * linear.biggest_per_token
        biggest_backward_temp = tokens * linear.backward_temp_per_token
    else:
        pairs = tokens * seq  # t x s: (query, key) pairs
        for (per_token, per_pos, kept, alias, backward_temp, backward_temp_per_pos, attn_backward_offset,
             fixed, backward_fixed, backward_fixed_per_token, count) in terms.kinds:
            per_layer = tokens * per_token + pairs * per_pos if per_pos else tokens * per_token
            if fixed:
                per_layer = per_layer + fixed
            total = total + per_layer * count
            if kept:
                pinned = pinned + tokens * kept * count
            biggest = maximum(biggest, per_layer)
            kind_temp = tokens * backward_temp
            if backward_temp_per_pos:  # eager attention's backward: the scores' gradients, from its block on
                kind_temp = maximum(kind_temp, pairs * backward_temp_per_pos + tokens * attn_backward_offset)
            biggest_backward_temp = maximum(biggest_backward_temp, kind_temp)
            if checkpointed:
                # an offloaded checkpoint comes back as a new GPU copy: nothing aliases it
                recomputed = per_layer if terms.offload else per_layer - tokens * alias
                biggest_recompute = maximum(biggest_recompute, recomputed)
                moment = maximum(moment, recomputed + kind_temp)
            if backward_fixed:  # a fused expert stack's weight gradient and the gradients beside it
                expert_stack = maximum(expert_stack, backward_fixed + tokens * backward_fixed_per_token)
    tail = ((batch if terms.head_per_example else tokens) * terms.tail_per_head_token
            + tokens * terms.tail_per_token)
    if terms.pinned_per_token:
        pinned = pinned + tokens * terms.pinned_per_token
    emb_grad, emb_extra = (embedding_backward_at(terms.model, terms.method, terms.dtypes, tokens)
                           if terms.method == "full" else (0, 0))
    if checkpointed:
        checkpoints = tokens * terms.checkpoint_per_token
        offloaded = checkpoints if terms.offload else 0
        # the recomputed layer's first norm keeps the checkpoint itself when nothing casts it (simulate:
        # Llama-3.2-1B QLoRA, fp32 residual); an offloaded checkpoint comes back as a new GPU copy;
        # recomputed layers' graphs die with each layer's backward: nothing stays pinned
        # the scratch: the largest kind's recomputation plus its own, less the largest recomputation
        return ActivationPlan(terms, tokens, seq, to_int(checkpoints - offloaded + tail), to_int(biggest),
                              to_int(checkpoints - offloaded), to_int(biggest_recompute),
                              to_int(moment - biggest_recompute), to_int(offloaded), emb_grad, emb_extra, 0,
                              to_int(tail), to_int(expert_stack))
    if terms.offload:
        # torchtune OffloadActivations: each saved tensor goes to host memory as it is made and comes back
        # for its layer's backward; the output projection and the loss run outside it (NoOpManager)
        return ActivationPlan(terms, tokens, seq, to_int(tail + biggest), to_int(biggest), 0, 0,
                              to_int(biggest_backward_temp), to_int(total - biggest), emb_grad, emb_extra,
                              expert_stack_bytes=to_int(expert_stack))
    return ActivationPlan(terms, tokens, seq, to_int(total + tail), to_int(biggest), 0, 0,
                          to_int(biggest_backward_temp), 0, emb_grad, emb_extra, to_int(pinned), to_int(tail),
                          to_int(expert_stack))
