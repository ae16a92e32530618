"""A bitsandbytes ``Linear4bit`` stand-in that holds exactly the storage bitsandbytes allocates.

bitsandbytes cannot quantize fake tensors (its NF4 code book is a real tensor) and is not needed on a
CPU-only machine; this module reproduces what matters for memory (bitsandbytes ``nn/modules.py``
``Linear4bit``, ``autograd/_functions.py`` ``MatMul4Bit``, ``functional.py`` ``quantize_4bit``,
``backends/cuda/ops.py`` ``gemm_4bit``):

- storage: the packed weight, uint8 ``((n + 1) // 2, 1)`` (or the same bytes in ``bnb_4bit_quant_storage``);
  the 16-entry fp32 NF4 code book; without double quant one fp32 absmax per 64-block; with double quant a
  uint8 absmax per block, one fp32 absmax per 256 of those, the fp32 256-entry code table and the fp32
  offset (one allocation each, per weight; 18944 x 3584 comes to 35,026,180 B, or 38,191,168 B without
  double quant, as real bitsandbytes);
- ``Linear4bit.forward``: casts the input to the compute dtype, the bias too, runs ``MatMul4Bit`` and
  casts the output back to the input dtype (``.to(inp_dtype)``: an fp32 copy when the residual stream
  is fp32 after ``prepare_model_for_kbit_training``);
- ``MatMul4Bit`` saves no activation (``ctx.tensors = (None, B)``: only the quantized weight); its
  backward computes ``grad_output @ dequantize_4bit(W).t()``: a transient weight in the compute dtype
  (plus the dequantized fp32 absmax, twice while the offset is added, under double quant);
- the CUDA ``gemm_4bit`` forward dequantizes the same way and calls ``F.linear`` for the token counts of
  training (it keeps its fused kernel only for a handful of tokens: M <= 4 always, up to 16-256 tokens
  depending on the GPU generation): ``FUSED_GEMM_MAX_TOKENS``.

``SimLoraLinear4bit`` is PEFT's ``lora.bnb.Linear4bit`` forward (peft/tuners/lora/bnb.py): the base
output is cloned defensively, and without autocast the input is cast to the adapter dtype and the
adapter output back to the result dtype; under autocast the adapter reads the input as it is.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NF4_BLOCK = 64  # quantize_4bit blocksize
DQ_BLOCK = 256  # blocksize of the nested quantization of absmax
FUSED_GEMM_MAX_TOKENS = 16  # bnb gemm_4bit keeps its fused kernel below this many rows on most GPUs


class SimLinear4bit(nn.Module):
    """Quantized storage of one ``nn.Linear`` and bitsandbytes' forward/backward memory behaviour."""

    def __init__(self, in_features: int, out_features: int, bias: bool, compute_dtype: torch.dtype,
                 bias_dtype: torch.dtype, double_quant: bool, device: Any = None,
                 quant_storage: torch.dtype = torch.uint8) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # how PEFT reads a quantized linear's shape
        self.infeatures, self.outfeatures = in_features, out_features
        self.compute_dtype = compute_dtype
        n = in_features * out_features
        blocks = -(-n // NF4_BLOCK)
        # a frozen Parameter like bnb's Params4bit: the packed codes, uint8 by default; with
        # bnb_4bit_quant_storage a wider dtype holds the same bytes (functional.quantize_4bit:
        # ((n + 1) // (2 * itemsize), 1) elements), so that FSDP can flatten it with 16-bit weights
        per = 2 * torch.empty((), dtype=quant_storage).element_size()
        self.weight = nn.Parameter(torch.empty(((n + 1) // per, 1), dtype=quant_storage, device=device),
                                   requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device)) if bias else None
        self.double_quant = double_quant
        # QuantState.code: the 16-entry fp32 NF4/FP4 code book, one per weight (functional.get_4bit_type)
        self.code = torch.empty(16, dtype=torch.float32, device=device)
        if double_quant:
            self.absmax = torch.empty(blocks, dtype=torch.uint8, device=device)
            self.absmax2 = torch.empty(-(-blocks // DQ_BLOCK), dtype=torch.float32, device=device)
            self.code2 = torch.empty(256, dtype=torch.float32, device=device)
            self.offset = torch.empty((), dtype=torch.float32, device=device)
        else:
            self.absmax = torch.empty(blocks, dtype=torch.float32, device=device)

    def quant_tensors(self) -> list[torch.Tensor]:
        if self.double_quant:
            return [self.code, self.absmax, self.absmax2, self.code2, self.offset]
        return [self.code, self.absmax]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """``dequantize_4bit``: nested absmax first (fp32, then + offset), then the weight."""
        if self.double_quant:
            absmax = torch.empty(self.absmax.shape, dtype=torch.float32, device=self.weight.device)
            absmax = absmax + self.offset
        else:
            absmax = self.absmax
        w = torch.empty((self.out_features, self.in_features), dtype=dtype, device=self.weight.device)
        from tuneplan.simulate.kernels import _note

        _note("bitsandbytes dequantize_4bit: weight in compute dtype", w)
        del absmax
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        out = _MatMul4Bit.apply(x, self.weight, bias, self)
        return out.to(inp_dtype)


class _MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                mod: SimLinear4bit) -> torch.Tensor:
        ctx.mod = mod
        ctx.has_bias = bias is not None
        tokens = a.numel() // a.shape[-1]
        if tokens > FUSED_GEMM_MAX_TOKENS:
            wd = mod.dequantize(a.dtype)
            out = torch.nn.functional.linear(a, wd, bias)
            del wd
            return out
        out = torch.empty((*a.shape[:-1], mod.out_features), dtype=a.dtype, device=a.device)
        return out if bias is None else out + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, Any, None]:
        mod = ctx.mod
        grad_bias = (grad.sum(tuple(range(grad.dim() - 1))) if ctx.has_bias and ctx.needs_input_grad[2]
                     else None)
        grad_a = None
        if ctx.needs_input_grad[0]:
            wd = mod.dequantize(mod.compute_dtype).to(grad.dtype)
            grad_a = torch.matmul(grad, wd)
            del wd
        return grad_a, None, grad_bias, None


def replace_linears(model: nn.Module, compute_dtype: torch.dtype, double_quant: bool,
                    skip: tuple[str, ...] = ("lm_head",),
                    quant_storage: torch.dtype = torch.uint8) -> list[SimLinear4bit]:
    """Swap every ``nn.Linear`` and GPT-2-style ``Conv1D`` but the output head (``skip``: lm_head, or a
    classifier's last module) for the stand-in, as transformers' bitsandbytes integration does
    (``get_keys_to_not_convert``; ``replace_with_bnb_linear`` quantizes a Conv1D as a Linear4bit of its
    weight's (in, out) shape)."""
    from transformers.pytorch_utils import Conv1D

    made: list[SimLinear4bit] = []
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if any(full.endswith(s) for s in skip):
                continue
            if isinstance(child, Conv1D):
                d_in, d_out = child.weight.shape
            elif isinstance(child, nn.Linear):
                d_in, d_out = child.in_features, child.out_features
            else:
                continue
            q = SimLinear4bit(d_in, d_out, child.bias is not None, compute_dtype,
                              child.bias.dtype if child.bias is not None else compute_dtype, double_quant,
                              device=child.weight.device, quant_storage=quant_storage)
            setattr(mod, child_name, q)
            made.append(q)
    return made


def lora_class() -> type:
    """PEFT LoRA layer for the stand-in, built lazily (peft is an optional extra)."""
    from peft.tuners.lora.layer import LoraLayer

    class SimLoraLinear4bit(nn.Module, LoraLayer):
        def __init__(self, base_layer: nn.Module, adapter_name: str, **kwargs: Any) -> None:
            super().__init__()
            LoraLayer.__init__(self, base_layer)
            self.fan_in_fan_out = False
            self._active_adapter = adapter_name
            self.update_layer(adapter_name, kwargs.pop("r"), lora_alpha=kwargs.pop("lora_alpha"),
                              config=kwargs.pop("config"), **kwargs)

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result = self.base_layer(x, *args, **kwargs)
            result = result.clone()  # peft: "for 4bit, we need to defensively clone here"
            for active in self.active_adapters:
                if active not in self.lora_A.keys():
                    continue
                lora_a, lora_b = self.lora_A[active], self.lora_B[active]
                dropout, scaling = self.lora_dropout[active], self.scaling[active]
                convert = not torch.is_autocast_enabled("cpu")
                if convert:
                    expected = result.dtype
                    x = self._cast_input_dtype(x, lora_a.weight.dtype)
                output = lora_b(lora_a(dropout(x))) * scaling
                if convert:
                    output = output.to(expected)
                result = result + output
            return result

    return SimLoraLinear4bit
