"""FSDP1 with CPUOffload(offload_params=True) and fsdp_qlora's fp32 gathers under autocast: figures counted
by hand from the models' shapes and torch's FSDP1 code (wrappers/fsdp1_offload.py, wrappers/fp32_gathers.py,
wrappers/fsdp.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# Yi-1.5-6B: hidden 4096, intermediate 11008, 32 query / 4 key-value heads of 128, vocabulary 64000
YI_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 512 + 3 * 4096 * 11008 + 2 * 4096
YI_ROOT = 2 * 64000 * 4096 + 4096
# stablelm-base-alpha-3b (GPT-NeoX): hidden 4096, intermediate 16384, biased linears, LayerNorms with bias
NEOX_LAYER = (4096 * 12288 + 12288) + (4096 * 4096 + 4096) + 2 * (4096 * 16384) + 16384 + 4096 + 4 * 4096
NEOX_ROOT = 2 * 50688 * 4096 + 2 * 4096


def _run(model: str, layers: int, **kw: object):
    spec = reduced_model(model, layers)
    return resolve_run(spec, build_setup(spec, **kw))


def test_no_sync_keeps_unsharded_gradients_on_the_device_under_cpu_offload() -> None:
    # the Trainer's accumulating micro-batch runs under no_sync: _post_backward_hook returns before the
    # reduce-scatter and _offload_grad, so every unit's bf16 (MixedPrecision param dtype) unsharded
    # gradient stays on the GPU; the step's fp32 shards go to the host's _cpu_grad
    run = _run("01-ai/Yi-1.5-6B", 2, method="full", precision="bf16-mixed", framework="hf", batch=3, seq=384,
               grad_accum=2, gradient_checkpointing=False, optimizer="adafactor", attn="flash", gpus=2,
               fsdp=True, fsdp_version=1, offload="all")
    statics = memory_statics(run)
    assert statics.grads == (2 * YI_LAYER + YI_ROOT) * 2
    assert statics.grads_prev == (2 * YI_LAYER + YI_ROOT) * 2
    assert statics.grads_step == 0


def test_freeze_offload_copies_only_the_frozen_root_shard_to_the_device() -> None:
    # fp16-mixed freeze: the two trained layers are fp32 flat parameters with an fp16 _mp_shard (no copy),
    # the frozen root (embed_in, embed_out, final LayerNorm) is fp16 already: pre_unshard copies its host
    # shard (1/2) to the device and the original parameters stay views of it while it is unsharded
    run = _run("stabilityai/stablelm-base-alpha-3b", 3, method="freeze", precision="fp16-mixed",
               framework="hf", batch=2, seq=64, grad_accum=2, gradient_checkpointing=True, attn="eager",
               gpus=2, fsdp=True, fsdp_version=1, offload="all")
    gathered = run.wrapper.memory(run, memory_statics(run).optimizer).gathered
    assert gathered.in_layers == 2 * NEOX_LAYER * 2 + NEOX_ROOT * 2 + NEOX_ROOT * 2 // 2
    assert gathered.at_loss == NEOX_LAYER * 2 + NEOX_ROOT * 2 + NEOX_ROOT * 2 // 2


def test_fsdp_qlora_lora_under_autocast_shards_an_fp32_base() -> None:
    # train.py loads the model in fp32 for fp16_autocast (LoRA, unquantized): the flat parameters are
    # fp32, base and adapters (r32 on q,k,v,gate,up,down), each GPU holding half
    adapters = 4 * 32 * ((4096 + 4096) + 2 * (4096 + 512) + 3 * (4096 + 11008))
    run = _run("01-ai/Yi-1.5-6B", 4, method="lora", precision="fp16-mixed", framework="fsdp-qlora", batch=1,
               seq=384, rank=32, gradient_checkpointing=False, optimizer="adafactor", gpus=2, fsdp=True,
               fsdp_version=1)
    resident = run.wrapper.memory(run, memory_statics(run).optimizer).resident
    assert resident.weights + resident.adapters == (4 * YI_LAYER + YI_ROOT + adapters) * 4 // 2


def test_fsdp_qlora_autocast_saves_each_gathered_weights_cast_without_checkpointing() -> None:
    # the fp32-gathered weights are cast to fp16 for each matmul and the cast saved for the input gradient:
    # the untied head (64000 x 4096), the fp32 adapters (r32 on q, k, v, gate, up, down) and, with no
    # checkpointing, every block linear of the 4 layers, all unsharded, but the bottom layer's q, k, v: their
    # base matmuls read the normed embedding output, which does not require grad, so nothing saves their
    # casts (the adapters beside them are a separate branch; o_proj and the MLP read LoRA outputs)
    linears = 2 * 4096 * 4096 + 2 * 4096 * 512 + 3 * 4096 * 11008
    bottom_qkv = 4096 * 4096 + 2 * 4096 * 512
    adapters = 4 * 32 * ((4096 + 4096) + 2 * (4096 + 512) + 3 * (4096 + 11008))
    kw = dict(method="lora", precision="fp16-mixed", framework="fsdp-qlora", batch=1, seq=384, rank=32,
              optimizer="adafactor", gpus=2, fsdp=True, fsdp_version=1)
    statics = memory_statics(_run("01-ai/Yi-1.5-6B", 4, gradient_checkpointing=False, **kw))
    assert statics.autocast_copies == (64000 * 4096 + 4 * linears - bottom_qkv + adapters) * 2
    assert statics.autocast_copies_backward == (64000 * 4096 + 4 * linears - bottom_qkv + adapters) * 2
    checkpointed = memory_statics(_run("01-ai/Yi-1.5-6B", 4, gradient_checkpointing=True, **kw))
    assert checkpointed.autocast_copies_backward == 64000 * 4096 * 2


def test_fsdp_qlora_fp32_policy_makes_fp32_unsharded_gradients() -> None:
    # Llama-3.1-70B layer: q, o 8192^2, k, v 8192 x 1024, gate/up/down 8192 x 28672, two norms. Under
    # train.py's fp32 MixedPrecision the top layer's weight gradients come back through autocast's casts in
    # fp32, concatenated (inputs and output live), beside the fp32 lm_head gradient (128256 x 8192) that
    # waits for the root's post-backward
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    run = _run("meta-llama/Llama-3.1-70B-Instruct", 3, method="full", precision="bf16-mixed",
               framework="fsdp-qlora", batch=4, seq=64, grad_accum=2, gpus=4, fsdp=True, fsdp_version=1)
    wrapped = run.wrapper.memory(run, memory_statics(run).optimizer)
    assert wrapped.top_layer is not None
    assert wrapped.top_layer.gradients_at_end == 2 * layer * 4 + 128256 * 8192 * 4


def test_fsdp_qlora_accumulates_unsharded_only_with_cpu_offload() -> None:
    # train.py: no_sync off by default; use_cpu_offload with gradient_accumulation_steps > 1 turns it on,
    # and the accumulated unsharded gradients are fp32 (the MixedPrecision param dtype); otherwise each
    # micro-batch's fp32 shard (1/2) accumulates in _saved_grad_shard
    kw = dict(method="full", precision="bf16-mixed", framework="fsdp-qlora", batch=2, seq=256, grad_accum=2,
              gpus=2, fsdp=True, fsdp_version=1)
    total = 2 * YI_LAYER + YI_ROOT
    sharded = memory_statics(_run("01-ai/Yi-1.5-6B", 2, **kw))
    assert sharded.grads == total * 4 // 2
    offloaded = memory_statics(_run("01-ai/Yi-1.5-6B", 2, offload="all", **kw))
    assert offloaded.grads == total * 4
    assert offloaded.grads_step == 0


def test_the_top_layers_end_holds_the_next_layer_beside_every_lower_layers_activations() -> None:
    # PEFT's per-adapter units: the top layer's first adapter prefetches the next layer (BACKWARD_PRE) while
    # the lower layers' activations are all saved. Yi-1.5-34B (hidden 7168, intermediate 20480, 56 / 8
    # heads of 128, vocabulary 64000) on 8 GPUs with CPU offload: the root and two layers unsharded in
    # bf16, each beside the device copy of its host shard (1/8)
    layer = 2 * 7168 * 7168 + 2 * 7168 * 1024 + 3 * 7168 * 20480 + 2 * 7168
    root = 2 * 64000 * 7168 + 7168
    from tuneplan.api import estimate

    spec = reduced_model("01-ai/Yi-1.5-34B", 4)
    b = estimate(spec, method="lora", precision="bf16-mixed", framework="hf", batch=1, seq=1024,
                 gradient_checkpointing=False, rank=16, targets="all-linear", optimizer="paged-adamw",
                 attn="flash", gpus=8, fsdp=True, fsdp_version=1, offload="all").breakdown
    assert b.peak_instant == "backward_top_layer_end"
    assert b.components["parallel_buffers"] == (root + 2 * layer) * 2 + (root + 2 * layer) * 2 // 8


def test_use_orig_params_false_gathers_the_next_layer_from_a_transient_shard_copy() -> None:
    # fsdp_qlora (use_orig_params=False) with CPU offload: the next layer's all-gather reads the device copy
    # of its host shard (1/4), freed once gathered; at a layer's end it is live beside the root and two
    # bf16 layers. Llama-2-70B: layer 8192^2 x 2 + 8192 x 1024 x 2 + 8192 x 28672 x 3 + 2 x 8192, root
    # 32000 x 8192 x 2 + 8192
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    root = 2 * 32000 * 8192 + 8192
    run = _run("meta-llama/Llama-2-70b-hf", 2, method="lora", precision="bf16", framework="fsdp-qlora",
               batch=1, seq=128, rank=64, gradient_checkpointing=False, gpus=4, fsdp=True, fsdp_version=1,
               offload="all")
    gathered = run.wrapper.memory(run, memory_statics(run).optimizer).gathered
    assert gathered.layer_end == (root + 2 * layer) * 2 + layer * 2 // 4


def test_fsdp_qlora_holds_its_outputs_through_the_backward_not_into_the_next_forward() -> None:
    # train.py sets output = None only after the batch's backward and step: the fp32 logits (3 x 512
    # positions x 128256, 4 B) are live at the root unit's end of the backward and at the step, and gone
    # before the next forward
    from tuneplan.estimator.instants import memory_at, named

    run = _run("meta-llama/Meta-Llama-3-8B", 4, method="full", precision="fp32", framework="fsdp-qlora",
               batch=3, seq=512, grad_accum=1, gradient_checkpointing=False, optimizer="adafactor", gpus=8,
               fsdp=True, fsdp_version=1)
    rows = memory_at(run, 3, 512).rows
    logits = 3 * 512 * 128256 * 4
    assert named(rows["backward_embedding"]).logits_loss == logits
    assert named(rows["optimizer_step"]).logits_loss == logits
    assert memory_at(run, 3, 512).held == 0


def test_a_tied_root_sums_the_heads_and_the_embeddings_gradients_out_of_place() -> None:
    # Llama-3.2-3B ties lm_head to embed_tokens (128256 x 3072): at the root unit's end the head's fp32
    # gradient (made at the loss), the embedding's and their out-of-place sum are live together, 3 x 4 B per
    # element, more than the views' gradients and their cat (2 x 4 B per root parameter)
    run = _run("meta-llama/Llama-3.2-3B-Instruct", 2, method="full", precision="fp32",
               framework="llamafactory", batch=4, seq=512, grad_accum=1, gradient_checkpointing=False,
               optimizer="adamw-8bit", attn="flash", gpus=4, fsdp=True, fsdp_version=1)
    end = run.wrapper.memory(run, memory_statics(run).optimizer).end_of_backward
    assert end is not None
    assert end.scratch == 3 * 128256 * 3072 * 4


def test_each_adapter_saves_its_own_16_bit_input_under_the_trainers_fsdp1() -> None:
    # the Trainer's FSDP1 (use_orig_params=True, each lora_A a unit of its own over fp32 adapters): PEFT
    # casts q, k, v's shared bf16 input and o's to fp32 and autocast casts each back to bf16 in the unit,
    # a private copy lora_A saves: 2 B x 8192 per token for each of the four adapters (Llama-3.3-70B); in
    # pure bf16 accelerate sets no FSDP MixedPrecision, so the adapters PEFT made fp32 stay fp32 and the
    # same copies are made; under DeepSpeed the engine casts the adapters to bf16 and the input is shared
    from tuneplan.estimator.layer_walk import LayerWalk

    spec = reduced_model("meta-llama/Llama-3.3-70B-Instruct", 4)
    reads = (("q_proj", "attn_in"), ("k_proj", "attn_in"), ("v_proj", "attn_in"), ("o_proj", "attn_core"))
    for precision, copied, strategy in (("bf16-mixed", True, {"fsdp": True, "fsdp_version": 1}),
                                        ("bf16", True, {"fsdp": True, "fsdp_version": 1}),
                                        ("bf16", False, {"zero": 2})):
        run = _run("meta-llama/Llama-3.3-70B-Instruct", 4, method="lora", precision=precision,
                   framework="llamafactory", batch=4, seq=1024, rank=32, targets="attn",
                   gradient_checkpointing=False, attn="flash", gpus=2, **strategy)
        walk = LayerWalk(spec, spec.layer_groups[0][0], run.setup, run.dtypes, run.targets, False, True,
                         False, True, False, False)
        for name, read in reads:
            walk.linear(name, read, 8192)
        copies = {k: v for k, v in walk.ledger.items.items() if k.endswith(".lora_in")}
        assert copies == ({f"{n}@{r}.lora_in": 2 * 8192 for n, r in reads} if copied else {})


def test_root_pre_backward_copies_its_host_shard_again() -> None:
    # fsdp_qlora train.py (use_orig_params=False) with CPU offload, Meta-Llama-3-8B QLoRA in bf16 over 2 GPUs:
    # the root unit (embedding, untied lm_head, final norm: 2 x 128256 x 4096 + 4096 bf16) stays unsharded
    # after its forward, but reshard() points flat_param at the host shard, so its pre-backward's
    # pre_unshard copies that shard (half the root) to the device before unshard() reuses the storage
    root = (2 * 128256 * 4096 + 4096) * 2
    run = _run("meta-llama/Meta-Llama-3-8B-Instruct", 3, method="qlora", precision="bf16",
               framework="fsdp-qlora", batch=4, seq=64, gradient_checkpointing=True, rank=4,
               targets="all-linear", attn="eager", gpus=2, fsdp=True, fsdp_version=1, offload="all")
    assert memory_statics(run).gathered_root_pre_backward == root + root // 2
    # without offload the shard is already on the device: no copy, no instant
    kept = _run("meta-llama/Meta-Llama-3-8B-Instruct", 3, method="qlora", precision="bf16",
                framework="fsdp-qlora", batch=4, seq=64, gradient_checkpointing=True, rank=4,
                targets="all-linear", attn="eager", gpus=2, fsdp=True, fsdp_version=1)
    assert memory_statics(kept).gathered_root_pre_backward == 0


def test_offloaded_flat_params_keep_their_device_gradient_shards_to_the_end() -> None:
    # train.py (use_orig_params=False) with CPU offload, Meta-Llama-3-8B full fp32 over 2 GPUs: each layer
    # unit's reduce-scatter output stays on the device as _saved_grad_shard until _finalize_params, so at the
    # root unit's end both layers' fp32 shards (218,112,000 / 2 elements each) are live; the HF Trainer's
    # use_orig_params=True frees each at once (_post_backward_use_sharded_grad_views)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    kw = dict(method="full", precision="fp32", batch=2, seq=384, gradient_checkpointing=True, optimizer="sgd",
              gpus=2, fsdp=True, fsdp_version=1, offload="all")
    run = _run("meta-llama/Meta-Llama-3-8B", 2, framework="fsdp-qlora", **kw)
    end = memory_statics(run).end_of_backward
    assert end is not None and end.gradients == 2 * layer * 4 // 2
    hf = memory_statics(_run("meta-llama/Meta-Llama-3-8B", 2, framework="hf", **kw)).end_of_backward
    assert hf is not None and hf.gradients == 0


def test_the_frozen_layer_below_the_lowest_trained_one_holds_its_host_shard_copy() -> None:
    # fp16-mixed freeze, two trained layers (fp32 flat parameters with an fp16 _mp_shard, freed once
    # gathered) over one frozen fp16 layer: checkpointing's enable_input_require_grads makes the backward
    # prefetch that frozen layer at the lowest trained one, and pre_unshard's flat_param_to copy of its host
    # shard (1/2 of the layer) stays the original parameters' storage while it is unsharded; the root alike
    run = _run("stabilityai/stablelm-base-alpha-3b", 3, method="freeze", precision="fp16-mixed",
               framework="hf", batch=2, seq=64, grad_accum=2, gradient_checkpointing=True, attn="eager",
               gpus=2, fsdp=True, fsdp_version=1, offload="all")
    memory = run.wrapper.memory(run, memory_statics(run).optimizer)
    assert memory.bottom_layer is not None
    assert memory.bottom_layer.gathered == (NEOX_ROOT * 2 + NEOX_ROOT * 2 // 2
                                            + 2 * NEOX_LAYER * 2 + NEOX_LAYER * 2 // 2)
    # no_sync accumulation: at the lowest trained layer one trained layer's fp16 unsharded gradient is not
    # alive (its own still being made in an accumulating micro-batch; the one above reduce-scattered and
    # freed in the syncing one); under CPU offload no sharded gradient is pending on the device
    assert memory.buckets.missing_at_bottom == NEOX_LAYER * 2
