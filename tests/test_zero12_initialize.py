"""DeepSpeed ZeRO-1/2's cast of the module inside ``deepspeed.initialize`` (estimator/wrappers/
zero12_initialize.py), by hand on Qwen2.5-7B QLoRA: PEFT's ``prepare_model_for_kbit_training`` leaves every
non-quantized parameter in fp32 on the GPU and ``get_peft_model`` makes fp32 adapters; DeepSpeed 0.19's
``_cast_module_mixed_precision`` casts them one by one to bf16, the token embedding first."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_breakdown
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run

EMBED = 152_064 * 3_584  # the token embedding, and the untied lm_head alike
HIDDEN, KV = 3_584, 512  # Qwen2.5-7B: 28 layers, 4 KV heads of 128
# outside the 4-bit linears: embedding + lm_head + final norm, and per layer two RMSNorms and the q/k/v
# biases (Linear4bit's bias is a plain Parameter, cast to fp32 like the norms)
NOT_QUANTIZED = 2 * EMBED + HIDDEN + 28 * (2 * HIDDEN + HIDDEN + 2 * KV)
# LoRA r=16 on q, k, v, o: r x (d_in + d_out) each
ADAPTERS = 28 * 16 * ((HIDDEN + HIDDEN) + 2 * (HIDDEN + KV) + (HIDDEN + HIDDEN))


def test_qlora_cast_holds_the_fp32_parameters_and_the_embedding_bf16_copy(qwen7b) -> None:
    # after the cast the module holds the same parameters in bf16 (the step's persistent weights and
    # adapters); at the peak of the cast every castable parameter is still fp32 (2 B more each) and the
    # embedding's bf16 copy is being made beside its fp32 source
    setup = build_setup(qwen7b, method="qlora", precision="bf16", gpus=4, zero=2, rank=16, targets="attn")
    run = resolve_run(qwen7b, setup)
    statics = memory_statics(run)
    common = statics.common
    assert run.param_plan.adapter_params == ADAPTERS
    after_cast = common["weights"] + common["lora_adapters"] + common["quant_meta"]
    assert statics.wrapped.initialize - after_cast == 2 * NOT_QUANTIZED + 2 * ADAPTERS + 2 * EMBED


def test_cast_is_the_peak_of_a_short_qlora_step(qwen7b) -> None:
    # one short sequence: the step holds far less than the fp32 embedding and head at the cast
    setup = build_setup(qwen7b, method="qlora", precision="bf16", gpus=4, zero=1, rank=16, targets="attn",
                        batch=1, seq=64)
    bd = memory_breakdown(qwen7b, setup)
    assert bd.peak_instant == "initialize"
    assert bd.allocated_peak_bytes == memory_statics(resolve_run(qwen7b, setup)).wrapped.initialize


def test_no_cast_on_the_gpu_without_a_bitsandbytes_model(qwen7b) -> None:
    # a LoRA or full model is on the host at initialize (Trainer: place_model_on_device = False with
    # DeepSpeed) and is cast there; ZeRO-3 builds under zero.Init; an fp32 run is not cast. What ZeRO-1/2's
    # initialize holds then is the module as the step keeps it beside the flat copy of the trained
    # parameters (wrappers/zero12_flatten.py: aligned to 2 x 4 ranks, in the trained dtype after the cast)
    for kw, element in (({"method": "lora", "precision": "bf16-mixed", "zero": 2}, 2),
                        ({"method": "full", "precision": "bf16-mixed", "zero": 1}, 2),
                        ({"method": "qlora", "precision": "fp32", "zero": 2}, 4)):
        run = resolve_run(qwen7b, build_setup(qwen7b, gpus=4, **kw))
        statics = memory_statics(run)
        module = sum(statics.common[k] for k in ("weights", "lora_adapters", "quant_meta"))
        flat = -(-run.param_plan.trainable_params // 8) * 8 * element
        assert statics.wrapped.initialize == module + flat, kw
    run = resolve_run(qwen7b, build_setup(qwen7b, gpus=4, method="qlora", precision="bf16", zero=3))
    assert memory_statics(run).wrapped.initialize == 0
    assert "initialize" not in memory_breakdown(qwen7b, run.setup).instants


MIXTRAL_2L = dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
                  num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, num_local_experts=8,
                  num_experts_per_tok=2, tie_word_embeddings=False)


def test_qlora_moe_cast_peaks_at_the_bottom_fused_expert_stack() -> None:
    # Mixtral under transformers 5: the routed experts are fused 3-D parameters, not nn.Linear, so
    # bitsandbytes leaves them bf16 and PEFT's kbit preparation makes them fp32 with the router, norms,
    # embedding and lm_head. DeepSpeed casts in module.parameters() order: embed_tokens, then layer 0's
    # self_attn (4-bit codes, not castable; its fp32 LoRA factors are), mlp.gate (router [8, h]),
    # mlp.experts.gate_up_proj [8, 2 x 14336, 4096]: while that copy is made, only the embedding's, the
    # layer-0 adapters' and the router's fp32 sources have been freed (2 B per element each)
    from tuneplan.specs.model import model_from_config

    spec = model_from_config(MIXTRAL_2L, "Mixtral-8x7B 2 layers (hand config)")
    setup = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=1, rank=16, targets="attn")
    run = resolve_run(spec, setup)
    h, kv, f, experts, vocab = 4096, 1024, 14336, 8, 32000
    embed = vocab * h
    adapters_layer = 16 * ((h + h) + 2 * (h + kv) + (h + h))  # q, k, v, o at r=16
    router = experts * h
    not_quantized = (2 * embed + h  # embedding, lm_head, final norm
                     + 2 * (router + experts * 3 * f * h + 2 * h))  # per layer: router, experts, two norms
    gate_up_bf16 = experts * 2 * f * h * 2
    freed_before = 2 * (embed + adapters_layer + router)
    assert run.param_plan.adapter_params == 2 * adapters_layer
    statics = memory_statics(run)
    common = statics.common
    after_cast = common["weights"] + common["lora_adapters"] + common["quant_meta"]
    assert (statics.wrapped.initialize - after_cast
            == 2 * not_quantized + 2 * 2 * adapters_layer + gate_up_bf16 - freed_before)
