"""Dequantization scratch of quantized linears (estimator/quant_kernels.py), by hand for Llama 2 7B.

torchao NF4 ``get_original_weight``: int64 codes of both halves (4 + 4 B per element), their table
values (1 + 1), scaled halves (1 + 1), the stacked 16-bit weight (2) = 14 B per element; the largest
Llama 2 7B linear is gate/up/down, 4096 x 11008 = 45,088,768 elements -> 631,242,752 bytes.
"""

from __future__ import annotations

from tuneplan.estimator.quant_kernels import dequant_transient_bytes
from tuneplan.specs.model import model_from_config
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

from .conftest import LLAMA2_7B


def test_torchao_nf4_scratch_of_the_largest_linear() -> None:
    model = model_from_config(LLAMA2_7B)
    setup = TrainSetup(method="qlora", framework="torchtune")
    assert dequant_transient_bytes(model, setup, get_profile("torchtune")) == 14 * 4096 * 11008 == 631_242_752


def test_no_scratch_without_quantization_or_for_bitsandbytes_profiles() -> None:
    model = model_from_config(LLAMA2_7B)
    assert dequant_transient_bytes(model, TrainSetup(method="lora", framework="torchtune"),
                                   get_profile("torchtune")) == 0
    assert dequant_transient_bytes(model, TrainSetup(method="qlora"), get_profile("hf")) == 0
