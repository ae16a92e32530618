"""The token embedding ZeRO-3 keeps gathered through the step when the model's MoE blocks are leaf modules.

``PartitionedParameterCoordinator.__params_to_release`` (DeepSpeed 0.19.8,
runtime/zero/partitioned_param_coordinator.py), once the module trace is complete, keeps a module's
parameters gathered when they are used again within ``stage3_max_reuse_distance`` elements of the trace.
It walks the traced modules after the current one, counting ``iter_params(module,
recurse=z3_leaf_module(submodule_to_release))``: for the embedding (not a leaf) only each traced module's
direct parameters. A ZeRO-3 leaf MoE block (``reduce_buckets.DS_LEAF_MOE_TYPES``: Mixtral, Qwen2-MoE,
Qwen3-MoE) is traced as one module whose parameters all live in its children (router, experts, shared
expert): it adds nothing to the walk. What is counted between the embedding's forward and its backward
fetch is then the layers' attention and norms, once per pass over them (forward, backward, and the
recomputation under checkpointing), and the output head's forward and backward; when that stays under the
distance the embedding is never released, and it is gathered beside every instant of the step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import quantized
from tuneplan.estimator.wrappers.base import WrapperMemory
from tuneplan.estimator.wrappers.reduce_buckets import zero3_leaf_moe
from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_REUSE_DISTANCE

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

# the leaf MoE block's own parameters (its children's), traced under the block
LEAF_BLOCK_ROLES = frozenset({"expert", "router", "shared_expert"})


def zero3_leaf_embedding_kept_bytes(run: Run) -> int:
    """Bytes of the untied token embedding kept gathered from its forward to its backward fetch (module
    doc); 0 unless the MoE blocks are leaf modules, the embedding has a backward fetch (LoRA or QLoRA under
    checkpointing, whose ``enable_input_require_grads`` makes its output require grad) and the trace
    between its uses stays under the distance ``D``:

    .. math:: 3 \\sum_{\\text{layers}} \\Big(\\sum_{m \\notin \\text{block}} n_m + N\\Big) + 2 P_{head} < D

    over the layers' three passes (forward, recomputation, backward), with ``n_m`` a linear's trace
    elements (a 4-bit ``Params4bit``'s packed ``b/8`` a weight, ``bnb_scope.quantized``), ``N`` the norms.
    (simulate: Qwen3-30B-A3B, 2 layers, QLoRA fp4 in fp16 over 8 GPUs under checkpointing: the
    3.112e8-element embedding gathered from the second pass's forward to its backward, at the peak in the
    bottom layer's forward beside the prefetched experts.)"""
    model, setup = run.model, run.setup
    if (setup.zero != 3 or setup.world_size < 2 or not model.embed_params or not model.lm_head_params
            or not zero3_leaf_moe(model, run.profile.model_code == "hf")):
        return 0
    # a full fine-tune keeps it too (simulate: Qwen3-30B-A3B, 2 layers over 2 GPUs: the embedding from the
    # forward live at the peak), but there the rows of the layers' backward already count as much beyond
    # the simulation's (+0.7 % without it, +3.6 % with it): left to the full run's rows
    if setup.method not in ("lora", "qlora") or not setup.gradient_checkpointing:
        return 0
    bits = setup.quant_bits or 16
    per_pass = 0
    for spec, count in model.layer_groups:
        outside = sum(m.d_in * m.d_out * m.count * bits // 8 if setup.quant_bits and quantized(
            m, run.profile.model_code) else m.params for m in spec.linears if m.role not in LEAF_BLOCK_ROLES)
        per_pass += count * (outside + spec.norm_params)
    if 3 * per_pass + 2 * model.lm_head_params >= DS_MAX_REUSE_DISTANCE:
        return 0
    return model.embed_params * run.dtypes.compute


def with_kept_embedding(run: Run, memory: WrapperMemory) -> WrapperMemory:
    """``memory`` with :func:`zero3_leaf_embedding_kept_bytes` added to every gathered instant from the
    forward's layers to the backward's of a pass with a complete trace: not the bottom layer's forward,
    whose round counts the embedding, nor the rounds of the top layer's experts counted as the recording
    pass gathers them (``top_layer_forward``, ``top_layer_backward_fetch``: zero3_expert_round.py; before
    any trace ``release_sub_module`` releases every module's parameters after its forward). With a
    complete trace the prefetcher splits the leaf block's round (the router with ``gate_up_proj``, then
    ``down_proj``), which makes that instant another sum, not counted here."""
    kept = zero3_leaf_embedding_kept_bytes(run)
    if not kept:
        return memory
    g = memory.gathered

    def add(v: int) -> int:
        return v + kept if v else 0

    gathered = replace(g, in_layers=g.in_layers + kept, at_loss=g.at_loss + kept,
                       at_forward_end=g.at_forward_end + kept,
                       head_forward=add(g.head_forward), head_backward=add(g.head_backward),
                       flush=add(g.flush))
    top = memory.top_layer
    return replace(memory, gathered=gathered,
                   top_layer=None if top is None else replace(top, gathered=top.gathered + kept))
