"""bitsandbytes' 4-bit linear back-propagated to its input (``MatMul4Bit.backward``: the dequantized weight
beside the gradient it makes) after its PEFT adapter's backward, which autograd runs first (the adapter's
output is added after the base matmul): the adapter's private saved tensors are released by then. Hand count
on Llama-2-70B at 3 layers, QLoRA on the MLP in fp32 (no autocast), rank 32, LoRA dropout 0.05, the
fsdp-qlora profile on one GPU (simulate: the down projection's lora_dropout output, fp32, and its bool mask
are gone when the 939,524,096 B dequantized weight is made)."""

from __future__ import annotations

import sys
from pathlib import Path

from tuneplan.api import build_setup, resolve_run
from tuneplan.estimator.quant_kernels import bnb_backward_dequant

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from random_setups import reduced_model  # noqa: E402

HIDDEN, MLP = 8192, 28672


def test_the_adapters_dropout_copy_mask_and_mid_are_released() -> None:
    spec = reduced_model("meta-llama/Llama-2-70b-hf", 3)
    run = resolve_run(spec, build_setup(spec, method="qlora", precision="fp32", framework="fsdp-qlora",
                                        batch=1, seq=1024, bits=4, quant_type="fp4", rank=32, targets="mlp",
                                        dropout=0.05, attn="flash", num_labels=2))
    fixed, per_token = bnb_backward_dequant(run.model, run.setup, run.profile, run.dtypes, run.targets)
    # the down projection: the largest weight, dequantized in fp32
    assert fixed == 4 * HIDDEN * MLP
    incoming = 4 * HIDDEN  # the layer's residual gradient
    made = 2 * 4 * MLP  # the base's and the adapter's input gradients
    released = MLP * (4 + 1) + 32 * 4  # dropout(x) in fp32, its mask, lora_A's rank-wide output
    assert per_token == incoming + made - released
