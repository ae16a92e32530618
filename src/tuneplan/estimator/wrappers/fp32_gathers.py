"""fsdp_qlora's fp32 gathers under autocast: Answer.AI's train.py with ``bf16_autocast`` / ``fp16_autocast``.

For its autocast precisions train.py builds FSDP1 with ``MixedPrecision(param_dtype=torch.float32, ...)``
and runs the forward under ``torch.cuda.amp.autocast`` (``fsdp_main``); an unquantized model (LoRA, full)
is loaded with ``torch_dtype=torch.float32`` and ``model.to(torch.float32)``. Three consequences, per GPU
of a world of N:

- each unit's all-gather output is fp32: twice its 16-bit size (:func:`gather_upcast`; 4-bit codes stored
  in bf16 ``bnb_4bit_quant_storage`` are cast to fp32 before the all-gather as well);
- a LoRA run's frozen base is sharded in fp32: ``4 B x params / N``, twice the 16-bit weights
  (:func:`fp32_base_extra`);
- autocast casts every gathered fp32 weight to 16 bits for its matmul, and the matmul saves the cast for
  the input gradient (autocast caches casts only of leaves that require grad, ``autocast_mode.cpp``
  ``cached_cast``, and FSDP's views of a flat parameter are not leaves: the cast lives exactly as long as
  autograd keeps it). Without checkpointing every layer's casts stay from its forward to its backward:
  ``2 B x (block linear weights)``, unsharded, besides the output head's cast (:func:`gathered_casts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def gather_upcast(run: Run) -> int:
    """How many times its 16-bit storage a unit's all-gather output is: 2 under train.py's fp32
    ``MixedPrecision`` (the module docstring; simulate: fsdp_qlora, Mistral-Nemo QLoRA); 1 for every other
    run."""
    if (run.profile.fsdp_mixed_gathers_fp32 and run.setup.precision.endswith("-mixed")
            and run.dtypes.compute == 2):
        return 2
    return 1


def unsharded_grad_bytes(run: Run) -> int:
    """Bytes per element of a unit's unsharded gradient: autograd makes it in the dtype of the gathered
    parameter it flows into, the MixedPrecision param dtype: 16 bits under the '-mixed' precisions (fp32
    under train.py's fp32 policy: autocast's casts hand their 16-bit gradients back through ``_to_copy``'s
    backward in fp32; simulate: fsdp_qlora, Llama-3.1-70B full bf16_autocast), else the parameter's own
    dtype."""
    if run.setup.precision.endswith("-mixed"):
        return run.dtypes.compute * gather_upcast(run)
    return run.param_plan.trainable_bytes


def fp32_base_extra(run: Run) -> int:
    """Bytes a LoRA run's frozen base adds to its 16-bit count when the profile keeps it in fp32 under the
    '-mixed' precisions (``Profile.mixed_base_fp32``: train.py's fp32 load, Fabric's fp32 modules under
    bf16-mixed): the base is flattened and sharded as stored, so ``weight_bytes`` once more, before the
    sharding (simulate: fsdp_qlora, Yi-1.5-6B LoRA fp16_autocast)."""
    setup = run.setup
    if (setup.precision.endswith("-mixed") and setup.is_lora and setup.method != "qlora"
            and run.profile.mixed_base_fp32):
        return run.param_plan.weight_bytes
    return 0


def gathered_casts(run: Run) -> int:
    """The 16-bit casts autocast makes of fp32-gathered weights that autograd saves until the backward
    (the module docstring), unsharded: the output head's (tied: the embedding's) always, every block linear
    weight's too without gradient checkpointing (a checkpointed layer's forward saves nothing; its
    recomputation's casts live within its own backward). 4-bit codes are dequantized by bitsandbytes, not
    cast by autocast: a QLoRA run's linears add none (simulate: fsdp_qlora, Mistral-Nemo QLoRA for the head,
    Yi-1.5-6B LoRA fp16_autocast for the layers)."""
    if not run.setup.fsdp or gather_upcast(run) < 2:
        return 0
    model, compute = run.model, run.dtypes.compute
    casts = (model.lm_head_params or model.embed_params) * compute
    if not run.setup.gradient_checkpointing and run.setup.method != "qlora":
        casts += model.params_linear_weights * compute
    return casts
