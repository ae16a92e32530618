"""bitsandbytes' dequantized weight in a layer's backward (estimator/quant_kernels.bnb_backward_dequant) is
its own point of the layer's backward: the layers' rows hold the larger of it and the gated product's
temporaries, never their sum."""

from __future__ import annotations

from tuneplan.api import build_setup, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.instants import memory_at, named


def rows(model: str, **kw):
    spec = resolve_model(model)
    run = resolve_run(spec, build_setup(spec, **kw))
    return memory_at(run, run.setup.batch, run.setup.seq)


def test_a_405b_fp32_layer_back_propagates_beside_its_dequantized_mlp_weight() -> None:
    """Llama 3.1 405B, fp32 QLoRA, 1 x 384 tokens: the MLP's 16384 x 53248 weight dequantized in fp32
    (4 B each, 3.25 GiB), with, per token, the fp32 residual gradient (4 x 16384) and the down projection's
    input gradient (4 x 53248; no adapter on it: the default targets are q_proj and v_proj), far above the
    gated product's three 53248-wide gradients."""
    m = rows("meta-llama/Llama-3.1-405B-Instruct", method="qlora", precision="fp32", batch=1, seq=384,
             gradient_checkpointing=True)
    expected = 4 * 16384 * 53248 + 384 * (4 * 16384 + 4 * 53248)
    assert expected > m.acts.backward_temp_bytes
    for instant in ("backward_layers_top", "backward_layers_bottom"):
        assert named(m.rows[instant]).backward_temp == expected


def test_a_small_weight_leaves_the_gated_product_the_layers_peak() -> None:
    """Llama 3.2 1B QLoRA at 2 x 1024 tokens: the 2048 x 8192 bf16 weight (32 MiB) and its companions are
    below the gated product's temporaries, which stay the rows' backward scratch unchanged."""
    m = rows("meta-llama/Llama-3.2-1B", method="qlora", batch=2, seq=1024, gradient_checkpointing=True)
    dequant_point = 2 * 2048 * 8192 + 2048 * m.statics.backward_dequant_per_token
    assert m.statics.backward_dequant == 2 * 2048 * 8192
    assert dequant_point < m.acts.backward_temp_bytes
    assert named(m.rows["backward_layers_bottom"]).backward_temp == m.acts.backward_temp_bytes
