"""Three one-GPU mechanisms counted by hand from the frameworks' code:

* transformers 5's fused experts are never cast by autocast: ``torch._grouped_mm`` is not autocast-enabled
  and integrations/moe.py ``_grouped_mm`` casts the input to the stack's dtype instead, so a full
  fine-tune under bf16-mixed (fp32 master weights) keeps 16-bit casts of the attention, router and head
  weights only (estimator/weights.py, bnb_scope.fused_expert);
* a Python GELU (transformers NewGELUActivation) under autocast ends in an fp32 product: its backward
  holds three fp32 MLP-wide gradients, not three of the linears' 16-bit width
  (estimator/layer_saved.py, product_grad_bytes);
* when eager attention's scores gradient is made, the output projection's saved tensors and the V that
  probs @ V kept are already released (estimator/layer_saved.py, released_before_scores).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.activations import layer_activations  # noqa: E402
from tuneplan.estimator.dtypes import resolve_dtypes  # noqa: E402
from tuneplan.estimator.memory_statics import memory_statics  # noqa: E402
from tuneplan.estimator.run import resolve_run  # noqa: E402
from tuneplan.specs.lora_targets import resolve_targets  # noqa: E402
from tuneplan.specs.profiles import get_profile, resolve_setup  # noqa: E402

MIXTRAL = "mistralai/Mixtral-8x22B-v0.1"


def _mixtral(checkpointing: bool):
    spec = reduced_model(MIXTRAL, 2)
    return resolve_run(spec, build_setup(spec, method="full", precision="bf16-mixed", batch=2, seq=128,
                                         gradient_checkpointing=checkpointing, attn="sdpa"))


def test_fused_expert_stacks_get_no_autocast_copy() -> None:
    # Mixtral-8x22B (h 6144, 8 KV heads of 128, 8 experts, vocab 32768), 2 layers, full bf16-mixed: per
    # layer the bf16 casts of q, k, v, o and the router (F.linear under autocast), none of the expert
    # stacks (2 x 8 x 16384 x 6144 + 8 x 6144 x 16384 elements each layer); then lm_head's
    h, kv, experts, vocab = 6144, 1024, 8, 32768
    layer = 2 * h * h + 2 * h * kv + h * experts
    run = _mixtral(False)
    assert run.param_plan.autocast_copy_bytes == 2 * (2 * layer + vocab * h)


def test_a_recomputed_moe_layer_saves_no_expert_casts() -> None:
    # checkpointed: the recomputed layer's casts are the attention's and the router's alone
    h, kv, experts = 6144, 1024, 8
    assert memory_statics(_mixtral(True)).recompute_casts == 2 * (2 * h * h + 2 * h * kv + h * experts)


def test_python_gelu_under_autocast_has_fp32_product_gradients() -> None:
    # phi-1_5 (h 2048, MLP 8192, gelu_new), LoRA q,v, bf16 under the HF Trainer's autocast: fc2's
    # ToCopyBackward hands the fp32 product an fp32 gradient; MulBackward0 makes two fp32 gradients
    # (0.5 x and 1 + tanh) before the engine casts them: 3 x 4 B x 8192 per token, beside the residual's
    # two bf16 hidden-wide gradients (2 x 2 B x 2048)
    spec = reduced_model("microsoft/phi-1_5", 2)
    s = resolve_setup(build_setup(spec, method="lora", precision="bf16", batch=3, seq=1024, rank=4,
                                  gradient_checkpointing=True), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    assert dt.autocast
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", True)
    assert acts.backward_temp == 3 * 4 * 8192 + 2 * 2 * 2048


def test_eager_scores_gradient_after_output_projection_and_v_are_released() -> None:
    # Llama-3-8B (h 4096, 32 heads of 128, 8 KV heads), QLoRA r128 on every linear, LoRA dropout 0.1,
    # eager, fp16 autocast. When the scores' gradient is made, autograd has run o_proj's nodes and
    # probs @ V's: released are o_proj's adapter tensors (its dropout output 2 x 4096 B, its mask 1 x 4096 B,
    # lora_A's 16-bit output 2 x 128 B kept by lora_B) and V repeated to the 32 heads (2 x 32 x 128 B); the
    # MLP's saved tensors are gone too, and the residual's two fp16 hidden-wide gradients are live
    spec = reduced_model("meta-llama/Meta-Llama-3-8B-Instruct", 2)
    s = resolve_setup(build_setup(spec, method="qlora", precision="fp16-mixed", framework="fsdp-qlora",
                                  batch=1, seq=512, rank=128, targets="all-linear", attn="eager",
                                  gradient_checkpointing=True), spec)
    dt = resolve_dtypes(s, get_profile("fsdp-qlora"))
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "eager", True)
    released = (2 + 1) * 4096 + 2 * 128 + 2 * 32 * 128
    assert acts.attn_backward_offset == 2 * 2 * 4096 - acts.mlp_saved - released
