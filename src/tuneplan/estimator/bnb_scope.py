"""Which block linears bitsandbytes quantizes when transformers' own model code runs, and what of a
quantized layer a sharding wrapper gathers (:func:`sharded_layer_bytes`).

transformers 5 (integrations/bitsandbytes.py ``replace_with_bnb_linear``) swaps only modules whose type is
exactly ``nn.Linear`` (or a GPT-2 ``Conv1D``) for ``bnb.nn.Linear4bit`` / ``Linear8bitLt``, and the bnb
quantizers quantize a parameter only when its module is one of those (quantizer_bnb_4bit.py
``param_needs_quantization``: ``isinstance(module, bnb.nn.Linear4bit) and name != "bias"``). Routed experts
are fused 3-D parameters of an ``*Experts`` module (``gate_up_proj`` E x 2f x h, ``down_proj`` E x h x f)
and the routers ``*TopKRouter`` modules holding a bare ``weight`` (E x h): neither is an ``nn.Linear``, so
under QLoRA both stay in the load dtype (then PEFT's ``prepare_model_for_kbit_training`` upcasts them to
fp32 with every other non-quantized parameter, as it does the norms and embeddings: ``Dtypes.non_block``).
Qwen2-MoE's ``shared_expert_gate`` is an ``nn.Linear`` (h -> 1) and is quantized. Neither transformers 5.25
nor PEFT 0.21 (``target_parameters`` wraps a parameter with LoRA, it does not quantize it) has another path
that quantizes fused experts.

Profiles with their own model code (unsloth, litgpt, torchtune) are not modelled by this rule: their
quantization sees their own modules, and the estimator keeps counting every linear quantized there.
"""

from __future__ import annotations

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.specs.model import Linear, ModelSpec

# transformers 5 module that stays an nn.Linear though the spec gives it the router role
_LINEAR_ROUTERS = frozenset({"shared_expert_gate"})


def bnb_replaces(m: Linear) -> bool:
    """Whether transformers' ``replace_with_bnb_linear`` makes ``m`` a bitsandbytes linear (module doc)."""
    return m.role not in ("expert", "router") or m.name in _LINEAR_ROUTERS


def fused_expert(m: Linear, model_code: str) -> bool:
    """Whether ``m`` is a stack of transformers' fused experts (module doc), which autocast never casts:
    ``torch._grouped_mm`` is not autocast-enabled, so integrations/moe.py ``_grouped_mm`` casts the input
    to the stack's dtype instead (an fp32 stack multiplies in fp32). Other model code's expert linears are
    ``F.linear`` calls that autocast casts."""
    return m.role == "expert" and model_code == "hf"


def quantized(m: Linear, model_code: str) -> bool:
    """Whether ``m`` is stored quantized under a quantized setup: transformers' model code quantizes what
    :func:`bnb_replaces`; other model code is counted as quantizing every block linear."""
    return model_code != "hf" or bnb_replaces(m)


def quantized_weights(model: ModelSpec, model_code: str) -> int:
    """Weight elements (no biases) of the block linears stored quantized: what dequantization rebuilds.

    .. math:: Q = \\sum_{\\text{groups}} n \\sum_{m\\ \\text{quantized}} \\text{count}_m\\, d_{in}\\, d_{out}
    """
    return sum(n * sum(m.count * m.d_in * m.d_out for m in spec.linears if quantized(m, model_code))
               for spec, n in model.layer_groups)


def unquantized_note(model: ModelSpec, quant_bits: int | None, model_code: str,
                     element_bytes: int) -> tuple[str, ...]:
    """The memory note of a quantized MoE under transformers' model code: its routed experts (and routers)
    are not quantized (module doc) and are counted at ``element_bytes`` per weight."""
    if quant_bits is None or model_code != "hf":
        return ()
    kept = sum(n * sum(m.count * m.d_in * m.d_out for m in spec.linears if not bnb_replaces(m))
               for spec, n in model.layer_groups)
    if not kept:
        return ()
    upcast = (", then PEFT's prepare_model_for_kbit_training upcasts them to fp32" if element_bytes == 4
              else "")
    return (f"{quant_bits}-bit MoE: bitsandbytes quantizes only nn.Linear modules; transformers keeps the "
            "routed experts as fused 3-D parameters and the routers as their own modules, so the experts "
            f"stay 16-bit (the load dtype), not {quant_bits}-bit{upcast}: {kept * element_bytes / 2**30:.2f} "
            "GiB of expert and router weights",)


def expert_stack_bytes(quant_bits: int | None, dtypes: Dtypes) -> int:
    """Bytes per element of transformers' fused expert stacks: frozen weights as loaded, or under
    quantization the non-quantized parameters' dtype (module doc: not quantized, then upcast with them)."""
    return dtypes.non_block if quant_bits is not None else dtypes.frozen_weight


def sharded_layer_bytes(weights: int, metadata: int, model_code: str) -> int:
    """A decoder layer's bytes as FSDP / ZeRO-3 shard and gather them: its ``weights`` as stored (packed
    4/8-bit codes in their quant storage dtype) and, for torchao's NF4 tensors (a non-HF model code:
    ``NF4Tensor.fsdp_pre_all_gather`` gathers its scalers beside its codes), their ``metadata``. Under
    transformers' model code bitsandbytes keeps the quantization metadata off the parameter:
    ``Params4bit.quant_state`` (absmax, code book) and ``Int8Params.SCB`` are plain attributes, neither
    parameters nor buffers, so FSDP's flat parameter (``FlatParamHandle`` flattens ``module.parameters()``)
    holds the codes alone and every rank keeps the whole metadata on its device (the ``quant_meta``
    component; simulate: fsdp_qlora, Llama-2-70B QLoRA, a layer's all-gather output of 427,851,776 bytes:
    855,638,016 4-bit codes and two 8192-wide bf16 norms, none of its 53,477,376 bytes of absmax)."""
    return weights if model_code == "hf" else weights + metadata
