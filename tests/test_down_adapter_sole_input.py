"""The gated product kept by the down projection's LoRA adapter alone (estimator/layer_walk.py
``adapter_only_inputs``; layer_saved.feed_forward; quant_kernels.bnb_backward_dequant).

PEFT's LoRA forward is ``base(x) + lora_B(lora_A(dropout(x))) * scaling`` (peft tuners/lora/layer.py and
bnb.py). Without a dropout or a dtype cast lora_A's matmul saves x, the gated product, itself; a frozen
base linear saves no input (autograd's mm keeps ``self`` only for the weight's gradient) and neither does
bitsandbytes' MatMul4Bit for a frozen 4-bit weight (``ctx.tensors = (None, B)``). Autograd runs the adapter
branch first (it was recorded last) and frees what lora_A saved with it, so the product is gone, like a
private copy, by the moment the gated product's gradients are made, and by the moment the base's backward
dequantizes its weight (simulate: Llama-2-13b QLoRA all-linear under ZeRO-2 and checkpointing, 3 x 2048
tokens: at the top layer's ``aten.add`` of the down projection's two input gradients, gate-out, SiLU-out and
up-out are live, the product is not).

Hand count, Llama-2-7B (hidden 4096, MLP width 11008), fp32 (4 B everywhere, adapters fp32 like their
input: no cast), rank 8 on the MLP, dropout 0:

* LoRA, the MLP's backward temporaries (down_adapter_backward): the gated product's three fp32 MLP-wide
  gradients, 3 x 4 x 11008, less the released product, 4 x 11008: 8 x 11008 = 88,064 per token (above
  lora_A's moment, its input's gradient, 4 x 11008), beside the residual's incoming gradient, 4 x 4096
  (layer_saved.residual_grads); before this mechanism 12 x 11008 = 132,096;
* QLoRA (4-bit base, fp32 compute, fp32 adapters: no cast, 4 B everywhere): the down
  projection's dequantized weight, 4 x 4096 x 11008 B, beside the residual gradient (4 x 4096), the
  adapter's and the base's input gradients (2 x 4 x 11008) less lora_B's saved rank-wide input (8 x 4)
  and the product (4 x 11008): 16,384 + 44,032 - 32 = 60,384 per token (104,416 before this
  mechanism)."""

from __future__ import annotations

from tuneplan.api import build_setup, resolve_run
from tuneplan.catalog.models import resolve_model
from tuneplan.estimator.activations import layer_activations
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.quant_kernels import bnb_backward_dequant
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.profiles import get_profile, resolve_setup

LLAMA = "meta-llama/Llama-2-7b-hf"
HIDDEN, MLP = 4096, 11008


def test_the_product_lora_a_alone_keeps_is_released_before_the_gated_products_gradients() -> None:
    spec = resolve_model(LLAMA, allow_network=False)
    s = resolve_setup(build_setup(spec, method="lora", seq=512, batch=1, targets="mlp", precision="fp32",
                                  dropout=0.0), spec)
    dt = resolve_dtypes(s, get_profile("hf"))
    acts = layer_activations(spec, spec.layer_groups[0][0], s, dt, resolve_targets(spec, s.targets), False,
                             "sdpa", True)
    assert acts.backward_temp == 8 * MLP + 4 * HIDDEN  # 88,064 + 16,384


def test_the_product_is_gone_when_bitsandbytes_dequantizes_the_down_projection() -> None:
    spec = resolve_model(LLAMA, allow_network=False)
    run = resolve_run(spec, build_setup(spec, method="qlora", precision="fp32", framework="hf", batch=1,
                                        seq=512, bits=4, quant_type="nf4", rank=8, targets="mlp",
                                        dropout=0.0))
    fixed, per_token = bnb_backward_dequant(run.model, run.setup, run.profile, run.dtypes, run.targets)
    assert fixed == 4 * HIDDEN * MLP
    assert per_token == 4 * HIDDEN + 2 * 4 * MLP - 8 * 4 - 4 * MLP  # 60,384
