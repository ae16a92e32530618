"""ZeRO-3's coordinator replayed over a LoRA step without checkpointing, counted by hand from DeepSpeed
0.19.8's ``PartitionedParameterCoordinator`` and stage3's backward hooks
(estimator/wrappers/zero3_plain_trace.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_of
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_plain_trace import (
    plain_step_events,
    zero3_gathered_past_top_attention,
    zero3_gathered_past_top_mlp_output,
)
from tuneplan.specs.model import ModelSpec, model_from_config


def phi3_mini(layers: int) -> ModelSpec:
    from tuneplan.catalog.models import resolve_model

    cfg = dict(resolve_model("microsoft/Phi-3-mini-4k-instruct", allow_network=False).config)
    cfg["num_hidden_layers"] = layers
    return model_from_config(cfg, name=f"phi-3-mini-{layers}L")


def test_the_bottom_layers_frozen_modules_and_the_embedding_have_no_backward_use() -> None:
    # Without checkpointing the embedding's output requires no grad: no PreBackwardFunctionForModule on it,
    # so no backward fetch; in layer 0 the input norm, qkv_proj's base_layer and lora_dropout run before
    # the first LoRA output (lora_A's) and have none either. Each weight is then fetched once in the
    # backward but those four (every weight of layers 1..3, layer 0's o/gate_up/down, LoRA matrices).
    spec = phi3_mini(4)
    run = resolve_run(spec, build_setup(spec, method="lora", precision="fp16", gpus=8, zero=3, rank=32,
                                        num_labels=1, gradient_checkpointing=False))
    events = plain_step_events(run)
    backward = [m for action, m, kind in events if action == "fetch" and kind == "B"]
    assert all(e[2] != "R" for e in events)
    frozen = [p for m in backward for p in m.params if not p.trained and p.numel > 1e5]
    assert len(frozen) == 4 * 4 - 1  # qkv / o / gate_up / down a layer, layer 0's qkv_proj left out
    assert all(p.numel != spec.embed_params for p in frozen)


def test_the_top_layers_round_is_held_before_its_mlp() -> None:
    # Phi-3-mini, 4 layers, LoRA rank 32 on qkv_proj in fp16 over 8 GPUs, a 1-label head, no checkpointing
    # (the simulation: seed 109 r33). Elements a layer: qkv_proj 3072 x 9216 = 28,311,552, o_proj 3072^2 =
    # 9,437,184, gate_up_proj 3072 x 16384 = 50,331,648, down_proj 8192 x 3072 = 25,165,824 (113,246,208);
    # lora_B 9216 x 32 = 294,912 (over the 1e5 persistence threshold; lora_A's 98,304 and the norms under).
    # In the second step's forward, before layer 3's MLP (post_attention_layernorm): every layer's weights
    # and lora_B gathered, kept for their backward use, but layer 0's qkv_proj (no backward use: released
    # after its forward): 4 x (113,246,208 + 294,912) - 28,311,552 = 425,852,928 elements; beside them
    # the flat buffer of the round popped at layer 0 for layer 3's o_proj, qkv_proj.lora_B and gate_up_proj
    # (9,437,184 + 294,912 + 50,331,648 = 60,063,744), filed until gate_up_proj's own fetch. In fp16:
    # 2 x (425,852,928 + 60,063,744) = 971,833,344 bytes (the simulation: 969.5 MB of gathered copies and
    # flat buffers at that instant, the step's peak).
    spec = phi3_mini(4)
    run = resolve_run(spec, build_setup(spec, method="lora", precision="fp16", gpus=8, zero=3, rank=32,
                                        num_labels=1, gradient_checkpointing=False))
    assert run.targets == frozenset({"qkv_proj"})
    assert zero3_gathered_past_top_attention(run, 50_000_000) == 2 * (425_852_928 + 60_063_744)
    live = memory_of(run)
    assert live.instants["forward_top_past_attention"] > live.instants["forward_head"]
    assert live.peak_instant == "forward_top_past_attention"


def test_checkpointed_runs_are_not_laid_out_here() -> None:
    spec = phi3_mini(2)
    run = resolve_run(spec, build_setup(spec, method="lora", gpus=8, zero=3, gradient_checkpointing=True))
    assert zero3_gathered_past_top_attention(run, 50_000_000) == 0


def test_a_4bit_mlp_weight_is_dequantized_beside_the_heads_round_in_the_top_layer() -> None:
    # phi-4, 4 layers (hidden 5120, MLP 17920, 40 / 10 heads of 128, untied head 100352 x 5120 =
    # 513,802,240), QLoRA fp4 with double quantization, rank 32 on gate_up_proj / down_proj, fp16-mixed,
    # LLaMA-Factory over 8 GPUs (the simulation: seed 109 r68). Packed codes, one byte each: gate_up 5120 x
    # 35840 / 2 = 91,750,400, down 45,875,200, qkv 5120 x 7680 / 2 = 19,660,800, o 13,107,200. LoRA
    # matrices in 2 bytes over the persistence threshold: gate_up lora_A 32 x 5120 = 163,840 and lora_B
    # 35840 x 32 = 1,146,880, down lora_A 32 x 17920 = 573,440 and lora_B 163,840.
    # At layer 3's down_proj forward the coordinator holds: the head's round (popped at layer 0 with layer
    # 3's gate_up lora_B, down lora_A / packed codes / lora_B), waited at gate_up's lora_B, its flat buffer
    # filed until the head's own fetch: 2 x (1,146,880 + 573,440 + 163,840 + 513,802,240) + 45,875,200 =
    # 1,077,248,000; beside the copies: the head 1,027,604,480, three gate_up and three down codes kept for
    # their backward (layer 0's gate_up has none: its input requires no grad) 275,251,200 + 137,625,600,
    # three o_proj and two qkv codes the prefetcher popped 39,321,600 + 39,321,600, the LoRA matrices
    # 2 x (6 x 163,840 + 3 x 1,146,880 + 3 x 573,440) = 12,288,000: 2,608,660,480 bytes (the simulation's
    # gathered copies and buffers there to the byte). bitsandbytes' dequantize_4bit then makes down_proj's
    # 17920 x 5120 weight in fp16 beside them, 183,500,800, and the nested absmax in fp32, 91,750,400 / 64
    # x 4 = 5,734,400.
    from tuneplan.catalog.models import resolve_model

    cfg = dict(resolve_model("microsoft/phi-4", allow_network=False).config)
    cfg["num_hidden_layers"] = 4
    spec = model_from_config(cfg, name="phi-4-4L")
    setup = build_setup(spec, method="qlora", precision="fp16-mixed", framework="llamafactory", batch=1,
                        seq=256, grad_accum=2, bits=4, quant_type="fp4", double_quant=True, rank=32,
                        targets="mlp", optimizer="adamw-8bit", attn="flash", gpus=8, zero=3,
                        gradient_checkpointing=False)
    run = resolve_run(spec, setup)
    assert zero3_gathered_past_top_attention(run, 50_000_000) == 2_608_660_480 + 183_500_800 + 5_734_400
    assert memory_of(run).peak_instant == "forward_top_past_attention"


def test_the_top_mlps_output_weight_is_released_before_its_activations_backward() -> None:
    # phi-2, 4 layers (hidden 2560, MLP 10240, parallel block: attention and MLP read the same normed
    # input), LoRA rank 16 on q_proj / v_proj (the profile's targets) in bf16 over 8 GPUs, a 1-label
    # head, no checkpointing (the simulation: seed 89 r102). Elements a layer: q/k/v/dense 2560^2 =
    # 6,553,600 each, fc1 / fc2 2560 x 10240 = 26,214,400 each (78,643,200); the biases and LoRA
    # matrices (16 x 2560 = 40,960) are under the 1e5 persistence threshold. Kept gathered at the loss
    # for their backward use: layers 1..3 whole, 3 x 78,643,200 = 235,929,600, and of layer 0 only dense
    # (its input, the attention's output, requires grad; q/v's base_layer and k_proj outputs do not:
    # the embedding's output requires none; fc1 / fc2 read the layer input), 6,553,600: 242,483,200
    # elements. The top layer's backward runs fc2's backward first; its release
    # (_post_backward_module_hook -> release_sub_module) drops fc2's 26,214,400 before the gelu
    # backward: 216,268,800 elements, 432,537,600 bytes in bf16 (the simulation: 432.5 MB of gathered
    # copies and flat buffers at its peak, the gelu backward's mul in layer 3; the row held 485.0 MB).
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.instants import memory_at, named

    cfg = dict(resolve_model("microsoft/phi-2", allow_network=False).config)
    cfg["num_hidden_layers"] = 4
    spec = model_from_config(cfg, name="phi-2-4L")
    run = resolve_run(spec, build_setup(spec, method="lora", precision="bf16", batch=4, seq=2048,
                                        grad_accum=2, rank=16, optimizer="paged-adamw-8bit", num_labels=1,
                                        gpus=8, zero=3, offload="optimizer", gradient_checkpointing=False))
    assert run.targets == frozenset({"q_proj", "v_proj"})
    assert zero3_gathered_past_top_mlp_output(run, 50_000_000) == 432_537_600
    row = named(memory_at(run, 4, 2048).rows["backward_layers_top"])
    assert row.parallel_buffers == 432_537_600
