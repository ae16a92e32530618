"""QLoRA on a MoE under transformers' model code, by hand from transformers 5.25 and PEFT 0.21:
``replace_with_bnb_linear`` swaps only ``nn.Linear`` / ``Conv1D`` (integrations/bitsandbytes.py) and
``param_needs_quantization`` quantizes only ``Linear4bit`` weights (quantizers/quantizer_bnb_4bit.py), so
``Qwen3MoeExperts`` (``gate_up_proj`` E x 2f x h, ``down_proj`` E x h x f) and ``Qwen3MoeTopKRouter``
(``weight`` E x h) keep their load dtype, which ``prepare_model_for_kbit_training`` then upcasts to fp32
with the norms and embeddings. Quantized: q / k / v / o only (NF4, no double quantization: two codes per
byte, one fp32 absmax per 64 weights, plus the 16-entry fp32 code book)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.bnb_scope import quantized, quantized_weights
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.specs.model import model_from_config

MINI_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
                  "moe_intermediate_size": 128, "num_experts": 16, "num_experts_per_tok": 2,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                  "vocab_size": 1000, "tie_word_embeddings": False}
H, E, F, LAYERS, VOCAB = 256, 16, 128, 2, 1000
ATTN = {"q": H * 256, "k": H * 128, "v": H * 128, "o": 256 * H}  # 4 x 64 query, 2 x 64 key/value heads
EXPERTS = E * (2 * F * H + H * F)  # gate_up_proj + down_proj
ROUTER = E * H
NORMS = 2 * H + 2 * 64  # input / post-attention RMSNorm, q_norm / k_norm of head_dim
FP32 = 4  # PEFT prepare_model_for_kbit_training: every non-quantized 16-bit parameter upcast to fp32


def _run(**kw):  # type: ignore[no-untyped-def]
    model = model_from_config(MINI_QWEN3_MOE, "mini Qwen3-MoE (hand config)")
    setup = build_setup(model, method="qlora", precision="bf16", batch=1, seq=64, bits=4, quant_type="nf4",
                        double_quant=False, targets="attn", **kw)
    return resolve_run(model, setup)


def test_experts_and_router_stay_unquantized_under_transformers() -> None:
    run = _run()
    packed = sum(n // 2 for n in ATTN.values())
    meta = sum(4 * (n // 64) + 16 * 4 for n in ATTN.values())
    per_layer = packed + (EXPERTS + ROUTER + NORMS) * FP32
    non_block = (2 * VOCAB * H + H) * FP32  # embed_tokens, lm_head, final norm
    assert run.param_plan.weight_bytes == LAYERS * per_layer + non_block
    assert run.param_plan.quant_meta_bytes == LAYERS * meta
    # the 4-bit count would have been E x 3fh / 2 per layer: the experts are 8x that in fp32
    assert LAYERS * EXPERTS * FP32 == 8 * LAYERS * EXPERTS // 2


def test_only_the_real_linear4bit_modules_are_dequantized() -> None:
    model = _run().model
    assert quantized_weights(model, "hf") == LAYERS * sum(ATTN.values())
    # other model code (unsloth, litgpt, torchtune) is counted as quantizing every block linear
    assert quantized_weights(model, "litgpt") == LAYERS * (sum(ATTN.values()) + EXPERTS + ROUTER)
    experts = [m for spec, _ in model.layer_groups for m in spec.linears if m.role == "expert"]
    assert experts and not any(quantized(m, "hf") for m in experts)


def test_the_memory_notes_say_the_experts_stay_16_bit() -> None:
    notes = memory_statics(_run()).base_notes
    text = next(n for n in notes if "MoE" in n)
    assert "stay 16-bit" in text and "fp32" in text
    gib = LAYERS * (EXPERTS + ROUTER) * FP32 / 2**30
    assert f"{gib:.2f} GiB" in text
