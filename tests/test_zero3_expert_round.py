"""ZeRO-3's forward fetch of transformers 5's fused experts module, counted by hand from DeepSpeed 0.19.8
(``all_gather_coalesced``: a flat buffer, then ``AllGatherCoalescedHandle.wait`` copies each parameter out
with ``torch.cat``) and transformers 5.25's Mixtral (``MixtralExperts``: ``gate_up_proj`` [E, 2f, h],
``down_proj`` [E, h, f]); estimator/wrappers/zero3_expert_round.py."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.memory import memory_breakdown
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_expert_round import zero3_expert_round_bytes
from tuneplan.specs.model import model_from_config

E, H, F = 8, 6144, 16384
MIXTRAL = dict(model_type="mixtral", hidden_size=H, intermediate_size=F, num_hidden_layers=2,
               num_attention_heads=48, num_key_value_heads=8, num_local_experts=E, num_experts_per_tok=2,
               vocab_size=32768)
STACKS = E * 2 * F * H + E * H * F  # gate_up_proj + down_proj: 2,415,919,104 elements
# the router (gate.weight [E, h]): Mixtral's sparse MoE block is a ZeRO-3 leaf module (DeepSpeed 0.19.8
# leaf_module_config.py), fetched as one module: the router joins the experts' round
ROUTER = E * H


def test_the_experts_round_is_held_twice_in_its_stacks_dtype() -> None:
    spec = model_from_config(MIXTRAL, "mixtral-2L")
    # QLoRA in fp32: bitsandbytes leaves the 3-D stacks unquantized, in the fp32 load dtype
    qlora = build_setup(spec, method="qlora", precision="fp32", gpus=4, zero=3, targets="q_proj,v_proj")
    assert zero3_expert_round_bytes(resolve_run(spec, qlora)) == 2 * (STACKS + ROUTER) * 4
    # QLoRA in bf16: DeepSpeed casts the module's unquantized parameters to bf16 (as large as a 16-bit base)
    q16 = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=3, targets="q_proj,v_proj")
    assert zero3_expert_round_bytes(resolve_run(spec, q16)) == 2 * (STACKS + ROUTER) * 2
    # LoRA on a bf16 base: the frozen stacks stay bf16
    lora = build_setup(spec, method="lora", precision="bf16", gpus=4, zero=3, targets="q_proj,v_proj")
    assert zero3_expert_round_bytes(resolve_run(spec, lora)) == 2 * (STACKS + ROUTER) * 2
    # no ZeRO-3 gather: nothing
    ddp = build_setup(spec, method="lora", precision="bf16", gpus=4, targets="q_proj,v_proj")
    assert zero3_expert_round_bytes(resolve_run(spec, ddp)) == 0


def test_a_qlora_moe_peaks_at_the_top_layers_experts_fetch() -> None:
    # 4-bit attention: the experts round (2 x 9.66 GB in fp32) dwarfs everything else gathered; with
    # checkpointing little is saved, and the forward's fetch of the top layer's experts is the largest instant
    spec = model_from_config(MIXTRAL, "mixtral-2L")
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=4, zero=3, targets="q_proj,v_proj",
                        gradient_checkpointing=True, batch=1, seq=256)
    bd = memory_breakdown(spec, setup)
    assert bd.peak_instant == "forward_layers_top"
    assert bd.components["parallel_buffers"] >= 2 * STACKS * 4


def test_the_recording_pass_keeps_every_forward_copy_beside_the_top_layers_new_round() -> None:
    # the first forward + backward records the trace: release_sub_module releases every layer's experts
    # after their forward, grouped_mm's saved transposed view keeps each forward copy; the top layer's
    # backward fetch gathers a new round (flat buffer + copies) beside both layers' copies. LoRA on q/v:
    # the bottom layer's experts read a tensor that requires grad (q/v's LoRA output through attention).
    from tuneplan.estimator.wrappers.zero3_expert_round import zero3_record_pass_top_bytes

    spec = model_from_config(MIXTRAL, "mixtral-2L")
    qlora = build_setup(spec, method="qlora", precision="fp16", gpus=4, zero=3, targets="q_proj,v_proj",
                        gradient_checkpointing=False)
    assert zero3_record_pass_top_bytes(resolve_run(spec, qlora)) == (2 * STACKS + 2 * (STACKS + ROUTER)) * 2
    # with checkpointing the forward saves nothing: no copy outlives its gather
    ckpt = build_setup(spec, method="qlora", precision="fp16", gpus=4, zero=3, targets="q_proj,v_proj",
                       gradient_checkpointing=True)
    assert zero3_record_pass_top_bytes(resolve_run(spec, ckpt)) == 0


def test_a_qlora_moe_without_checkpointing_peaks_at_the_recording_pass_top_fetch() -> None:
    spec = model_from_config(MIXTRAL, "mixtral-2L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=4, zero=3, targets="q_proj,v_proj",
                        gradient_checkpointing=False, batch=1, seq=256)
    bd = memory_breakdown(spec, setup)
    assert bd.peak_instant == "backward_top_fetch"
    assert bd.components["parallel_buffers"] >= 4 * STACKS * 2


def test_the_largest_deepspeed_parameter_of_a_moe_is_a_fused_stack() -> None:
    # Qwen3-30B-A3B: 128 experts, h 2048, f 768: gate_up_proj [128, 1536, 2048] is one parameter of
    # 402,653,184 elements (the simulation's gathered copy has that size), larger than any linear
    # (q_proj 2048 x 4096 = 8,388,608) and than down_proj's 201,326,592
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.wrappers.zero3_coordinator import largest_ds_parameter

    base = resolve_model("Qwen/Qwen3-30B-A3B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=2), "qwen3-30b-a3b-2L")
    assert largest_ds_parameter(spec) == 128 * 2 * 768 * 2048
    dense = model_from_config(dict(MIXTRAL, model_type="mistral"), "mistral-like-2L")
    assert largest_ds_parameter(dense) == F * H


def test_a_checkpointed_shared_expert_layer_holds_its_recomputed_experts_beside_the_new_round() -> None:
    # DeepSeek-V3-like, one dense and one MoE layer, 16 experts of h 1024, f 512: the stacks are
    # 16 x 2 x 512 x 1024 (gate_up_proj) + 16 x 1024 x 512 (down_proj) = 25,165,824 elements. Under
    # checkpointing the shared experts' down projection is the first module back-propagated in the MoE
    # block (DeepseekV3MoE.forward adds it last); its recomputation attributes the frozen experts to it
    # (update_recompute_parameters), its backward releases them, grouped_mm's saved view keeps the copy,
    # and the experts' own backward fetch gathers a flat buffer and copies beside it: 3 x stacks x 2 B.
    from tuneplan.estimator.wrappers.zero3_expert_round import zero3_record_pass_top_bytes

    cfg = dict(model_type="deepseek_v3", hidden_size=1024, intermediate_size=4096, moe_intermediate_size=512,
               n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
               num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=256,
               kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, vocab_size=32000)
    spec = model_from_config(cfg, "deepseek-v3-like-2L")
    stacks = 16 * 2 * 512 * 1024 + 16 * 1024 * 512
    lora = build_setup(spec, method="lora", precision="bf16", gpus=2, zero=3, targets="q_a_proj,o_proj",
                       gradient_checkpointing=True)
    assert zero3_record_pass_top_bytes(resolve_run(spec, lora)) == 3 * stacks * 2
    # a full fine-tune's experts require grad: not attributed to the recomputation; only the recording
    # pass's recomputation releases them (test_the_recording_passs_recomputation_releases_trained_experts)
    full = build_setup(spec, method="full", precision="bf16", gpus=2, zero=3, gradient_checkpointing=True)
    assert zero3_record_pass_top_bytes(resolve_run(spec, full)) == 3 * stacks * 2
    # Mixtral's block is a ZeRO-3 leaf with no shared experts: its own backward owns the recomputed copy
    mixtral = model_from_config(MIXTRAL, "mixtral-2L")
    ckpt = build_setup(mixtral, method="lora", precision="bf16", gpus=4, zero=3, targets="q_proj,v_proj",
                       gradient_checkpointing=True)
    assert zero3_record_pass_top_bytes(resolve_run(mixtral, ckpt)) == 0


def test_the_recording_pass_precedes_the_optimizers_first_step() -> None:
    # the top layer's backward fetch without checkpointing is the recording pass's (the first micro-batch
    # of the first step): stage3.py initialize_optimizer_states (DeepSpeed 0.19.8) gives the fp32
    # partitions a gradient and makes no state; AdamW makes exp_avg and exp_avg_sq (fp32, the partition's
    # size each) in its first step(). Mixtral-2L full on 4 GPUs: every parameter trains.
    from tuneplan.estimator.instants import memory_at

    spec = model_from_config(MIXTRAL, "mixtral-2L")
    layer = 2 * H * H + 2 * H * 1024 + H * E + STACKS + 2 * H
    params = 2 * 32768 * H + 2 * layer + H
    partition = -(-params // 4)
    setup = build_setup(spec, method="full", precision="bf16-mixed", gpus=4, zero=3, optimizer="adamw",
                        gradient_checkpointing=False, batch=1, seq=256)
    at = memory_at(resolve_run(spec, setup), 1, 256)
    assert at.components("backward_top_fetch")["optimizer_temp"] == -2 * 4 * partition
    # under checkpointing the fetch comes in every pass, the states made
    ckpt = build_setup(spec, method="qlora", precision="bf16", gpus=4, zero=3, targets="q_proj,v_proj",
                       gradient_checkpointing=True, batch=1, seq=256)
    assert "backward_top_fetch" not in memory_at(resolve_run(spec, ckpt), 1, 256).rows


def test_a_leaf_blocks_round_holds_its_router_and_shared_expert() -> None:
    # Qwen2-MoE-like, 16 experts of f 512, h 1024, a shared expert of f 2048 and its 1-output gate: the
    # leaf block is fetched as one module, every parameter under it in the round, held twice. A full
    # fine-tune in bf16: stacks 16 x 3 x 512 x 1024, router 16 x 1024 + 1024, shared 3 x 1024 x 2048
    cfg = dict(model_type="qwen2_moe", hidden_size=1024, intermediate_size=4096, moe_intermediate_size=512,
               shared_expert_intermediate_size=2048, num_experts=16, num_experts_per_tok=2,
               num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
               tie_word_embeddings=False)
    spec = model_from_config(cfg, "qwen2-moe-like-2L")
    stacks, router, shared = 16 * 3 * 512 * 1024, 16 * 1024 + 1024, 3 * 1024 * 2048
    full = build_setup(spec, method="full", precision="bf16", gpus=2, zero=3)
    assert zero3_expert_round_bytes(resolve_run(spec, full)) == 2 * (stacks + router + shared) * 2


def test_the_recording_pass_keeps_no_forward_copy_of_lora_adapted_stacks() -> None:
    # LoRA on w1/w2/w3: PEFT moves them onto the fused stacks (lora.ParamWrapper); grouped_mm saves the
    # parametrized copy (``_LoraFactorsProxy``: baddbmm's new tensor), not a view of the gathered stacks,
    # so no layer's forward copy outlives its release; the top layer's backward fetch still gathers its
    # new round (the factors need their gradients): flat buffer + copies, stacks and router, in bf16.
    from tuneplan.estimator.wrappers.zero3_expert_round import zero3_record_pass_top_bytes

    spec = model_from_config(MIXTRAL, "mixtral-2L")
    lora = build_setup(spec, method="lora", precision="bf16", gpus=4, zero=3, targets="w1,w2,w3",
                       gradient_checkpointing=False)
    assert zero3_record_pass_top_bytes(resolve_run(spec, lora)) == 2 * (STACKS + ROUTER) * 2


DEEPSEEK_LIKE = dict(model_type="deepseek_v3", hidden_size=1024, intermediate_size=4096,
                     moe_intermediate_size=512, n_routed_experts=16, n_shared_experts=1,
                     num_experts_per_tok=2, first_k_dense_replace=1, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=8, q_lora_rank=256, kv_lora_rank=128,
                     qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, vocab_size=32000)


def test_the_recording_passs_recomputation_releases_trained_experts() -> None:
    # DeepSpeed 0.19.8 partitioned_param_coordinator.py: until the trace is complete, the recomputed
    # experts module's forward post-hook (release_sub_module(forward=True)) releases all its parameters,
    # trained ones too (update_recompute_parameters takes only frozen ones); grouped_mm's saved view
    # keeps the recomputed copy (the experts' input requires grad), and the experts' backward fetch
    # gathers a flat buffer and per-parameter copies beside it. DeepSeek-V3-like, 2 layers, the top one
    # MoE, freeze of the top layer in bf16-mixed over 2 GPUs, AdamW on the device:
    #   stacks 16 x 2 x 512 x 1024 + 16 x 1024 x 512 = 25,165,824 elements -> 3 x 2 B each = 150,994,944 B
    #   the trained layer (transformers 5.25 DeepseekV3DecoderLayer): q_a 1024 x 256 = 262,144, q_a norm
    #   256, q_b 256 x 8 x 96 = 196,608, kv_a 1024 x 160 = 163,840, kv_a norm 128, kv_b 128 x 8 x 128 =
    #   131,072, o 512 x 1024 = 524,288, stacks 25,165,824, router 16 x 1024 = 16,384, shared expert
    #   3 x 512 x 1024 = 1,572,864, two norms 2,048: 28,035,456 elements, 14,017,728 a rank; AdamW's
    #   exp_avg + exp_avg_sq (fp32) not made before the first step(): -8 x 14,017,728 = -112,141,824 B
    from tuneplan.estimator.instants import memory_at
    from tuneplan.estimator.wrappers.zero3_expert_round import zero3_recompute_every_pass

    spec = model_from_config(DEEPSEEK_LIKE, "deepseek-v3-like-2L")
    freeze = build_setup(spec, method="freeze", freeze_trainable_layers=1, precision="bf16-mixed", gpus=2,
                         zero=3, gradient_checkpointing=True, optimizer="adamw", batch=1, seq=256)
    run = resolve_run(spec, freeze)
    assert not zero3_recompute_every_pass(run)
    row = memory_at(run, 1, 256).components("backward_top_fetch")
    assert row["parallel_buffers"] == 150_994_944
    assert row["optimizer_temp"] == -112_141_824
    # Mixtral's block is a ZeRO-3 leaf: its recomputation is its backward's one fetch
    mixtral = model_from_config(MIXTRAL, "mixtral-2L")
    leaf = build_setup(mixtral, method="freeze", freeze_trainable_layers=1, precision="bf16-mixed", gpus=2,
                       zero=3, gradient_checkpointing=True, batch=1, seq=256)
    assert "backward_top_fetch" not in memory_at(resolve_run(mixtral, leaf), 1, 256).rows
