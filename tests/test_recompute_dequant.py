"""The recomputed layer's 4-bit down projection in its forward, inside the backward: bitsandbytes'
dequantized weight beside the layer's partial recomputation, the forward's live locals and the incoming
gradients (estimator/recompute_dequant.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from random_setups import reduced_model  # noqa: E402
from tuneplan.api import build_setup  # noqa: E402
from tuneplan.estimator.activations import layer_activations  # noqa: E402
from tuneplan.estimator.dtypes import resolve_dtypes  # noqa: E402
from tuneplan.estimator.memory import memory_breakdown  # noqa: E402
from tuneplan.specs.lora_targets import resolve_targets  # noqa: E402
from tuneplan.specs.profiles import get_profile, resolve_setup  # noqa: E402

FALCON = dict(method="qlora", precision="bf16", framework="hf", batch=3, seq=384, bits=4, quant_type="fp4",
              double_quant=True, rank=128, targets="mlp", dropout=0.05, attn="sdpa", gpus=2, fsdp=True,
              fsdp_version=1)


def _layer(model: str, checkpointing: bool, **kw):
    spec = reduced_model(model, 3)
    s = resolve_setup(build_setup(spec, gradient_checkpointing=checkpointing, **kw), spec)
    dt = resolve_dtypes(s, get_profile(s.framework))
    return layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", False)


def test_falcon_down_projection_recomputed_beside_its_dequantized_weight() -> None:
    # Falcon-40B (h 8192, MLP 32768, two LayerNorms, parallel block), QLoRA r128 on the MLP, bf16 autocast
    # (fp32 LayerNorm outputs, so the 4-bit linears return fp32), dropout 0.05, checkpointed. At
    # dense_4h_to_h.base_layer's matmul in the recomputation, per token beyond the layer's ledger:
    #   the fp32 GELU output nothing saves             4 x 32768 = 131072
    #   Linear4bit's bf16 cast of it                   2 x 32768 =  65536
    #   the matmul's bf16 output                       2 x  8192 =  16384
    #   ln_mlp's fp32 output (the MLP's argument)      4 x  8192 =  32768
    #   ln_attn's fp32 output (attention_layernorm_out) 4 x 8192 =  32768
    #   the attention's bf16 output, added after       2 x  8192 =  16384
    #   two fp32 residual gradients of the output  2 x 4 x  8192 =  65536
    # less the down projection's adapter tensors not made yet (its bf16 lora_A input 2 x 32768, the
    # dropout mask 32768, lora_B's bf16 input 2 x 128) = 98560
    expected = 131072 + 65536 + 16384 + 32768 + 32768 + 16384 + 65536 - 98560
    assert _layer("tiiuae/falcon-40b", True, **FALCON).recompute_dequant == expected == 261_888


def test_peak_counts_the_recomputed_dequantization() -> None:
    # the layers' backward scratch: the 8192 x 32768 bf16 weight beside 1152 tokens x 261888 bytes
    spec = reduced_model("tiiuae/falcon-40b", 3)
    b = memory_breakdown(spec, build_setup(spec, gradient_checkpointing=True, **FALCON))
    assert b.components["backward_temp"] == 2 * 8192 * 32768 + 3 * 384 * 261_888


def test_without_checkpointing_nothing_is_recomputed() -> None:
    assert _layer("tiiuae/falcon-40b", False, **FALCON).recompute_dequant == 0


def test_recomputation_stops_before_a_down_projection_that_saves_nothing() -> None:
    # QLoRA on q / v only: nothing at or after Llama's down_proj saves a tensor, so torch's early stop ends
    # the recomputation at the gated product and the down projection's weight is never dequantized there
    kw = dict(FALCON, targets="attn", framework="hf", fsdp=False, gpus=1)
    assert _layer("meta-llama/Llama-2-7b-hf", True, **kw).recompute_dequant == 0
