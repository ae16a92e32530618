"""Which dtype each tensor family has, for a setup under a profile.

The HF stack's real upcasts live here and nowhere else:
- ``-mixed`` precisions keep trainable parameters in fp32 (the master copy) and run under autocast;
- PEFT's ``prepare_model_for_kbit_training`` casts every non-quantized 16-bit parameter (embeddings,
  lm_head, norms, biases) to fp32, so the residual stream of a QLoRA model is fp32 and bitsandbytes
  casts each 4/8-bit linear's output back to that input dtype (``Linear4bit.forward: out.to(inp_dtype)``);
- PEFT keeps LoRA adapters in fp32 on a 16-bit base (``autocast_adapter_dtype=True``) and casts each
  adapter's input to that dtype, so under autocast every targeted module saves its own 16-bit copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.specs.load_precision import fsdp_mixed_precision
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class Dtypes:
    compute: int  # bytes of the matmul dtype (bf16/fp16 = 2, fp32 = 4)
    autocast: bool
    frozen_weight: int  # 16-bit or fp32 frozen base weights
    trainable: int  # trainable params (and their grads, AdamW states)
    adapter: int
    non_block: int  # embeddings / lm_head / norms when frozen (kbit upcast may make them fp32)
    residual: int  # residual stream between layers
    norm_out: int  # output of a norm (weight dtype promoted with the input)
    linear_out: int  # output of a regular (16-bit) linear
    quant_out: int  # output of a bitsandbytes linear (cast back to its input dtype)


def resolve_dtypes(setup: TrainSetup, prof: Profile) -> Dtypes:
    prec = setup.precision
    half = 4 if prec == "fp32" else 2
    # fsdp_qlora's train.py under its autocast precisions: an fp32 model, fp32 MixedPrecision gathers and
    # autocast, the dtypes of a one-GPU autocast run (wrappers/fp32_gathers.py); its QLoRA keeps bf16
    # weights (an fp32 stream only: below)
    fp32_gathers = (setup.fsdp and prof.fsdp_mixed_gathers_fp32 and prec.endswith("-mixed")
                    and setup.method != "qlora")
    if half == 2 and (setup.zero or setup.fsdp) and not fp32_gathers:
        # DeepSpeed casts the module to 16 bits (fp32 master lives in its optimizer); FSDP's MixedPrecision
        # policy unshards 16-bit parameters for compute. Either way the forward sees 16-bit weights: no fp32
        # residual stream, no autocast weight copies. Autocast itself runs under FSDP and not under
        # DeepSpeed: accelerate's Accelerator sets native_amp for fp16 and bf16 except with
        # DistributedType.DEEPSPEED, and prepare_model wraps the forward in autocast when native_amp
        # (accelerate 1.16 accelerator.py), so under FSDP layer_norm, softmax and pow still run in fp32.
        # Where accelerate sets no FSDP MixedPrecision (a pure 16-bit precision the profile runs without the
        # Trainer's bf16 / fp16: fsdp_mixed_precision), PEFT's fp32 adapters (autocast_adapter_dtype, cast
        # before FSDP wraps) are sharded, gathered and multiplied in fp32, as on one GPU.
        pure_fsdp_adapters = bool(setup.fsdp) and prof.adapter_fp32 and not fsdp_mixed_precision(setup, prof)
        # fsdp_qlora's QLoRA under its autocast precisions: the bf16-stored embedding and norm weights are
        # gathered in fp32 (``MixedPrecision(param_dtype=torch.float32)``), so the embedding's output, the
        # residual stream and RMSNorm's ``weight * hidden`` are fp32, and each 4-bit linear casts its bf16
        # matmul back to that fp32 input (bitsandbytes ``Linear4bit.forward``: ``out.to(inp_dtype)``)
        stream = 4 if (setup.fsdp and prof.fsdp_mixed_gathers_fp32 and prec.endswith("-mixed")) else 2
        return Dtypes(compute=2, autocast=bool(setup.fsdp and prof.autocast), frozen_weight=2, trainable=2,
                      adapter=4 if pure_fsdp_adapters else 2, non_block=2, residual=stream, norm_out=stream,
                      linear_out=2, quant_out=stream)
    mixed = prec.endswith("-mixed")
    # '-mixed' always means autocast; HF Trainer also autocasts a 16-bit model when bf16/fp16 is set.
    autocast = mixed or (prof.autocast and prec != "fp32")
    trainable = 4 if (prec == "fp32" or (mixed and prof.trainable_fp32_in_mixed)) else 2
    # A full fine-tune under a '-mixed' precision loads (or casts) the whole model in fp32.
    full_fp32 = setup.method in ("full",) and trainable == 4
    # Under quantization the precision plugin (bitsandbytes) sets the dtype of non-quantized params to the
    # compute dtype, so an fp32 base under '-mixed' only applies to unquantized methods.
    frozen = 4 if (prec == "fp32" or (mixed and prof.mixed_base_fp32 and setup.method != "qlora")) else 2
    # PEFT gives a new adapter its base layer's dtype (BaseTunerLayer._get_base_layer_device_and_dtype: a
    # bitsandbytes Linear4bit's compute_dtype), so a QLoRA adapter is 16-bit unless autocast_adapter_dtype
    # upcasts it (adapter_fp32); an fp32 base under '-mixed' (mixed_base_fp32) is never a quantized one
    fp32_base = mixed and prof.mixed_base_fp32 and setup.method != "qlora"
    adapter = 4 if (prec == "fp32" or prof.adapter_fp32 or fp32_base) else 2
    non_block = frozen
    if setup.method == "qlora" and prof.kbit_upcast_fp32:
        non_block = 4
    if full_fp32:
        non_block = 4
    residual = non_block if setup.method != "full" else (4 if full_fp32 else half)
    norm_out = max(residual, non_block if setup.method != "full" else trainable)
    linear_out = half if autocast else max(frozen if setup.method != "full" else trainable, residual)
    quant_out = norm_out  # bitsandbytes casts the output back to its input dtype
    return Dtypes(compute=half, autocast=autocast, frozen_weight=frozen, trainable=trainable, adapter=adapter,
                  non_block=non_block, residual=residual, norm_out=norm_out, linear_out=linear_out,
                  quant_out=quant_out)
