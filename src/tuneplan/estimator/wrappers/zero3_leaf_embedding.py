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

from tuneplan.estimator.bnb_scope import expert_stack_bytes, quantized
from tuneplan.estimator.wrappers.base import WrapperMemory
from tuneplan.estimator.wrappers.reduce_buckets import zero3_leaf_moe
from tuneplan.estimator.wrappers.zero3_coordinator import DS_MAX_REUSE_DISTANCE
from tuneplan.estimator.wrappers.zero3_module_trace import replayable

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


def second_pass_top_round_bytes(run: Run) -> int:
    """Bytes of the top decoder layer's leaf MoE block gathered at its forward in a pass with a complete
    trace. The prefetcher pops the block's parameters in ``ds_id`` order (the router, the fused
    ``gate_up_proj``, ``down_proj``, then the shared expert's): the router and ``gate_up_proj`` come in one
    coalesced round, held twice until the block's fetch pops its handle (zero3_expert_round.py); the
    block's own fetch gathers the rest not yet available in one ``__all_gather_params`` call per dtype:
    ``down_proj`` alone (one parameter: gathered into it, once) unless the block has a shared expert,
    whose 16-bit parameters (its gate ``shared_expert_gate`` at least: bitsandbytes leaves it, a router,
    16-bit) make the round coalesced, held twice; its 4-bit linears' packed codes a round of their own:

    .. math:: R_2 = b_e \\big(2 (P_{router} + P_{gu}) + c\\, P_{dn}\\big) + 2 b_e P_{se,16} + 2 P_{se,4}

    with ``c`` 2 with a shared expert, 1 without. (simulate, second pass, top layer: Qwen2-57B-A14B QLoRA
    nf4 in bf16: the 1.1746e9-element router + ``gate_up_proj`` buffer and copy, the 5.895e8-element
    ``down_proj`` + shared-expert buffer and copy, the 1.101e8-byte packed round; Mixtral-8x7B QLoRA over 4
    GPUs with offload: ``down_proj`` gathered once.)"""
    model, setup = run.model, run.setup
    spec, b = model.layer_groups[-1][0], expert_stack_bytes(setup.quant_bits, run.dtypes)
    experts = [m for m in spec.linears if m.role == "expert"]
    gate_up = sum(m.params for m in experts if m.reads == "mlp_in")
    down = sum(m.params for m in experts if m.reads != "mlp_in")
    router = sum(m.params for m in spec.linears if m.role == "router")
    shared = [m for m in spec.linears if m.role == "shared_expert"]
    packed = [m for m in shared if setup.quant_bits and quantized(m, run.profile.model_code)]
    shared16 = sum(m.params for m in shared if m not in packed)
    codes = sum(m.d_in * m.d_out * m.count for m in packed) * (setup.quant_bits or 16) // 8
    return b * (2 * (router + gate_up) + (2 if shared else 1) * down + 2 * shared16) + 2 * codes


def with_kept_embedding(run: Run, memory: WrapperMemory) -> WrapperMemory:
    """``memory`` with :func:`zero3_leaf_embedding_kept_bytes` added to every gathered instant from the
    forward's layers to the backward's of a pass with a complete trace: not the bottom layer's forward,
    whose round counts the embedding, nor the recording pass's top-layer fetch
    (``top_layer_backward_fetch``, zero3_expert_round.py; before any trace ``release_sub_module``
    releases every module's parameters after its forward). The top layer's forward is the larger of the
    recording pass's round and the second pass's (:func:`second_pass_top_round_bytes`) beside it."""
    kept = zero3_leaf_embedding_kept_bytes(run)
    if not kept:
        return memory
    g = memory.gathered

    def add(v: int) -> int:
        return v + kept if v else 0

    second = second_pass_top_round_bytes(run) + kept
    top_forward = max(g.top_layer_forward, second) if g.top_layer_forward else 0
    # the coordinator's replay counts it at the loss (zero3_module_trace.py)
    at_loss = 0 if replayable(run) else kept
    gathered = replace(g, in_layers=g.in_layers + kept, at_loss=g.at_loss + at_loss,
                       at_forward_end=g.at_forward_end + at_loss, top_layer_forward=top_forward,
                       head_forward=add(g.head_forward), head_backward=add(g.head_backward),
                       flush=add(g.flush))
    top = memory.top_layer
    return replace(memory, gathered=gathered,
                   top_layer=None if top is None else replace(top, gathered=top.gathered + kept))
