"""estimator/optimizer.py's bitsandbytes 8-bit state count, tensor by tensor, against hand derivations
from bitsandbytes' ``Optimizer2State.init_state`` (a tensor under ``min_8bit_size`` = 4096 elements keeps
two fp32 states; otherwise two uint8 states and two fp32 absmax per block of 256) and against the
simulation's stand-in optimizer."""

from __future__ import annotations

import pytest

from tests.conftest import QWEN25_7B, TINY_LLAMA
from tuneplan import estimate
from tuneplan.estimator.optimizer import bnb_8bit_state_bytes, stepped_tensor_sizes
from tuneplan.specs.model import model_from_config

# Qwen2.5-0.5B's config.json (hidden 896, 14 heads of 64, 2 KV heads: k/v width 128)
QWEN25_05B = dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)


def states(tensors: list[int]) -> int:
    """bitsandbytes AdamW8bit state bytes by hand, one tensor at a time."""
    return sum(2 * n + 2 * 4 * -(-n // 256) if n >= 4096 else 2 * 4 * n for n in tensors)


def optimizer_states(config: dict, **kw) -> int:
    model = model_from_config(config, "hand config")
    return estimate(model, timing=False, seq=64, **kw).to_dict()["per_gpu"]["components"]["optimizer_states"]


def test_lora_b_of_a_narrow_projection_keeps_fp32_states():
    # r16 on q_proj, v_proj: A_q, B_q, A_v are 16 x 896 = 14,336 elements (8-bit: 28,672 + 8 x 56 = 29,120 B);
    # B_v is 128 x 16 = 2,048 (< 4,096: fp32, 16,384 B); 24 layers
    per_layer = 3 * 29_120 + 16_384
    assert states([16 * 896] * 3 + [128 * 16]) == per_layer
    got = optimizer_states(QWEN25_05B, method="lora", rank=16, targets="q_proj,v_proj",
                           optimizer="adamw-8bit")
    assert got == 24 * per_layer == 2_489_856


def test_full_fine_tune_norms_keep_fp32_states():
    # tiny Llama: hidden 256, 8 heads of 32, 2 KV heads (k/v 64), MLP 688, vocabulary 1,000, untied head
    layer = [256 * 256, 256 * 64, 256 * 64, 256 * 256, 256 * 688, 256 * 688, 688 * 256, 256, 256]
    expected = states(4 * layer + [1000 * 256, 1000 * 256, 256])
    assert expected == 6_682_752
    assert optimizer_states(TINY_LLAMA, method="full", precision="bf16", optimizer="adamw-8bit") == expected


def test_paged_8bit_counts_the_same_states_as_paged_memory():
    model = model_from_config(TINY_LLAMA, "tiny-llama")
    per_gpu = estimate(model, timing=False, seq=64, method="lora", rank=4,
                       optimizer="paged-adamw-8bit").to_dict()["per_gpu"]
    # q and v, rank 4: A 4 x 256, B_q 256 x 4, B_v 64 x 4: every one under 4,096 elements, all fp32
    assert per_gpu["paged_bytes"] == 4 * 8 * (3 * 1024 + 256) == 106_496
    assert per_gpu["components"]["optimizer_states"] == 0


@pytest.mark.parametrize("config, kw", [
    (QWEN25_7B, dict(method="full")),
    (QWEN25_7B, dict(method="lora", rank=8, targets="all-linear")),
    (QWEN25_7B, dict(method="freeze", freeze_trainable_layers=2)),
    (QWEN25_7B, dict(method="qlora", rank=16)),
    (TINY_LLAMA, dict(method="full")),
    (TINY_LLAMA, dict(method="lora", rank=4, num_labels=3)),  # PEFT's trainable classification head
    ("openai-community/gpt2", dict(method="full")),  # LayerNorm weight + bias, position embeddings
    ("microsoft/phi-2", dict(method="full")),  # parallel block: one LayerNorm; lm_head bias
    ("Qwen/Qwen3-30B-A3B", dict(method="full")),  # q/k norms, fused experts
    ("deepseek-ai/DeepSeek-V2-Lite", dict(method="full")),  # latent norms
])
def test_the_tensor_sizes_add_up_to_the_trainable_parameters(config, kw):
    from tuneplan.api import build_setup
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.run import resolve_run

    model = (resolve_model(config, allow_network=False) if isinstance(config, str)
             else model_from_config(config, "hand config"))
    pp = resolve_run(model, build_setup(model, None, **kw)).param_plan
    assert pp.trainable_params > 0
    assert sum(n * c for n, c in pp.trainable_sizes) == pp.trainable_params


def test_a_large_tensor_is_8bit_with_its_own_absmax_blocks():
    # ceil per tensor: two tensors of 4,097 elements have 17 blocks each, not ceil(8,194 / 256) = 33
    assert bnb_8bit_state_bytes(((4097, 2),)) == 2 * (2 * 4097 + 8 * 17)


def test_simulation_agrees_on_a_small_8bit_run():
    pytest.importorskip("torch")
    model = model_from_config(TINY_LLAMA, "tiny-llama")
    for kw in (dict(method="lora", rank=4), dict(method="full", precision="bf16")):
        sim, ana = (estimate(model, engine=e, seq=64, optimizer="adamw-8bit", **kw).to_dict()
                    for e in ("simulate", "analytic"))
        s, a = (d["per_gpu"]["components"]["optimizer_states"] for d in (sim, ana))
        if kw["method"] == "lora":
            assert s == a == 106_496
        else:
            # the simulation's allocator rounds each state tensor to 512 B; the count does not:
            # 37 tensors at 8-bit (2 states + 2 absmax) and 9 at fp32 (2 states), 12,160 B of rounding
            assert (s, a) == (6_694_912, 6_682_752)


def test_what_the_optimizer_steps_under_sharding():
    from tuneplan.api import build_setup

    model = model_from_config(QWEN25_05B, "Qwen2.5-0.5B (hand config)")
    lora = dict(method="lora", rank=16, targets="q_proj,v_proj")
    # per layer: A_q, B_q, A_v of 14,336 elements and B_v of 2,048; 24 layers: 1,081,344 trainable
    sizes = ((2_048, 24), (14_336, 72))
    from tuneplan.estimator.run import resolve_run

    assert resolve_run(model, build_setup(model, None, **lora)).param_plan.trainable_sizes == sizes
    assert stepped_tensor_sizes(build_setup(model, None, **lora), 1_081_344, sizes) == sizes
    # DeepSpeed ZeRO steps one flat fp32 partition per rank: 540,672 elements on each of 2 ranks (8-bit)
    zero = build_setup(model, None, gpus=2, zero=2, **lora)
    assert stepped_tensor_sizes(zero, 1_081_344, sizes) == ((540_672, 2),)
    # FSDP: each rank holds half of every tensor
    fsdp = build_setup(model, None, gpus=2, fsdp=True, **lora)
    assert stepped_tensor_sizes(fsdp, 1_081_344, sizes) == ((1_024, 48), (7_168, 144))


def test_states_can_fall_as_the_rank_grows():
    # tiny Llama, q and v: A_q, B_q, A_v are r x 256, B_v 64 x r. Rank 8: 2,048, 2,048, 2,048, 512 elements,
    # all fp32 (3 x 16,384 + 4,096 B per layer); rank 16: three of 4,096 turn 8-bit (8,192 + 8 x 16 = 8,320 B
    # each), B_v of 1,024 stays fp32 (8,192 B). Four layers: 212,992 B then 132,608 B
    r8 = optimizer_states(TINY_LLAMA, method="lora", rank=8, optimizer="adamw-8bit")
    r16 = optimizer_states(TINY_LLAMA, method="lora", rank=16, optimizer="adamw-8bit")
    assert (r8, r16) == (4 * (3 * 16_384 + 4_096), 4 * (3 * 8_320 + 8_192)) == (212_992, 132_608)
