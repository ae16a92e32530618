"""Dequantization scratch of quantized linears (estimator/quant_kernels.py), by hand for Llama 2 7B.

torchao NF4 ``get_original_weight``: int64 codes of both halves (4 + 4 B per element), their table
values (1 + 1), scaled halves (1 + 1), the stacked 16-bit weight (2) = 14 B per element; the largest
Llama 2 7B linear is gate/up/down, 4096 x 11008 = 45,088,768 elements -> 631,242,752 bytes.
"""

from __future__ import annotations

from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.quant_kernels import bnb_backward_dequant, dequant_transient_bytes
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


def test_bitsandbytes_backward_dequant_of_the_largest_linear_by_hand() -> None:
    """Llama 2 7B QLoRA, HF profile, bf16-mixed: the largest 4-bit linears are gate/up/down (4096 x 11008;
    on the tie the down projection, whose input is the widest). Its backward holds the dequantized bf16
    weight (2 x 4096 x 11008 B) and, per token, the fp32 residual gradient (4 x 4096; QLoRA's kbit upcast
    keeps the residual stream fp32), the bf16 input gradient being made (2 x 11008; down_proj is not a LoRA
    target by default: q_proj and v_proj are), and the output gradient cast from the fp32 output to bf16
    (2 x 4096)."""
    model = model_from_config(LLAMA2_7B)
    setup = TrainSetup(method="qlora", precision="bf16-mixed")
    prof = get_profile("hf")
    dtypes = resolve_dtypes(setup, prof)
    fixed, per_token = bnb_backward_dequant(model, setup, prof, dtypes, frozenset({"q_proj", "v_proj"}))
    assert fixed == 2 * 4096 * 11008 == 90_177_536
    assert per_token == 4 * 4096 + 2 * 11008 + 2 * 4096 == 46_592
    # an adapter on the down projection has made its own input gradient first (one more 2 x 11008), and its
    # backward has released what the adapter saved for itself: the 16-bit input copy lora_A reads under
    # autocast over fp32 adapters (2 x 11008) and lora_A's rank-wide output (2 x 16; no dropout by default):
    down = per_token + 2 * 11008 - (2 * 11008 + 2 * 16)
    assert down == 46_560
    # so the gate / up projections (same weight, 46,592 bytes a token) stay the largest
    _, adapted = bnb_backward_dequant(model, setup, prof, dtypes, frozenset({"down_proj"}))
    assert adapted == max(down, per_token) == 46_592


def test_no_bitsandbytes_backward_dequant_elsewhere() -> None:
    """Not quantized, 8-bit, and torchao's NF4 (torchtune: its scratch is dequant_transient_bytes)."""
    model = model_from_config(LLAMA2_7B)
    prof = get_profile("hf")
    for setup, profile in ((TrainSetup(method="lora"), prof), (TrainSetup(method="qlora", bits=8), prof),
                           (TrainSetup(method="qlora", framework="torchtune"), get_profile("torchtune"))):
        dtypes = resolve_dtypes(setup, profile)
        assert bnb_backward_dequant(model, setup, profile, dtypes, frozenset({"q_proj"})) == (0, 0)
