"""GPT-NeoX's parallel residual (estimator/layer_saved.py, mlp_block): transformers' GPTNeoXLayer.forward
runs ``input_layernorm(hidden_states)`` and, with ``use_parallel_residual``, ``post_attention_layernorm(
hidden_states)`` on the same layer input; each ``native_layer_norm`` saves its input, mean and rstd, and
the input is one storage. By hand for Pythia-6.9B (hidden 4096) in fp32, LoRA on query_key_value, a layer
whose input needs a gradient: the layer input is kept once, 4 x 4096 B per token, not twice; each norm
still keeps its own mean and rstd."""

from __future__ import annotations

from dataclasses import replace

from tuneplan.api import build_setup
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.layer_saved import layer_activations
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup

NEOX = "EleutherAI/pythia-6.9b"


def _per_token(parallel: bool) -> float:
    spec = resolve_model(NEOX, allow_network=False)
    if not parallel:
        spec = replace(spec, config={**spec.config, "use_parallel_residual": False})
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, targets="query_key_value",
                                  precision="fp32"), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    # a layer above the first: its input needs a gradient
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "flash", True, input_requires_grad=True)
    return acts.per_token


def test_parallel_norms_keep_the_layer_input_once() -> None:
    # sequential: post_attention_layernorm reads attn_output + hidden_states, a storage of its own
    assert _per_token(False) - _per_token(True) == 4 * 4096
