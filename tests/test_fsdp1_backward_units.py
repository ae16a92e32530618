"""FSDP1's units in the backward: the lowest trained layer (wrappers/fsdp1_bottom.py), the root unit after a
no_sync accumulation (wrappers/fsdp1_root_end.py), a LoRA layer's end (weights.
recompute_casts_to_first_target), the top layer's end with autocast's saved casts (layer_end_casts.py),
PEFT's per-adapter units (wrappers/fsdp1_adapter_units.py) and the adapter dropout's backward
(layer_saved.down_adapter_backward): what torch's FSDP1 has gathered and which gradients and casts exist,
expected figures derived by hand from the models' shapes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.instants import memory_at, named  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# Mistral-7B-v0.1: one decoder layer is q, o (4096 x 4096), k, v (1024 x 4096), gate, up, down
# (14336 x 4096) and two norms (4096): 218,112,000 parameters; the root unit is the embeddings and the
# lm_head (32000 x 4096 each) and the final norm: 262,148,096
LAYER = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096
ROOT = 2 * 32000 * 4096 + 4096


def _run(layers: int, **kw: object):
    spec = reduced_model("mistralai/Mistral-7B-v0.1", layers)
    return resolve_run(spec, build_setup(spec, **kw))


def _bottom(run):
    statics = memory_statics(run)
    return statics, run.wrapper.memory(run, statics.optimizer)


def test_freeze_with_checkpointing_prefetches_the_frozen_layer_below() -> None:
    # freeze, the top 2 of 3 layers trained, checkpointing on: enable_input_require_grads makes the frozen
    # layer 0 back-propagated, its output requires grad, so the lowest trained layer (1) prefetches it
    # (BACKWARD_PRE): the root and two layers unsharded in bf16 (2 B per parameter). Its bf16 gradient
    # (the views' and their cat: 2 x 2 B per parameter) ends its backward; its fp32 shard (4 B / 4 GPUs
    # per parameter) is not made yet.
    assert LAYER == 218_112_000
    run = _run(3, method="freeze", framework="llamafactory", batch=3, seq=384, gradient_checkpointing=True,
               optimizer="adamw-fused", attn="eager", gpus=4, fsdp=True, fsdp_version=1)
    statics, wrapped = _bottom(run)
    bottom = wrapped.bottom_layer
    assert bottom is not None
    assert bottom.gathered == ROOT * 2 + 2 * LAYER * 2
    assert bottom.gradients_at_end == 2 * LAYER * 2
    assert wrapped.buckets.missing_at_bottom == LAYER * 4 // 4
    # at the row: the upper layer's shard, the bottom layer's two bf16 gradients, its activations released
    row = named(memory_at(run, 3, 384).rows["backward_layers_bottom"])
    assert row.gradients == LAYER * 4 // 4 + 2 * LAYER * 2
    assert row.activations == 0
    assert row.parallel_buffers == ROOT * 2 + 2 * LAYER * 2


def test_the_prefetched_frozen_layer_below_is_gathered_at_its_own_size() -> None:
    # DeepSeek-V3 reduced to its 3 dense layers (first_k_dense_replace) and 2 MoE layers, freeze of the top 2
    # (the MoE ones), checkpointing on (LLaMA-Factory's default): the lowest trained layer (3) prefetches
    # the frozen dense layer 2 below it, gathered at the dense layer's size, not the MoE layer's.
    # Dense layer: q_a 7168x1536, q_b 1536x24576, kv_a 7168x576, kv_b 512x32768, o 16384x7168, gate / up /
    # down 3 x 7168x18432, norms 1536 + 512 + 2 x 7168: 583,483,392. MoE layer: the same attention and
    # norms (187,121,664), 256 experts and the shared one of 3 x 7168x2048, the router 256x7168:
    # 11,507,286,016. Root: embed_tokens and lm_head 129280x7168 each, the final norm: 1,853,365,248.
    # All gathered in fp16 (2 B per parameter): simulate, 27,888,269,312 B of all-gather buffers there.
    dense = 7168 * 1536 + 1536 * 24576 + 7168 * 576 + 512 * 32768 + 16384 * 7168 + 3 * 7168 * 18432 \
        + 1536 + 512 + 2 * 7168
    moe = dense - 3 * 7168 * 18432 + 257 * 3 * 7168 * 2048 + 256 * 7168
    root = 2 * 129280 * 7168 + 7168
    assert (dense, moe, root) == (583_483_392, 11_507_286_016, 1_853_365_248)
    spec = reduced_model("deepseek-ai/DeepSeek-V3", 2)
    setup = build_setup(spec, method="freeze", precision="fp16-mixed", framework="llamafactory", batch=2,
                        seq=512, optimizer="paged-adamw-8bit", attn="flash", gpus=2, fsdp=True,
                        fsdp_version=1)
    run = resolve_run(spec, setup)
    bottom = _bottom(run)[1].bottom_layer
    assert bottom is not None
    assert bottom.gathered == 2 * (root + moe + dense) == 27_888_269_312


def test_freeze_without_checkpointing_prefetches_nothing_below() -> None:
    # no checkpointing: the frozen layer below outputs nothing that requires grad, so the lowest trained
    # layer's pre-backward finds no handle to prefetch: the root and one layer unsharded (bf16, 2 B per
    # parameter), its own fp32 shard (4 B / 2 GPUs per parameter) not made yet. Over 2 GPUs a layer's
    # shard weighs as much as its bf16 copy: the layer above it (both unsharded, both shards missing) is no
    # larger.
    run = _run(3, method="freeze", framework="hf", batch=3, seq=384, gradient_checkpointing=False,
               optimizer="adamw-fused", attn="eager", gpus=2, fsdp=True, fsdp_version=1)
    _, wrapped = _bottom(run)
    assert wrapped.bottom_layer is not None
    assert wrapped.bottom_layer.gathered == ROOT * 2 + LAYER * 2
    assert wrapped.buckets.missing_at_bottom == LAYER * 4 // 2


def test_over_four_gpus_the_layer_above_the_lowest_is_larger() -> None:
    # the same over 4 GPUs: a layer's fp32 shard (4 B / 4 GPUs = 1 B per parameter) is lighter than its bf16
    # copy (2 B), so the layer above the lowest, with the lowest prefetched beside it and both shards not
    # made, holds more: the root and two layers unsharded, two shards missing
    run = _run(3, method="freeze", framework="hf", batch=3, seq=384, gradient_checkpointing=False,
               optimizer="adamw-fused", attn="eager", gpus=4, fsdp=True, fsdp_version=1)
    _, wrapped = _bottom(run)
    assert wrapped.bottom_layer is not None
    assert wrapped.bottom_layer.gathered == ROOT * 2 + 2 * LAYER * 2
    assert wrapped.buckets.missing_at_bottom == 2 * (LAYER * 4 // 4)


def test_full_fine_tune_bottom_layer_has_only_the_root_below() -> None:
    # a full fine-tune's layer 0 over 2 GPUs: below it only the root, never resharded after the forward;
    # the head's bf16 gradient (32000 x 4096, made at the loss) waits for the root's post-backward; the
    # bottom layer's and the root's fp32 shards (4 B / 2 GPUs per parameter) are not made yet
    run = _run(2, method="full", framework="hf", batch=1, seq=256, gradient_checkpointing=False,
               optimizer="adamw-fused", attn="sdpa", gpus=2, fsdp=True, fsdp_version=1)
    _, wrapped = _bottom(run)
    bottom = wrapped.bottom_layer
    assert bottom is not None
    assert bottom.gathered == ROOT * 2 + LAYER * 2
    assert bottom.gradients_at_end == 2 * LAYER * 2 + 32000 * 4096 * 2
    assert wrapped.buckets.missing_at_bottom == (LAYER + ROOT) * 4 // 2


def test_lora_has_no_bottom_unit() -> None:
    # PEFT's per-adapter units: the layer-end rows hold it (wrappers/fsdp.fsdp_layers_gathered)
    run = _run(2, method="lora", framework="hf", batch=1, seq=256, gpus=2, fsdp=True, fsdp_version=1)
    assert _bottom(run)[1].bottom_layer is None


def test_last_micro_batch_root_end_holds_layer_shards_and_the_roots_accumulated_gradient() -> None:
    # Qwen2.5-1.5B (tied embedding 151936 x 1536, final norm 1536), pure bf16 without accelerate's mixed
    # precision (LLaMA-Factory's pure_bf16: no fp32 upcast), 2 micro-batches under the Trainer's no_sync,
    # 4 GPUs. A layer: q (1536 x 1536 + 1536), k and v (256 x 1536 + 256), o (1536 x
    # 1536), gate, up, down (8960 x 1536), two norms. At the root's end in the synced micro-batch each
    # layer has reduce-scattered its accumulated bf16 gradient (2 B / 4 GPUs per parameter); the root's
    # accumulated bf16 gradient (2 B per parameter) is still unsharded.
    layer = 2 * 1536 * 1536 + 1536 + 2 * (256 * 1536 + 256) + 3 * 8960 * 1536 + 2 * 1536
    root = 151936 * 1536 + 1536
    spec = reduced_model("Qwen/Qwen2.5-1.5B-Instruct", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16", framework="llamafactory",
                                        batch=2, seq=128, grad_accum=2, gradient_checkpointing=False,
                                        optimizer="adamw", attn="sdpa", gpus=4, fsdp=True, fsdp_version=1))
    row = named(memory_at(run, 2, 128).rows["backward_embedding"])
    assert abs(row.gradients - (3 * layer * 2 // 4 + root * 2)) <= 8


def test_lora_layer_end_keeps_the_recomputed_casts_up_to_the_first_adapter() -> None:
    # fsdp_qlora, Mistral-7B LoRA on the MLP, bf16-mixed (fp32 weights under autocast), checkpointed: when
    # gate_proj's adapter (the layer's first, forward order) prefetches the next layer, the base linears
    # not back-propagated yet keep their recomputed bf16 casts: q, o (4096 x 4096), k, v (1024 x 4096)
    # and gate_proj (14336 x 4096), 2 B per element
    casts = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 14336 * 4096) * 2
    run = _run(3, method="lora", precision="bf16-mixed", framework="fsdp-qlora", batch=2, seq=512,
               gradient_checkpointing=True, rank=16, targets="mlp", dropout=0.05, attn="flash", gpus=4,
               fsdp=True, fsdp_version=1, offload="all")
    assert memory_statics(run).layer_end_casts == casts
    assert named(memory_at(run, 2, 512).rows["backward_layer_end"]).autocast_copies == casts


def test_lora_top_layer_end_keeps_the_saved_casts_below_and_up_to_the_first_adapter() -> None:
    # fsdp_qlora, Mistral-7B LoRA on the MLP, fp16-mixed (fp32 weights under autocast), 3 layers, no
    # checkpointing: every frozen linear saves its fp16 cast for its input gradient, except in layer 0
    # where the input of q, k, v, o (the embeddings') and of gate, up (attention frozen, no adapter) needs
    # no gradient: only down_proj's (14336 x 4096) is saved there. When the top layer's gate_proj adapter
    # prefetches the next layer, its up and down casts are back-propagated; left: layer 0's down_proj,
    # layer 1's seven linears, the top layer's q, k, v, o and gate_proj; 2 B per element, unsharded
    # (train.py gathers the fp32 weights whole)
    attn = 2 * 4096 * 4096 + 2 * 1024 * 4096
    mlp = 14336 * 4096
    casts = (mlp + (attn + 3 * mlp) + (attn + mlp)) * 2
    run = _run(3, method="lora", precision="fp16-mixed", framework="fsdp-qlora", batch=2, seq=384,
               gradient_checkpointing=False, rank=4, targets="mlp", optimizer="adamw-hf", attn="sdpa",
               num_labels=1, gpus=4, fsdp=True, fsdp_version=1, offload="none")
    assert memory_statics(run).top_layer_end_casts == casts
    assert named(memory_at(run, 2, 384).rows["backward_top_layer_end"]).autocast_copies == casts


def test_full_top_layer_end_has_released_the_heads_and_its_own_casts() -> None:
    # fsdp_qlora, Llama-2-70b full, bf16-mixed (fp32 weights gathered whole, cast to bf16 under autocast),
    # 2 layers, no checkpointing. One layer's linears: q, o (8192 x 8192), k, v (1024 x 8192), gate, up,
    # down (28672 x 8192); the lm_head 32000 x 8192; 2 B per cast element. The head's cast dies with the
    # head's backward; at the top layer's end its own casts are gone (its 2 x 3.3 GB of fp32 view and flat
    # gradients outweigh them): only layer 0's casts are left
    layer = (2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192) * 2
    head = 32000 * 8192 * 2
    spec = reduced_model("meta-llama/Llama-2-70b-hf", 2)
    run = resolve_run(spec, build_setup(spec, method="full", precision="bf16-mixed", framework="fsdp-qlora",
                                        batch=1, seq=2048, grad_accum=2, gradient_checkpointing=False,
                                        optimizer="adafactor", attn="sdpa", gpus=4, fsdp=True, fsdp_version=1,
                                        offload="all"))
    statics = memory_statics(run)
    assert statics.autocast_copies == 2 * layer + head
    assert statics.head_top_casts == (head, layer)
    assert named(memory_at(run, 1, 2048).rows["backward_layers_top"]).autocast_copies == layer


def test_offloaded_flat_params_keep_the_shards_above_on_the_device() -> None:
    # fsdp_qlora (use_orig_params=False), Llama-3.1-405B full fp32 on 2 GPUs, CPU offload, 3 layers. One
    # layer: q, o (16384 x 16384), k, v (1024 x 16384), gate, up, down (53248 x 16384), two norms (16384):
    # 3,187,703,808 parameters. The bottom row is the layer above the lowest (two layers unsharded): its
    # fp32 view gradients and their cat (2 x 4 B per parameter), the lm_head's gradient waiting in the root
    # (128256 x 16384 x 4 B), and the top layer's reduce-scattered fp32 shard kept on the device as
    # _saved_grad_shard until _finalize_params (4 B / 2 GPUs per parameter)
    layer = 2 * 16384 * 16384 + 2 * 1024 * 16384 + 3 * 53248 * 16384 + 2 * 16384
    spec = reduced_model("meta-llama/Llama-3.1-405B-Instruct", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="fp32", framework="fsdp-qlora",
                                        batch=3, seq=2048, grad_accum=1, gradient_checkpointing=True,
                                        gpus=2, fsdp=True, fsdp_version=1, offload="all"))
    row = named(memory_at(run, 3, 2048).rows["backward_layers_bottom"])
    assert row.gradients == 2 * layer * 4 + 128256 * 16384 * 4 + layer * 4 // 2


def test_per_adapter_units_end_a_layer_with_one_adapters_gradient() -> None:
    # LLaMA-Factory (PEFT's per-adapter FSDP units), Mistral-7B LoRA r128 on every linear, bf16-mixed: the
    # largest unit is gate/up's lora_B or down's lora_A, 14336 x 128; its view's bf16 gradient and the cat
    # autograd makes of it are what a layer's end adds to the accumulated gradients (2 B per element each),
    # not the whole layer's adapters twice
    run = _run(3, method="lora", precision="bf16-mixed", framework="llamafactory", batch=1, seq=384,
               grad_accum=2, gradient_checkpointing=False, rank=128, dropout=0.05, optimizer="adamw",
               gpus=8, fsdp=True, fsdp_version=1, offload="all")
    _, wrapped = _bottom(run)
    assert wrapped.top_layer is not None
    assert wrapped.top_layer.gradients_at_end == 2 * 14336 * 128 * 2


def test_adapter_dropout_backward_on_the_fp32_cast_input() -> None:
    # FSDP1 LLaMA-Factory, Mistral-7B-Instruct-v0.3 LoRA (q, k, v, o, gate, up, down) with dropout,
    # fp16-mixed: accelerate's fp32 adapters make PEFT cast down_proj's 14336-wide input to fp32 before
    # the dropout. At its backward: the fp32 gradient of the dropout's output and the dropout's fp32 input
    # gradient (2 x 4 B x 14336), lora_A's saved fp16 input (2 B x 14336) freed; beside them the fp16
    # residual gradient and its accumulated copy (2 x 2 B x 4096); 4 x 1024 tokens
    spec = reduced_model("mistralai/Mistral-7B-Instruct-v0.3", 3)
    run = resolve_run(spec, build_setup(spec, method="lora", precision="fp16-mixed", framework="llamafactory",
                                        batch=4, seq=1024, grad_accum=1, rank=16, dropout=0.05,
                                        optimizer="sgd", attn="eager", num_labels=2, gpus=8, fsdp=True,
                                        fsdp_version=1, offload="none"))
    per_token = 2 * 4 * 14336 - 2 * 14336 + 2 * 2 * 4096
    assert named(memory_at(run, 4, 1024).rows["backward_layers_top"]).backward_temp == per_token * 4096


def test_attention_core_backward_beside_the_mlp_and_output_projection_gradients() -> None:
    # fsdp_qlora, Llama-3.1-405B full fp32 on 2 GPUs, CPU offload, 3 layers, checkpointed: fp32 with GQA
    # runs SDPA's math path, whose backward materialises the scores' gradients. At the layer above the
    # lowest, when its attention core is back-propagated: the lm_head's gradient waiting in the root
    # (128256 x 16384), the top layer's device shard (one layer / 2 GPUs), and the layer's own MLP
    # (3 x 53248 x 16384) and o_proj (16384 x 16384) weight gradients, 4 B each, no cat yet
    layer = 2 * 16384 * 16384 + 2 * 1024 * 16384 + 3 * 53248 * 16384 + 2 * 16384
    spec = reduced_model("meta-llama/Llama-3.1-405B-Instruct", 3)
    run = resolve_run(spec, build_setup(spec, method="full", precision="fp32", framework="fsdp-qlora",
                                        batch=3, seq=2048, grad_accum=1, gradient_checkpointing=True,
                                        gpus=2, fsdp=True, fsdp_version=1, offload="all"))
    rows = memory_at(run, 3, 2048).rows
    row = named(rows["backward_layer_attention"])
    made = (3 * 53248 * 16384 + 16384 * 16384) * 4
    assert row.gradients == 128256 * 16384 * 4 + layer * 4 // 2 + made
    assert row.parallel_buffers == named(rows["backward_layers_bottom"]).parallel_buffers


def test_the_layer_above_the_lowest_at_its_attention_core_with_the_moe_block_made() -> None:
    # Mixtral-8x22B at two layers, freeze of both, bf16, CPU offload, eager attention, no checkpointing
    # (simulate: the peak at layer 1's _softmax_backward_data, layer 0 prefetched beside it). Layer 1's MoE
    # block is back-propagated before its attention core: its 8 experts' gate / up / down (6144 x 16384
    # each, the grouped_mm weight gradients), the router (8 x 6144) and o_proj (6144 x 6144) have their bf16
    # gradients (2 B per element); layer 0's activations are saved beside it, and the attention's own
    # scratch replaces the row's (layer 1's MLP block's saved tensors released by then).
    spec = reduced_model("mistralai/Mixtral-8x22B-v0.1", 2)
    setup = build_setup(spec, method="freeze", precision="bf16", framework="llamafactory", batch=3, seq=2048,
                        gradient_checkpointing=False, optimizer="sgd", attn="eager", gpus=2, fsdp=True,
                        fsdp_version=1, offload="all")
    bottom = _bottom(resolve_run(spec, setup))[1].bottom_layer
    assert bottom is not None
    assert bottom.gradients_at_attention == (8 * 3 * 6144 * 16384 + 8 * 6144 + 6144 * 6144) * 2
    assert bottom.attention_below_saved and bottom.attention_scratch_only


def test_the_top_layer_at_its_attention_core_beside_the_heads_and_mlp_gradients() -> None:
    # a full fine-tune of 3 layers, fp16-mixed, eager attention, no checkpointing (simulate: the peak at the
    # top layer's fp32 cast of the probabilities' gradient): the head's fp16 gradient (32000 x 4096, made at
    # the loss) waits in the root; the top layer's gate / up / down (14336 x 4096 each) and o_proj (4096 x
    # 4096) views have their fp16 gradients (2 B per element); the root and two layers (the next one
    # prefetched, BACKWARD_PRE) unsharded in fp16
    run = _run(3, method="full", framework="llamafactory", precision="fp16-mixed", batch=1, seq=2048,
               gradient_checkpointing=False, optimizer="adamw-fused", attn="eager", gpus=2, fsdp=True,
               fsdp_version=1)
    top = _bottom(run)[1].top_layer
    assert top is not None and top.attention_scratch_only
    assert top.gradients_at_attention == (32000 * 4096 + 3 * 14336 * 4096 + 4096 * 4096) * 2
    row = named(memory_at(run, 1, 2048).rows["backward_top_attention"])
    assert row.parallel_buffers == ROOT * 2 + 2 * LAYER * 2
