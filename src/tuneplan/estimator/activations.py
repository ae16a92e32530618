"""Saved activations of the whole model: the layers (``layer_saved.layer_activations``, one ledger walk per
kind of layer), what lives outside them (final norm, head input, embedding dropout), and what gradient
checkpointing, activation offload and bitsandbytes' pinned inputs make of that sum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.estimator.layer_saved import layer_activations
from tuneplan.estimator.saved_tensors import (
    DROPOUT_MASK_BYTES,
    LayerActs,
    embedding_backward_at,
    model_dropout,
)
from tuneplan.estimator.xp import maximum, to_int
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

__all__ = ["ActivationPlan", "LayerActs", "LayerKinds", "activation_plan", "activations_at", "layer_activations",
           "layer_kinds"]


@dataclass(frozen=True)
class ActivationPlan:
    saved_bytes: int  # all saved activations at the end of forward (layers + embedding/final norm)
    top_layer_bytes: int  # one layer's saved activations (the one recomputed / freed first)
    checkpoint_bytes: int  # layer inputs kept under gradient checkpointing (0 otherwise)
    recompute_bytes: int  # one layer's activations rebuilt during backward under checkpointing
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


@dataclass(frozen=True)
class LayerKinds:
    """The distinct layers of a model under a setup, each with how many times it occurs: what one ledger
    walk per kind of layer gives (``layer_saved.layer_activations``), independent of batch and seq."""

    kinds: tuple[tuple[LayerActs, int], ...]
    embedding_dropout: bool = False  # the model config's embedding dropout applies (a mask per token x hidden)


def layer_kinds(model: ModelSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str], attn: str,
                python_model_code: bool, quant_saves_input: bool = False, litgpt_code: bool = False,
                expand_kv: bool = False, unsloth_code: bool = False) -> LayerKinds:
    """Each group of identical layers counted once (the planner calls this for 100+-layer models); a
    freeze run records nothing below its first trainable layer, and a frozen-embedding run's first active
    layer reads an input without gradient, which makes it a kind of its own."""
    layer_no = 0
    first_trainable = model.n_layers - setup.freeze_trainable_layers if setup.method == "freeze" else 0
    first_active = first_trainable if setup.method == "freeze" else 0
    out: list[tuple[LayerActs, int]] = []
    for spec, count in model.layer_groups:
        start, end = layer_no, layer_no + count
        layer_no = end
        if setup.method == "freeze":
            lo = max(start, first_trainable)
            if lo >= end:
                continue  # nothing upstream needs a gradient: autograd records nothing in these layers
            start = lo
        if setup.method != "full" and start <= first_active < end:
            # embeddings frozen: the first layer that trains reads an input without gradient
            out.append((layer_activations(model, spec, setup, dt, targets, setup.method == "freeze", attn,
                                          python_model_code, quant_saves_input, input_requires_grad=False,
                                          litgpt_code=litgpt_code, expand_kv=expand_kv,
                                          unsloth_code=unsloth_code), 1))
            start += 1
        if end > start:
            trainable = setup.method in ("full", "freeze")
            out.append((layer_activations(model, spec, setup, dt, targets, trainable, attn, python_model_code,
                                          quant_saves_input, litgpt_code=litgpt_code, expand_kv=expand_kv,
                                          unsloth_code=unsloth_code), end - start))
    emb_dropout = model_dropout(model.config)[2] > 0 and not (litgpt_code or expand_kv)
    return LayerKinds(tuple(out), embedding_dropout=emb_dropout)


def activation_plan(model: ModelSpec, setup: TrainSetup, dt: Dtypes, targets: frozenset[str], attn: str,
                    gc_offload: bool, python_model_code: bool, quant_saves_input: bool = False,
                    litgpt_code: bool = False, quant_lm_head: bool = False,
                    expand_kv: bool = False, unsloth_code: bool = False) -> ActivationPlan:
    kinds = layer_kinds(model, setup, dt, targets, attn, python_model_code, quant_saves_input, litgpt_code,
                        expand_kv, unsloth_code)
    return activations_at(model, setup, dt, kinds, setup.batch, setup.seq, gc_offload=gc_offload,
                          quant_saves_input=quant_saves_input, litgpt_code=litgpt_code,
                          quant_lm_head=quant_lm_head, expand_kv=expand_kv)


def activations_at(model: ModelSpec, setup: TrainSetup, dt: Dtypes, kinds: LayerKinds, batch: Any, seq: Any, *,
                   gc_offload: bool, quant_saves_input: bool = False, litgpt_code: bool = False,
                   quant_lm_head: bool = False, expand_kv: bool = False) -> ActivationPlan:
    """The saved activations at ``batch`` x ``seq`` (Python ints, or numpy arrays of a grid: see ``xp``).

    A layer kind keeps ``t * per_token + t * s * per_token_per_pos`` bytes (t = batch * seq tokens, s key
    positions of eager attention); the model keeps the sum over its layers plus the tail (final norm input,
    head input, embedding-dropout mask); under gradient checkpointing only each layer's input (t x residual
    bytes x hidden) plus the largest layer recomputed in backward."""
    # (no in-place += below: on a grid an operand may broadcast to a larger shape than the accumulator)
    tokens = batch * seq
    s = seq
    h = model.hidden
    total = 0.0
    biggest = 0.0
    biggest_recompute = 0.0  # a recomputed layer without what aliases its checkpointed input
    biggest_bwd = 0.0
    pinned = 0.0
    for la, n in kinds.kinds:
        per_layer = tokens * la.per_token + tokens * s * la.per_token_per_pos
        total = total + per_layer * n
        pinned = pinned + tokens * la.pinned * n
        biggest = maximum(biggest, per_layer)
        biggest_recompute = maximum(biggest_recompute, per_layer - tokens * la.input_alias)
        attn_bwd = tokens * s * la.backward_temp_per_pos + tokens * la.attn_backward_offset if la.backward_temp_per_pos else 0
        biggest_bwd = maximum(maximum(biggest_bwd, tokens * la.backward_temp), attn_bwd)
    # Outside the layers: the final norm keeps its fp32 input; lm_head keeps its input when it trains (a
    # classification head always trains: PEFT puts it in modules_to_save). BERT has no final norm: its MLM
    # head's transform keeps about as much; its classifier reads the first token only, through the pooler.
    head_tokens = batch if (model.architecture == "encoder" and model.head_out) else tokens
    tail = head_tokens * 4 * h
    if kinds.embedding_dropout:
        tail = tail + tokens * DROPOUT_MASK_BYTES * h  # embedding dropout mask
    if setup.method == "full" or model.head_out:
        tail = tail + head_tokens * (dt.compute if dt.autocast else dt.norm_out) * h
    elif quant_lm_head and quant_saves_input and setup.quant_bits is not None:
        tail = tail + tokens * dt.compute * h  # a 4-bit lm_head keeps its input (the final norm's output)
        pinned = pinned + tokens * dt.compute * h
    n_active = model.n_layers if setup.method != "freeze" else min(setup.freeze_trainable_layers, model.n_layers)
    emb_grad, emb_extra = embedding_backward_at(model, setup.method, dt, tokens)
    if setup.gradient_checkpointing:
        ckpt = tokens * dt.residual * h * n_active
        offload = gc_offload or setup.activation_offload
        offloaded = ckpt if offload else 0
        # the recomputed layer's first norm keeps the checkpoint itself when nothing casts it (simulate:
        # Llama-3.2-1B QLoRA, fp32 residual); an offloaded checkpoint comes back as a new GPU copy
        recompute = biggest if offload else biggest_recompute
        # recomputed layers' graphs die with each layer's backward: nothing stays pinned
        return ActivationPlan(saved_bytes=to_int(ckpt - offloaded + tail), top_layer_bytes=to_int(biggest),
                              checkpoint_bytes=to_int(ckpt - offloaded), recompute_bytes=to_int(recompute),
                              backward_temp_bytes=to_int(biggest_bwd), offloaded_bytes=to_int(offloaded),
                              embedding_grad_bytes=emb_grad, embedding_backward_bytes=emb_extra,
                              tail_bytes=to_int(tail))
    if setup.activation_offload:
        # torchtune OffloadActivations: each saved tensor goes to host memory as it is made and comes back
        # for its layer's backward; the output projection and the loss run outside it (NoOpManager)
        return ActivationPlan(saved_bytes=to_int(tail + biggest), top_layer_bytes=to_int(biggest), checkpoint_bytes=0,
                              recompute_bytes=0, backward_temp_bytes=to_int(biggest_bwd),
                              offloaded_bytes=to_int(total - biggest),
                              embedding_grad_bytes=emb_grad, embedding_backward_bytes=emb_extra)
    return ActivationPlan(saved_bytes=to_int(total + tail), top_layer_bytes=to_int(biggest), checkpoint_bytes=0,
                          recompute_bytes=0, backward_temp_bytes=to_int(biggest_bwd),
                          embedding_grad_bytes=emb_grad, embedding_backward_bytes=emb_extra,
                          pinned_bytes=to_int(pinned))
