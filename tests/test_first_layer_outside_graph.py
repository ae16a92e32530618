"""The first layer LoRA trains reads frozen embeddings: with no adapter on its attention, none of the
attention's ops has an input that requires grad, so autograd records none of them and eager attention keeps
no softmax there (simulate: TinyLlama QLoRA on the MLP, eager: layer 0 keeps no scores). By hand for
Llama-2-7B (32 heads, eager under autocast: the fp32 softmax output and its bf16 cast, 6 bytes per head per
token per key position)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.saved_tensors import LayerActs
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup

LLAMA = "meta-llama/Llama-2-7b-hf"


def _layer(targets: str, input_requires_grad: bool) -> LayerActs:
    spec = resolve_model(LLAMA, allow_network=False)
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, attn="eager", targets=targets), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    return layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "eager", True, input_requires_grad=input_requires_grad)


def test_first_layer_with_adapters_only_on_the_mlp_keeps_no_attention() -> None:
    mlp = "gate_proj,up_proj,down_proj"
    assert _layer(mlp, True).per_token_per_pos == 32 * 6
    first = _layer(mlp, False)
    assert first.per_token_per_pos == 0
    # what it keeps is the MLP's: every layer's MLP share is the same, the attention's and norms' are gone
    assert first.per_token < _layer(mlp, True).per_token


def test_first_layer_with_an_attention_adapter_keeps_its_softmax() -> None:
    assert _layer("q_proj,v_proj", False).per_token_per_pos == 32 * 6
