"""The MLP's backward temporaries of a single-op activation (estimator/layer_saved.py,
mlp_backward_tensors). By hand for Pythia-6.9B (GPT-NeoX, hidden 4096, MLP width 16384, ``hidden_act:
gelu``, transformers' ``GELUActivation`` = ``F.gelu``) in fp32, LoRA on query_key_value only:

* dense_4h_to_h's backward makes the gradient of its input, 4 x 16384 B per token;
* ``GeluBackward0`` (derivatives.yaml ``gelu: gelu_backward(grad, self, approximate)``) makes one more of
  the same size, the gradient of dense_h_to_4h's output, beside it: 2 x 4 x 16384 per token. No product
  is differentiated, so no third MLP-wide gradient (SwiGLU's ``act(gate) * up`` has one: MulBackward0
  returns both operands' gradients beside the incoming one, 3 x).
Both beside the residual's two hidden-wide gradients (4 B x 2 x 4096)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup


def _backward_temp(model: str, targets: str, precision: str) -> float:
    spec = resolve_model(model, allow_network=False)
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, targets=targets,
                                  precision=precision), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "flash", True)
    return acts.backward_temp


def test_gelu_mlp_holds_two_mlp_wide_gradients() -> None:
    assert _backward_temp("EleutherAI/pythia-6.9b", "query_key_value", "fp32") == (
        2 * 4 * 16384 + 4 * 2 * 4096)


def test_gated_mlp_keeps_three() -> None:
    # Llama-2-7B in fp32, no adapter on down_proj: 3 x 4 x 11008 + the residual's 4 x 2 x 4096
    temp = _backward_temp("meta-llama/Llama-2-7b-hf", "q_proj,v_proj", "fp32")
    assert temp == 3 * 4 * 11008 + 4 * 2 * 4096
