"""ZeRO-3's coordinator replayed over a LoRA / QLoRA step without checkpointing, whose backward fetches
only the modules with an output requiring grad (estimator/wrappers/zero3_plain_trace.py), counted by hand
from DeepSpeed 0.19.8's ``PartitionedParameterCoordinator`` and parameter_offload.py's backward hooks."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_of
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_plain_trace import (
    plain_step_events,
    zero3_gathered_past_top_attention,
    zero3_gathered_past_top_mlp_output,
    zero3_replayed_plain,
)
from tuneplan.specs.model import ModelSpec, model_from_config

H, VOCAB = 8192, 65024
FALCON_40B_2L = dict(model_type="falcon", hidden_size=H, num_hidden_layers=2, num_attention_heads=128,
                     num_kv_heads=8, new_decoder_architecture=True, parallel_attn=True, bias=False,
                     multi_query=True, alibi=False, vocab_size=VOCAB)
MISTRAL_2L = dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32768, tie_word_embeddings=False,
                  rope_theta=1e6)


def test_the_bottom_layers_gradient_free_modules_are_not_fetched_in_the_backward() -> None:
    # Mistral, 2 layers, QLoRA on the MLP without checkpointing: the embedding's output does not require
    # grad (no enable_input_require_grads), so in layer 0 the input norm, q/k/v (reading it), the
    # attention core, o_proj and the attention, the post-attention norm, and gate_proj's and up_proj's
    # base layers and dropouts (reading the norm) have outputs without grad: DeepSpeed never fetches them
    # in the backward. down_proj reads act(gate) * up, which requires grad through gate's LoRA: its base
    # layer and dropout are fetched. Layer 1 reads layer 0's output, which requires grad: all fetched.
    # Backward fetches of 4-bit weights: layer 1's q, k, v, o, gate, up, down and layer 0's down: 8.
    spec = model_from_config(MISTRAL_2L, "mistral-2L")
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", gpus=8, zero=3, rank=128, targets="mlp",
                        gradient_checkpointing=False, offload="all", quant_type="fp4")
    events, _ = plain_step_events(resolve_run(spec, setup))
    fetched = [m.role for action, m, kind in events if action == "fetch" and kind == "B"
               and m.role in ("attn", "mlp")]
    assert fetched.count("attn") == 4
    assert fetched.count("mlp") == 4
    assert not [e for e in events if e[2] == "R"]


def test_at_the_loss_the_replay_holds_the_forwards_copies_and_a_filed_flat_buffer() -> None:
    # Falcon-40B, 2 layers (parallel attention, tied head), QLoRA nf4 double-quant rank 16 on the MLP
    # without checkpointing, fp16, parameters offloaded, 2 GPUs. Packed codes, one byte each:
    # query_key_value 9216 x 8192 / 2 = 37,748,736, dense 8192^2 / 2 = 33,554,432, dense_h_to_4h and
    # dense_4h_to_h 32768 x 8192 / 2 = 134,217,728; the LoRA matrices over the 81,920 persistence
    # threshold (10 h): h_to_4h's A 131,072 and B 524,288, 4h_to_h's A 524,288 and B 131,072 elements.
    # At the loss the second step's coordinator holds: the tied embedding for the head's backward,
    # 532,676,608 x 2 = 1,065,353,216; layer 1's four packed weights (recorded for its backward) =
    # 339,738,624; layer 0's dense_4h_to_h, kept: its input, gelu(h_to_4h's LoRA output), requires grad,
    # so its backward fetch lies within the 1e9 reuse distance, = 134,217,728 (layer 0's attention and
    # dense_h_to_4h, reading the gradient-free layer input, are never fetched again: released); the
    # LoRA matrices gathered, three of 131,072 and three of 524,288 elements in fp16 = 3,932,160; and a
    # coalesced round's flat buffer still filed, a 4h_to_h lora_A beside a packed MLP weight:
    # 134,217,728 + 262,144. Total 1,677,721,600 (simulate: the same bytes gathered at the loss of the
    # second step; the closed form for checkpointed runs counts 1,405,091,840).
    spec = model_from_config(FALCON_40B_2L, "falcon-40b-2L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=2, zero=3, rank=16, targets="mlp",
                        gradient_checkpointing=False, offload="all", quant_type="nf4", double_quant=True,
                        optimizer="adafactor", dropout=0.05)
    run = resolve_run(spec, setup)
    replayed = zero3_replayed_plain(run, 50_000_000)
    assert replayed is not None
    expected = (1_065_353_216 + 37_748_736 + 33_554_432 + 2 * 134_217_728 + 134_217_728
                + 3 * 262_144 + 3 * 1_048_576 + 134_217_728 + 262_144)
    assert expected == 1_677_721_600
    assert replayed.at_loss == expected
    assert run.wrapper.memory(run, run.stepped_optimizer).gathered.at_loss == expected


def test_checkpointed_qlora_runs_are_not_replayed_here() -> None:
    spec = model_from_config(MISTRAL_2L, "mistral-2L")
    setup = build_setup(spec, method="qlora", gpus=2, zero=3, targets="mlp", gradient_checkpointing=True)
    assert zero3_replayed_plain(resolve_run(spec, setup), 50_000_000) is None


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
    events, _ = plain_step_events(run)
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


def test_a_leaf_moe_blocks_bottom_layer_keeps_the_block_and_drops_the_attention_inputs() -> None:
    # Mixtral, 2 layers (hidden 1024, 8 / 2 heads of 128, 4 experts of 3584), LoRA on q/k/v/o without
    # checkpointing over 4 GPUs: the sparse MoE block is a ZeRO-3 leaf, fetched whole: router 4 x 1024 and
    # experts 4 x 3 x 1024 x 3584, 44,044,288 elements. In layer 0 the input norm and q/k/v's base layers
    # and dropouts read gradient-free tensors (7 modules, no backward fetch); o_proj reads the attention
    # core, which requires grad through q/k/v's LoRA, so the attention, the norm before the block and the
    # block itself are fetched in the backward. Frozen weights fetched in the backward: the untied head,
    # per layer the norm after the attention, the block, layer 1's q (1024^2), k, v (1024 x 256) and both
    # layers' o_proj (1024^2), layer 1's input norm.
    cfg = dict(model_type="mixtral", hidden_size=1024, intermediate_size=3584, num_hidden_layers=2,
               num_attention_heads=8, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
               vocab_size=32000, tie_word_embeddings=False)
    spec = model_from_config(cfg, "mixtral-2L")
    run = resolve_run(spec, build_setup(spec, method="lora", gpus=4, zero=3, targets="attn",
                                        gradient_checkpointing=False))
    events, _ = plain_step_events(run)
    frozen = [sum(p.numel for p in m.params) for action, m, kind in events
              if action == "fetch" and kind == "B" and m.params and not any(p.trained for p in m.params)]
    assert frozen == [32_000 * 1024, 1024, 44_044_288, 1024, 1024**2, 262_144, 262_144, 1024**2,
                      1024, 44_044_288, 1024, 1024**2]


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
