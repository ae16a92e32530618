"""ZeRO-3's optimizer step without offload (DeepSpeed 0.19.8 stage3.py ``step``), counted by hand: the
gradient norm's fp64 copy of one parameter's gradient partition, then sub-group by sub-group
``flatten(averaged_gradients[i])`` (a new tensor in the gradients' dtype) held while ``.to(fp32)`` copies it.
The simulated figures quoted are DeepSpeed's own engine on a fake process group (simulate/zero.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.memory import memory_breakdown
from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_step import zero3_sub_groups
from tuneplan.estimator.wrappers.zero_terms import deepspeed_terms
from tuneplan.specs.model import model_from_config

NEMO = dict(model_type="mistral", hidden_size=5120, head_dim=128, num_attention_heads=32,
            num_key_value_heads=8, intermediate_size=14336, vocab_size=131072, num_hidden_layers=4,
            tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5)


def _cut(name: str, layers: int):  # type: ignore[no-untyped-def]
    cfg = dict(resolve_model(name, allow_network=False).config)
    cfg["num_hidden_layers"] = layers
    return model_from_config(cfg, name=f"{name}[{layers}L]")


def test_a_16_bit_step_holds_the_flat_copy_beside_its_fp32_copy() -> None:
    # Mistral-Nemo cut to 4 layers, fp16 over 2 GPUs: embedding and head 131072 x 5120 = 671,088,640 each,
    # a layer q 20,971,520 + k, v 5,242,880 each + o 20,971,520 + gate, up, down 73,400,320 each + two norms
    # 10,240 = 272,640,000; 4 layers + final norm 5,120 + both = 2,432,742,400, 1,216,371,200 on a rank.
    # Summed in module order the sub-group reaches 1e9 only at the head, the last parameter: one sub-group.
    # The copy's instant: 2 B (the flat fp16 copy) + 4 B (its fp32 copy) x 1,216,371,200 = 7,298,227,200
    # (simulated: the _to_copy at step2.optimizer, 18,062,760,960 with the 16-bit partition, the fp32 master,
    # the gradient partition, the 1e9-byte bucket and the 32 MiB cuBLAS workspace beside it); the norm's
    # copy, 8 x 335,544,320 (the head's partition), is smaller; paged AdamW adds no device temporaries.
    spec = model_from_config(NEMO, "nemo-4L")
    setup = build_setup(spec, method="full", precision="fp16-mixed", gpus=2, zero=3, optimizer="paged-adamw",
                        seq=256, batch=3, grad_accum=2, gradient_checkpointing=True)
    run = resolve_run(spec, setup)
    assert [e for e, _ in zero3_sub_groups(run, 1_216_371_200)] == [1_216_371_200]
    assert deepspeed_terms(run, OptimizerPlan(0, 0, 0)).step_temp == 7_298_227_200
    step = memory_breakdown(spec, setup).instants["optimizer_step"]
    assert abs(step - 18_062_760_960) <= 1 << 20


def test_sub_groups_close_at_a_billion_elements() -> None:
    # Falcon-40B cut to 3 layers, bf16 over 2 GPUs: on a rank the tied embedding 65024 x 8192 / 2 =
    # 266,338,304, a layer's query_key_value 8192 x 9216 / 2 = 37,748,736, dense 33,554,432 and the two MLP
    # projections 134,217,728 each: 339,738,624 a layer (plus its norms). Embedding + two layers =
    # 945,815,552; the top layer's query_key_value and dense carry it to 1,017,118,720 >= 1e9 (with the
    # norms, a few 4,096-element halves more; simulated: the first fp32 sub-group of 1,017,151,488 elements)
    # and the MLP projections make the second, 268,435,456 (+ norms). SGD adds nothing: the step's
    # temporaries are (2 + 4) x the first sub-group, 6 x 1,017,151,488 = 6,102,908,928 simulated.
    spec = _cut("tiiuae/falcon-40b", 3)
    setup = build_setup(spec, method="full", precision="bf16-mixed", gpus=2, zero=3, optimizer="sgd",
                        seq=64, batch=1, grad_accum=2)
    run = resolve_run(spec, setup)
    partition = -(-run.param_plan.trainable_params // 2)
    groups = [e for e, _ in zero3_sub_groups(run, partition)]
    assert len(groups) == 2
    assert 1_017_118_720 <= groups[0] <= 1_017_118_720 + 16 * 4096
    assert 268_435_456 <= groups[1] <= 268_435_456 + 16 * 4096
    temp = deepspeed_terms(run, OptimizerPlan(0, 0, 0)).step_temp
    assert abs(temp - 6_102_908_928) <= 6 * 16 * 4096


def test_an_fp32_step_is_the_norms_fp64_copy_of_the_largest_partition() -> None:
    # Qwen3-4B cut to 2 layers, fp32 over 4 GPUs, SGD: ``.to(fp32)`` returns the flat copy itself, 4 B x
    # the partition (147,705,088 elements: 590,820,352); the norm's fp64 copy of the tied embedding's
    # partition, 151936 x 2560 / 4 = 97,239,040 elements x 8 = 777,912,320, is larger (simulated: the
    # linalg_vector_norm at step2.optimizer, on a float64 tensor of 97,239,040 elements)
    spec = _cut("Qwen/Qwen3-4B", 2)
    setup = build_setup(spec, method="full", precision="fp32", gpus=4, zero=3, optimizer="sgd",
                        seq=2048, batch=1)
    run = resolve_run(spec, setup)
    assert deepspeed_terms(run, OptimizerPlan(0, 0, 0)).step_temp == 777_912_320
