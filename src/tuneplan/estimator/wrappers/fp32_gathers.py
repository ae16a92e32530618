"""fsdp_qlora's fp32 gathers under autocast: Answer.AI's train.py with ``bf16_autocast`` / ``fp16_autocast``.

For its autocast precisions train.py builds FSDP1 with ``MixedPrecision(param_dtype=torch.float32, ...)``
and runs the forward under ``torch.cuda.amp.autocast`` (``fsdp_main``); an unquantized model (LoRA, full)
is loaded with ``torch_dtype=torch.float32`` and ``model.to(torch.float32)``. Such a run keeps the dtypes of a
single-GPU autocast run (``estimator.dtypes.resolve_dtypes`` does not fold it into 16 bits): the base and the
adapters are flattened, sharded and gathered in fp32, and autocast casts every gathered weight to 16 bits
for its matmul, the cast saved for the input gradient, unsharded (``memory_statics.autocast_copy_terms``:
not divided by the world size; autocast caches casts only of leaves that require grad,
``autocast_mode.cpp`` ``cached_cast``, and FSDP's views of a flat parameter are not leaves). Per GPU of a
world of N:

- each unit's all-gather output is fp32: twice its 16-bit size (:func:`gather_upcast`; QLoRA's 4-bit codes
  stored in bf16 ``bnb_4bit_quant_storage`` are cast to fp32 before the all-gather as well);
- the unsharded gradients are fp32 (:func:`unsharded_grad_bytes`);
- QLoRA keeps its 16-bit stored weights (bf16 non-quantized weights): only the output head, gathered in
  fp32, has a 16-bit cast saved (:func:`gathered_casts`); its gathered norms and embedding are fp32 all the
  same, so its residual stream and its 4-bit linears' outputs are fp32 (``estimator.dtypes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def gather_upcast(run: Run) -> int:
    """How many times its 16-bit size (``dtypes.compute``) a unit's all-gather output is: 2 under train.py's
    fp32 ``MixedPrecision`` (the module docstring; simulate: fsdp_qlora, Mistral-Nemo QLoRA); 1 for every
    other run."""
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


def gathered_casts(run: Run) -> int:
    """The 16-bit cast autocast makes of a QLoRA run's fp32-gathered output head (tied: the embedding),
    saved for the input gradient until the head's backward, unsharded; its 4-bit linears are dequantized by
    bitsandbytes, not cast by autocast (simulate: fsdp_qlora, Mistral-Nemo QLoRA). Other runs' casts are
    ``param_plan``'s, as on one GPU (the module docstring)."""
    if not run.setup.fsdp or gather_upcast(run) < 2 or run.setup.method != "qlora":
        return 0
    return (run.model.lm_head_params or run.model.embed_params) * run.dtypes.compute
