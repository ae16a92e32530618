"""The MLP's backward temporaries beside a LoRA'd down projection (estimator/layer_saved.py,
down_adapter_backward). By hand for Llama-2-7B (hidden 4096, MLP width 11008) under bf16-mixed, LoRA on
down_proj only, from PEFT's ``base(x) + lora_B(lora_A(dropout(x))) * scaling`` and autograd's order:

* with dropout 0.05, lora_A's matmul saves its private 16-bit input (autocast's cast of the fp32 adapter
  input, 2 B per feature) and native_dropout its bool mask (1 B): P = 3 x 11008 per token, freed once the
  adapter branch has run. The gated product's backward then holds 3 bf16 MLP-wide gradients (6 x 11008)
  less P: 3 x 11008; lora_A's own backward holds its input's gradient, 2 x 11008. The larger: 33,024.
* without the private copy (the upper bound before this mechanism) it would be 6 x 11008 = 66,048.
Both beside the residual's one hidden-wide gradient (residual bytes x 4096): the incoming gradient of
the layer's output, which the residual add hands to the MLP branch as the same tensor
(layer_saved.residual_grads)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.saved_tensors import LayerActs
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup

LLAMA = "meta-llama/Llama-2-7b-hf"


def _layer(dropout: float) -> tuple[LayerActs, int]:
    spec = resolve_model(LLAMA, allow_network=False)
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, targets="down_proj",
                                  precision="bf16-mixed", dropout=dropout), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", True)
    return acts, dt.residual * 4096


def test_down_projection_dropout_copy_and_mask_are_freed_before_the_gated_product() -> None:
    acts, residual = _layer(0.05)
    assert acts.backward_temp == 3 * 2 * 11008 - (2 + 1) * 11008 + residual  # 33,024 + residual


def test_without_dropout_the_private_cast_copy_alone_is_freed() -> None:
    # the 16-bit cast copy (2 x 11008) is still lora_A's private input: 6 - 2 = 4 x 11008, above lora_A's
    # moment (its input's gradient, 2 x 11008)
    acts, residual = _layer(0.0)
    assert acts.backward_temp == 4 * 11008 + residual
