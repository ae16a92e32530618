"""The backward round of a MoE layer's router (and the LoRA factors on its fused expert stacks), which under
ZeRO-3 takes the layer below's ``gate_up_proj`` stack along in one coalesced all-gather."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import expert_stack_bytes, quantized
from tuneplan.estimator.fused_expert_lora import expert_stacks
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_PARAM_PERSISTENCE_THRESHOLD,
)
from tuneplan.estimator.wrappers.zero3_leaf_embedding import zero3_leaf_embedding_kept_bytes

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero3_factor_round_bytes(run: Run, prefetch_bucket: int) -> int:
    """Bytes a middle decoder layer's backward holds beyond its own gathered parameters when its router and
    its experts' LoRA factors are popped in one round with the next layer down's ``gate_up_proj`` stack (0
    when not).

    A QLoRA run under checkpointing releases each layer's fused stacks, its router and the factors PEFT's
    ``ParamWrapper`` adds to the stacks it targets (``lora_A`` [r E, d_in], ``lora_B`` [d_out, r E], fp32)
    after the forward; the backward queues them NOT_AVAILABLE per layer, top to bottom: ``gate_up_proj``,
    ``down_proj``, the factors and the router, the packed attention codes being still gathered from the
    recomputation. ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8) pops at each fetch until the round holds
    ``min(M - A, prefetch_bucket)`` elements; with ``A`` the kept embedding ``E``, the layer's stacks
    ``S_{gu} + S_{dn}`` and two layers' codes ``C``, when the factors and router ``F`` stay under that
    limit the round goes on into the layer below's ``gate_up_proj``. Its members are gathered into one
    flat buffer per dtype and the first wait, the factors' use in this layer's backward, gives each a copy
    (``AllGatherCoalescedHandle.wait``: ``torch.cat(partitions)``) while the buffer stays filed under the
    stack until its own fetch:

    .. math:: \\Delta G = (F + 2 S_{gu}) b_e \\quad \\text{if } 0 < F < \\min(M - E - S_{gu} - S_{dn}
              - C, B)

    with ``b_e`` the stacks' bytes (fp32 after PEFT's ``prepare_model_for_kbit_training``), the factors'
    alike. Only a layer with one below it, so three layers at least. (simulate: Qwen3-30B-A3B, 3 layers,
    QLoRA nf4 rank 32 on the MLP in fp32 over 4 GPUs: layer 1's factors and router, 4.1157e7 elements,
    with layer 0's 4.0265e8-element ``gate_up_proj`` in a 4.4381e8-element buffer beside that stack's copy
    in layer 1's experts' backward, the step's peak; rank 8 on q/v in bf16 over 8 GPUs, 4 layers: layer
    2's router alone, 262,144, with layer 1's stack in a 4.0292e8-element buffer.)"""
    model, setup = run.model, run.setup
    if (setup.zero != 3 or run.profile.model_code != "hf" or not setup.quant_bits
            or not setup.gradient_checkpointing or model.n_layers < 3):
        return 0
    spec = model.layer_groups[-1][0]
    experts = [m for m in spec.linears if m.role == "expert"]
    if not experts:
        return 0
    gate_up = sum(m.params for m in experts if m.reads == "mlp_in")
    down = sum(m.params for m in experts if m.reads == "mlp_mid")
    router = sum(m.params for m in spec.linears if m.role == "router")
    router = router if router > DS_PARAM_PERSISTENCE_THRESHOLD else 0  # else persistent, never queued
    factors = sum(s.adapter_params for s in expert_stacks(spec, run.targets, setup.rank)) + router
    codes = sum(m.d_in * m.d_out * m.count for m in spec.linears
                if quantized(m, run.profile.model_code)) * setup.quant_bits // 8
    embed = zero3_leaf_embedding_kept_bytes(run) // run.dtypes.non_block
    limit = min(DS_MAX_LIVE_PARAMETERS - embed - gate_up - down - 2 * codes, prefetch_bucket)
    if not 0 < factors < limit:  # nothing queued before the lower stack, or a round that ends first
        return 0
    return (factors + 2 * gate_up) * expert_stack_bytes(setup.quant_bits, run.dtypes)
