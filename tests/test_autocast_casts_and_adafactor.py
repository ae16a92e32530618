"""Autocast's 16-bit casts of fp32 weights that autograd saves or not (the bottom layer outside a LoRA run's
graph, a checkpointed layer's recomputation), the loop's held outputs beside a recomputed top layer, and
transformers' Adafactor step temporaries: figures counted by hand from the models' shapes and the
frameworks' code (estimator/weights.py, memory_statics.py, instants.py, optimizer.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.optimizer import optimizer_plan  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402


def _run(model: str, layers: int, **kw: object):
    spec = reduced_model(model, layers)
    return resolve_run(spec, build_setup(spec, **kw))


def test_bottom_layer_casts_outside_the_graph_are_not_saved() -> None:
    # Llama-3.1-70B (h 8192, f 28672, 8 KV heads of 128), 2 layers, LoRA on the MLP, no checkpointing,
    # fsdp_qlora's bf16_autocast: an fp32 frozen base. Layer 0: q/k/v/o and the gate/up base matmuls read
    # tensors that do not require grad, so their bf16 casts die after the matmul; down_proj reads
    # act(gate) * up (LoRA outputs) and keeps its cast. Layer 1 keeps all seven, the head its own.
    h, f, kv, v = 8192, 28672, 1024, 128256
    layer = 2 * h * h + 2 * h * kv + 3 * h * f
    run = _run("meta-llama/Llama-3.1-70B-Instruct", 2, method="lora", precision="bf16-mixed",
               framework="fsdp-qlora", batch=2, seq=64, gradient_checkpointing=False, rank=8, targets="mlp",
               attn="eager")
    adapters = 2 * run.param_plan.adapter_params  # the fp32 adapters' casts, cached (leaves requiring grad)
    assert run.param_plan.autocast_copy_bytes == 2 * (h * f + layer + v * h) + adapters


def test_a_checkpointed_layers_recomputation_saves_its_casts() -> None:
    # Llama-3.1-405B (h 16384, f 53248, 8 KV heads of 128), LoRA q,v under bf16_autocast with checkpointing:
    # the recomputed layer's seven bf16 casts are live in its backward (2 B per weight element); the bottom
    # layer's own gradients are its adapters', so its row keeps them whole
    h, f, kv = 16384, 53248, 1024
    run = _run("meta-llama/Llama-3.1-405B-Instruct", 2, method="lora", precision="bf16-mixed",
               framework="fsdp-qlora", batch=1, seq=256, gradient_checkpointing=True, rank=64,
               targets="q_proj,v_proj", attn="flash")
    casts = 2 * (2 * h * h + 2 * h * kv + 3 * h * f)
    statics = memory_statics(run)
    assert statics.recompute_casts == casts
    assert statics.recompute_casts_bottom == casts
    # a full fine-tune's bottom layer makes fp32 gradients (4 B per element) as its casts are freed: the
    # row's gradients already exceed them
    full = _run("meta-llama/Llama-2-7b-hf", 2, method="full", precision="bf16-mixed", framework="fsdp-qlora",
                batch=1, seq=256, gradient_checkpointing=True, attn="sdpa", optimizer="sgd")
    h2, f2 = 4096, 11008
    assert memory_statics(full).recompute_casts == 2 * (4 * h2 * h2 + 3 * h2 * f2)
    assert memory_statics(full).recompute_casts_bottom == 0


def test_train_py_holds_its_fp32_logits_beside_the_recomputed_top_layer() -> None:
    # train.py binds ``output`` (fp32 logits from the 4.37-4.45 head's .float()) until after the step: at
    # the top layer's backward under checkpointing the loss row carries B S V x 4 bytes
    b, s, v = 4, 384, 32768
    spec = reduced_model("mistralai/Mistral-7B-Instruct-v0.3", 3)
    setup = build_setup(spec, method="lora", precision="fp32", framework="fsdp-qlora", batch=b, seq=s,
                        gradient_checkpointing=True, rank=64, targets="attn", attn="eager")
    bd = memory_breakdown(spec, setup)
    assert bd.peak_instant == "backward_layers_top"
    assert bd.components["logits_loss"] == b * s * v * 4


def test_adafactor_step_temporaries() -> None:
    # transformers Adafactor.step on a factored n-element tensor: (grad**2) + eps holds two fp32 tensors,
    # _approx_sq_grad makes the next update beside the bound one, add_(-update) a negated copy: 2 x 4n.
    # A 16-bit parameter adds grad.float() and p.float(), held through the step: 4 x 4n
    n = 1000
    fp32 = optimizer_plan("adafactor", 10 * n, 4, 10, n, 10 * n, tensor_sizes=((n, 10),))
    bf16 = optimizer_plan("adafactor", 10 * n, 2, 10, n, 10 * n, tensor_sizes=((n, 10),))
    assert fp32.temp == 2 * 4 * n
    assert bf16.temp == 4 * 4 * n
