"""FSDP's last unit at the end of the backward, and the other terms read off torch's FSDP1 / FSDP2 code
(wrappers/fsdp.py, wrappers/fully_shard.py): expected figures derived by hand from the models' shapes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402
from tuneplan.estimator.wrappers.fsdp import sharded_terms  # noqa: E402


def _run(model: str, layers: int, **kw: object):
    spec = reduced_model(model, layers)
    return resolve_run(spec, build_setup(spec, **kw))


def test_fsdp1_root_unit_concatenates_its_gradients_beside_its_unsharded_parameters() -> None:
    # Meta-Llama-3-8B: the root unit is the embeddings and the lm_head (128256 x 4096 each) and the final
    # norm (4096): 1,050,677,248 parameters. At its post-backward, each parameter's bf16 gradient and their
    # concatenation are live (2 x 2 B per parameter) beside the bf16 unsharded root (2 B per parameter);
    # the root's fp32 shard (4 B / 2 GPUs per parameter) is not made yet.
    root = 2 * 128256 * 4096 + 4096
    run = _run("meta-llama/Meta-Llama-3-8B", 2, method="full", framework="llamafactory", batch=1, seq=256,
               gradient_checkpointing=False, optimizer="adamw-fused", attn="flash", gpus=2, fsdp=True,
               fsdp_version=1)
    end = run.wrapper.memory(run, memory_statics(run).optimizer).end_of_backward
    assert end is not None
    assert end.scratch == 2 * root * 2
    assert end.gathered == root * 2
    assert end.gradients == -(root * 4 // 2)


def test_fsdp1_full_fine_tune_shards_are_fp32_under_the_trainer_upcast() -> None:
    # llamafactory loads bf16 weights; under bf16-mixed accelerate upcasts them to fp32 and FSDP1 casts
    # each reduce-scattered shard to the flat parameter's fp32: 4 B per parameter over 2 GPUs
    run = _run("meta-llama/Meta-Llama-3-8B", 2, method="full", framework="llamafactory", batch=1, seq=256,
               gpus=2, fsdp=True, fsdp_version=1)
    assert memory_statics(run).grads_step == run.param_plan.trainable_params * 4 // 2


def test_fsdp2_embedding_group_reduce_scatter_holds_its_fp32_cast() -> None:
    # Qwen2.5-14B (untied, vocabulary 152064 x 5120): the embedding group's reduce-scatter in the root's
    # final callback holds the bf16 unsharded gradient, the bf16 reduce-scatter input and its 1/2 output,
    # and the output cast to the fp32 shard (4 B / 2 GPUs per element); offloaded: no device shard missing
    emb = 152064 * 5120
    run = _run("Qwen/Qwen2.5-14B", 2, method="full", batch=4, seq=512, optimizer="adamw-hf", attn="sdpa",
               num_labels=1, gpus=2, fsdp=True, fsdp_version=2, offload="all")
    end = run.wrapper.memory(run, memory_statics(run).optimizer).end_of_backward
    assert end is not None
    assert end.scratch == emb * 2 + emb * 4 // 2
    assert end.gathered == emb * 2 + emb * 2 // 2
    assert end.gradients == 0


def test_fsdp2_lora_layer_group_gathers_its_adapters() -> None:
    # Mistral-7B, rank 128 on every linear of a layer: (4096 + 4096) q, (4096 + 1024) k and v,
    # (4096 + 4096) o, (4096 + 14336) gate and up, (14336 + 4096) down, times 128 = 10,485,760 adapter
    # elements per layer, gathered with the layer's 218,112,000 weights, all fp32 in an fp32 run
    per_layer = 128 * (2 * 8192 + 2 * 5120 + 3 * 18432)
    run = _run("mistralai/Mistral-7B-v0.1", 4, method="lora", precision="fp32", batch=4, seq=128,
               gradient_checkpointing=False, rank=128, targets="all-linear", attn="flash", gpus=4, fsdp=True,
               fsdp_version=2, offload="all")
    gathered = run.wrapper.memory(run, memory_statics(run).optimizer).gathered
    assert per_layer == 10_485_760
    assert gathered.top_layer_forward == 3 * (218_112_000 + per_layer) * 4


def test_fsdp_qlora_mixed_gathers_in_fp32_and_keeps_the_heads_cast() -> None:
    # fsdp_qlora's MixedPrecision(param_dtype=float32): the root unit (embeddings and lm_head, 131072 x 5120
    # each, and the final norm's 5120) all-gathers in fp32, 4 B per parameter, and autocast's bf16 cast of
    # the unsharded head (2 B per element) stays for the head's backward
    head = 131072 * 5120
    run = _run("mistralai/Mistral-Nemo-Base-2407", 4, method="qlora", framework="fsdp-qlora", batch=4,
               seq=1024, bits=4, quant_type="fp4", double_quant=False, rank=16, targets="mlp", dropout=0.05,
               gpus=8, fsdp=True, fsdp_version=1, precision="bf16-mixed")
    statics = memory_statics(run)
    assert sharded_terms(run, statics.optimizer).root16 == (2 * head + 5120) * 4
    assert statics.autocast_copies == head * 2
    bf16 = _run("mistralai/Mistral-Nemo-Base-2407", 4, method="qlora", framework="fsdp-qlora", batch=4,
                seq=1024, gpus=8, fsdp=True, fsdp_version=1, precision="bf16")
    assert sharded_terms(bf16, memory_statics(bf16).optimizer).root16 == (2 * head + 5120) * 2


def test_eager_scores_cast_is_released_before_softmax_backward() -> None:
    # Llama-2-70B bf16 eager, no attention dropout: softmax keeps its fp32 output (4 B per head and key
    # position) and probs @ V its bf16 cast (2 B); at softmax's backward the cast is gone and the fp32
    # gradients of the probabilities and of the scores (8 B) are live: 8 - 2 = 6 B per head beyond the
    # saved 6 B, 64 heads
    run = _run("meta-llama/Llama-2-70b-hf", 3, method="lora", precision="bf16", framework="llamafactory",
               batch=3, seq=2048, rank=32, targets="q_proj,v_proj", attn="eager", gpus=2, fsdp=True,
               fsdp_version=2)
    kinds = memory_statics(run).acts.kinds
    assert {kind[1] for kind in kinds} == {6.0 * 64}
    assert {kind[5] for kind in kinds} == {6.0 * 64}


def test_peft_units_dequantize_the_first_adapted_linear_after_the_prefetch() -> None:
    # stablelm-base-alpha-3b (GPT-NeoX, hidden 4096): query_key_value (4096 -> 12288) is the layer's first
    # linear and adapted, so its base backward runs after its adapter's pre-backward hook prefetched the next
    # layer: its bf16 dequantized weight, 12288 x 4096 x 2 B; the layer's largest 4-bit linear is the MLP's
    # 4096 x 16384
    run = _run("stabilityai/stablelm-base-alpha-3b", 3, method="qlora", batch=2, seq=64, gpus=2, fsdp=True,
               fsdp_version=1, offload="all")
    statics = memory_statics(run)
    assert statics.layer_end_dequant[0] == 12288 * 4096 * 2
    assert statics.backward_dequant == 16384 * 4096 * 2
