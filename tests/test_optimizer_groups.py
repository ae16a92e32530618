"""The Trainer's two parameter groups and their order decide the optimizer's temporaries. foreach AdamW makes
its square-root temporary for a whole group at once: the weight-decay group, without biases and norms.
transformers' Adafactor steps one tensor at a time and keeps the previous tensor's update bound while it
squares the next gradient, so what the step holds at once depends on the order of its tensors: the
Trainer's weight-decay group (no norms or biases between the linears) or ``model.parameters()`` as one
group (estimator/optimizer_groups.py; simulate/step.trainer_param_groups)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.optimizer_groups import adafactor_step_temp, no_decay_elements  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402

# Mistral-7B: embedding and head 32000 x 4096 = 131,072,000 elements each, down_proj 4096 x 14336 =
# 58,720,256, gate / up 58,720,256, q / o 16,777,216, k / v 4,194,304
HEAD, DOWN, MLP = 131_072_000, 58_720_256, 58_720_256


def _run(framework: str, method: str, precision: str, **kw):
    spec = reduced_model("mistralai/Mistral-7B-v0.1", 2)
    return resolve_run(spec, build_setup(spec, method=method, precision=precision, framework=framework,
                                         batch=1, seq=128, optimizer="adafactor",
                                         gradient_checkpointing=False, **kw))


def test_trainer_group_puts_the_head_after_the_last_down_proj() -> None:
    # full fine-tune, bf16 parameters (k = 4: fp32 gradient and parameter copies, the square and the sum),
    # Trainer's decay group [embedding, layer 0's seven linears, layer 1's, head]: at the head its four
    # fp32 tensors beside layer 1's down_proj update, 4 x (4 x 131,072,000 + 58,720,256) bytes (simulate:
    # Mistral-7B full bf16 at 4 layers, the step 234.7 MB above the head's four tensors)
    run = _run("hf", "full", "bf16")
    assert adafactor_step_temp(run, 2) == 4 * (4 * HEAD + DOWN) == 2_332_033_024
    assert memory_statics(run).optimizer.temp == 2_332_033_024


def test_one_group_ends_the_chain_at_each_layer() -> None:
    # torchtune steps model.parameters(): the final norm (4096) lies between the last down_proj and the head,
    # so beside the head's four tensors lies the norm's update only: 4 x (4 x 131,072,000 + 4096)
    run = _run("torchtune", "full", "bf16")
    assert adafactor_step_temp(run, 2) == 4 * (4 * HEAD + 4096) == 2_097_168_384


def test_fp32_freeze_layers_chain_through_the_mlp() -> None:
    # freeze, the two layers trained in fp32 (k = 2): up_proj's square and sum beside gate_proj's update,
    # 4 x (2 x 58,720,256 + 58,720,256) (simulate: Mistral-7B-Instruct-v0.3 freeze fp32, 704,643,072 B)
    run = _run("hf", "freeze", "fp32")
    assert adafactor_step_temp(run, 4) == 4 * 3 * MLP == 704_643_072


def test_lora_keeps_the_largest_tensor_rule() -> None:
    # LoRA: the order is not modelled (adapters, all small): the largest tensor's rule stands
    assert adafactor_step_temp(_run("hf", "lora", "bf16", rank=8), 2) is None


def test_foreach_adamw_temporary_is_the_weight_decay_group() -> None:
    # Qwen2.5-0.5B at 2 layers, full fp32: h 896, q / k / v biases 896 + 128 + 128 per layer, two RMSNorms
    # of 896 per layer and the final one: the second group holds 2 x (1152 + 2 x 896) + 896 = 6,784
    # elements, the decay group the rest; torch._foreach_sqrt over it: (P - 6,784) x 4 bytes
    spec = reduced_model("Qwen/Qwen2.5-0.5B", 2)
    run = resolve_run(spec, build_setup(spec, method="full", precision="fp32", framework="hf", batch=1,
                                        seq=128, optimizer="adamw", gradient_checkpointing=False))
    assert no_decay_elements(run) == 2 * (1152 + 2 * 896) + 896 == 6_784
    trainable = run.param_plan.trainable_params
    assert memory_statics(run).optimizer.temp == (trainable - 6_784) * 4


def test_simulation_steps_the_trainers_groups() -> None:
    import pytest

    pytest.importorskip("transformers")
    from torch import nn

    from tuneplan.simulate.step import trainer_param_groups

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(4, 4, bias=True)
            self.input_layernorm = nn.LayerNorm(4)
            self.down_proj = nn.Linear(4, 4, bias=False)

    model = nn.Sequential(Block(), Block())
    model[0].q_proj.weight.requires_grad_(False)
    decay, rest = trainer_param_groups(model)
    # decay: the trainable weights but biases and norms, in module order; the rest after them
    assert decay["params"] == [model[0].down_proj.weight, model[1].q_proj.weight, model[1].down_proj.weight]
    assert rest["params"] == [model[0].q_proj.bias, model[0].input_layernorm.weight,
                              model[0].input_layernorm.bias, model[1].q_proj.bias,
                              model[1].input_layernorm.weight, model[1].input_layernorm.bias]
