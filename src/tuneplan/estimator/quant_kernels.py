"""Transients of the kernels that compute with a quantized weight, beyond the weight's own storage.

torchao ``NF4Tensor`` (the base of torchtune's QLoRA; ``torchtune.modules.low_precision`` /
``torchao.dtypes.nf4tensor``): ``linear_nf4`` calls ``F.linear(input, weight.to(input.dtype))`` in forward
and again for the input gradient in backward. ``weight.to`` runs ``get_original_weight()``, which unpacks
the two 4-bit codes of every byte with ``.to(torch.long)`` (int64: 4 bytes per weight element for each of
the two halves), looks both up in the NF4 table (1 + 1 bytes per element in 16 bits), scales each half
(1 + 1) and stacks the halves into the 16-bit weight (2): 14 bytes per element of the weight live at the
stack, per linear, while that linear runs. The largest quantized linear sets the peak.
bitsandbytes' ``MatMul4Bit`` dequantizes into the compute dtype only (``dequantize_4bit``): no scratch
beyond the weight, so its profiles leave ``dequant_bytes_per_elem`` at 0; where that weight is live in the
backward is :func:`bnb_backward_dequant`.
"""

from __future__ import annotations

from tuneplan.estimator.bnb_scope import quantized
from tuneplan.estimator.dtypes import Dtypes
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup

COMPILED_DEQUANT_BYTES = 2.0  # the bf16 weight a fused dequantization kernel writes


def dequant_transient_bytes(model: ModelSpec, setup: TrainSetup, prof: Profile) -> int:
    """Bytes live while the largest quantized linear dequantizes its weight (0 when nothing is quantized)."""
    if setup.quant_bits is None or not prof.dequant_bytes_per_elem:
        return 0
    largest = max((m.d_in * m.d_out for spec, _ in model.layer_groups for m in spec.linears
                   if quantized(m, prof.model_code)), default=0)
    # under FSDP the unit is gathered first, so every GPU dequantizes the whole weight too
    per_elem = prof.dequant_bytes_per_elem
    if setup.compile:
        # torch.compile fuses get_original_weight's unpack / lookup / scale / stack into one kernel that
        # writes the 16-bit weight: its intermediates are never materialised
        per_elem = min(per_elem, COMPILED_DEQUANT_BYTES)
    return int(per_elem * largest)


