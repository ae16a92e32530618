"""simulate/qlora.py: the bitsandbytes Linear4bit stand-in holds the bytes bitsandbytes allocates, and
behaves as Linear4bit does for dtypes and shapes (no simulation run: single modules on the meta / CPU
device)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tuneplan.simulate.qlora import SimLinear4bit, replace_linears


def storage_bytes(m: SimLinear4bit) -> int:
    return sum(t.numel() * t.element_size() for t in [m.weight, *m.quant_tensors()])


def test_storage_of_a_qwen_mlp_weight_without_double_quant():
    # 18,944 x 3,584 = 67,895,296 weights (Qwen2.5-7B gate_proj): packed codes 2 per byte = 33,947,648 B;
    # the 16-entry fp32 NF4 code book 64 B; one fp32 absmax per 64-block: 1,060,864 x 4 = 4,243,456 B
    m = SimLinear4bit(3584, 18944, False, torch.bfloat16, torch.bfloat16, double_quant=False, device="meta")
    assert storage_bytes(m) == 33_947_648 + 64 + 4_243_456 == 38_191_168


def test_storage_with_double_quant():
    # absmax as uint8 (1,060,864 B), one fp32 absmax per 256 of them (ceil(1,060,864 / 256) = 4,144 x 4 B),
    # the fp32 256-entry code table (1,024 B) and the fp32 offset (4 B), beside codes and code book
    m = SimLinear4bit(3584, 18944, False, torch.bfloat16, torch.bfloat16, double_quant=True, device="meta")
    assert storage_bytes(m) == 33_947_648 + 64 + 1_060_864 + 16_576 + 1_024 + 4 == 35_026_180


def test_a_wider_quant_storage_holds_the_same_packed_bytes():
    # bnb_4bit_quant_storage=bfloat16 (FSDP-QLoRA): (n + 1) // (2 x 2) elements of 2 bytes
    u8 = SimLinear4bit(4096, 4096, False, torch.bfloat16, torch.bfloat16, True, device="meta")
    bf = SimLinear4bit(4096, 4096, False, torch.bfloat16, torch.bfloat16, True, device="meta",
                       quant_storage=torch.bfloat16)
    assert bf.weight.dtype == torch.bfloat16 and bf.weight.numel() == 4096 * 4096 // 4
    assert storage_bytes(bf) == storage_bytes(u8)
    assert not bf.weight.requires_grad  # frozen, as Params4bit


@pytest.mark.parametrize("tokens", [4, 40])  # the fused-kernel path (few rows) and the dequantize path
def test_forward_casts_back_to_the_input_dtype_and_backward_reaches_the_input(tokens):
    m = SimLinear4bit(8, 4, True, torch.bfloat16, torch.float32, double_quant=True)
    x = torch.zeros(1, tokens, 8, dtype=torch.float32, requires_grad=True)  # an fp32 residual stream
    out = m(x)
    assert out.dtype == torch.float32 and out.shape == (1, tokens, 4)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert m.bias.grad is not None and m.bias.grad.shape == (4,)
    assert m.weight.grad is None


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.ModuleDict({"q_proj": nn.Linear(8, 8, bias=True), "mlp": nn.Linear(8, 16)})
        self.lm_head = nn.Linear(8, 10)


def test_replace_linears_keeps_the_output_head():
    model = Tiny()
    made = replace_linears(model, torch.bfloat16, True)
    assert len(made) == 2 and all(isinstance(m, SimLinear4bit) for m in made)
    assert isinstance(model.block["q_proj"], SimLinear4bit) and model.block["q_proj"].bias is not None
    assert (model.block["mlp"].in_features, model.block["mlp"].out_features) == (8, 16)
    assert type(model.lm_head) is nn.Linear  # transformers' get_keys_to_not_convert leaves lm_head