def bnb_backward_dequant(model: ModelSpec, setup: TrainSetup, prof: Profile, dtypes: Dtypes,
                         targets: frozenset[str], to_first_target: bool = False,
                         recompute_per_token: float = 0.0) -> tuple[int, int]:
    """(bytes, bytes per token) live while bitsandbytes back-propagates a layer's largest 4-bit linear (on a
    tie, the one with the widest input) to its input; (0, 0) where no such point exists.

    ``MatMul4Bit.backward`` (bitsandbytes autograd/_functions.py) computes the input gradient as
    ``grad_output @ dequantize_4bit(W).t()``: the whole weight in the compute dtype is live with the
    gradient it makes (tokens x d_in), and freed when the matmul returns. PEFT's ``lora.bnb.Linear4bit``
    adds the adapter's output after the base matmul, so autograd (which runs the node recorded last first)
    has already made the adapter's input gradient (tokens x d_in) when the base's backward runs. Live
    besides: the layer's incoming residual gradient (tokens x hidden) and, where ``Linear4bit.forward``
    casts its output back to a wider input dtype, that gradient cast to the compute dtype (tokens x d_out,
    the backward of ``out.to(inp_dtype)``). Not live: the gated product's gradients, which the MLP's output
    projection (back-propagated first) has not made yet; at the up / gate projections two of them are, but
    the product's and the output projection's saved tensors are released by then. So this point stands
    apart from the layer's other backward temporaries (``layer_saved._with_backward``) rather than adding
    to them. Transformers' model code only (the simulate engine replays this backward: simulate/qlora.py).

    ``to_first_target``: only the linears a layer runs up to its first adapted one (forward order), whose
    base backward autograd runs after that adapter's (the node recorded last runs first): where each adapter
    is an FSDP unit of its own (wrappers/fsdp.fsdp_layers_gathered) they are back-propagated once the first
    adapter's pre-backward hook has prefetched the next layer.

    ``recompute_per_token``: the bytes per token beside the down projection's weight when a checkpointed
    layer's recomputation dequantizes it in its forward (recompute_dequant.py), the same weight at another
    point of the layer's backward: the larger of the two moments is taken."""
    if setup.quant_bits != 4 or prof.dequant_bytes_per_elem or prof.model_code != "hf":
        return 0, 0
    fixed, per_token = 0, 0
    for spec, _ in model.layer_groups:
        for m in spec.linears:
            if not quantized(m, prof.model_code):  # fused experts / routers: no MatMul4Bit (bnb_scope)
                if to_first_target and m.name in targets:
                    break
                continue
            weight = dtypes.compute * m.d_in * m.d_out
            # routed experts see top_k of their count's share of the tokens
            share = spec.top_k / max(m.count, 1) if m.role == "expert" else 1.0
            grads = (2 if m.name in targets else 1) * dtypes.compute * m.d_in * share
            if dtypes.quant_out != dtypes.compute:
                grads += dtypes.compute * m.d_out * share
            if m.name in targets and not to_first_target:
                # the adapter's backward ran first: its private saved tensors are released (counted in the
                # layer's activations, which the row adds)
                grads -= adapter_private_bytes(setup, dtypes, m.d_in) * share
                if (m.reads == "mlp_mid" and not prof.quant_saves_input
                        and not adapter_input_copy_bytes(setup, dtypes)):
                    # the down projection's input, the gated product, kept by lora_A alone (MatMul4Bit
                    # saves no input of a frozen weight): released by lora_A's backward, which ran first
                    grads -= dtypes.compute * m.d_in * share
            tokens_part = int(dtypes.residual * model.hidden + grads)
            if m.reads == "mlp_mid" and not to_first_target:
                tokens_part = max(tokens_part, int(recompute_per_token))
            if (weight, tokens_part) > (fixed, per_token):
                fixed, per_token = weight, tokens_part
            if to_first_target and m.name in targets:
                break
    return fixed, per_token


def adapter_private_bytes(setup: TrainSetup, dtypes: Dtypes, d_in: int) -> int:
    """Bytes per token a PEFT LoRA adapter saves for itself on a 4-bit linear of input width ``d_in``
    (``layer_walk.LayerWalk``'s ledger keys ``lora_in``, ``lora_mid``, ``dropout_mask``), all released by
    the adapter's backward: ``lora.bnb.Linear4bit.forward`` casts the input to the adapter dtype
    (``_cast_input_dtype``; under autocast lora_A casts it back to 16 bits) and runs ``lora_dropout`` (a
    new tensor and a one-byte mask when p > 0), lora_A saves what it reads, lora_B its rank-wide input:

        private = d_in x (copy bytes + mask bytes) + rank x mid bytes

    with copy bytes the 16-bit cast under autocast, the adapter dtype when it differs from the input's,
    the input's dtype behind a dropout, 0 when lora_A reads the input itself (shared, not released). The
    input is in the compute dtype, as the 4-bit linears of transformers' decoder layers read it."""
    dropout = (setup.dropout or 0) > 0
    copy = adapter_input_copy_bytes(setup, dtypes)
    mid = dtypes.compute if dtypes.autocast else dtypes.adapter
    return d_in * (copy + (1 if dropout else 0)) + setup.rank * mid


def adapter_input_copy_bytes(setup: TrainSetup, dtypes: Dtypes) -> int:
    """Bytes per input element of the private copy lora_A saves (:func:`adapter_private_bytes`): the 16-bit
    cast under autocast, the adapter dtype when it differs from the input's, the input's dtype behind a
    dropout; 0 when lora_A reads the input itself."""
    if dtypes.autocast and dtypes.adapter != dtypes.compute:
        return dtypes.compute
    if dtypes.adapter != dtypes.compute:
        return dtypes.adapter
    return dtypes.compute if (setup.dropout or 0) > 0 else 0
