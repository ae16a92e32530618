"""DeepSpeed ZeRO-1/2's flat 16-bit group made inside ``deepspeed.initialize``: an instant before the first
step, every module parameter beside a contiguous copy of the trained ones.

``DeepSpeedZeroOptimizer.__init__`` (runtime/zero/stage_1_and_2.py, DeepSpeed 0.19.8) walks the optimizer's
parameter groups, the module already cast and on the GPU (``DeepSpeedEngine._configure_distributed_model``).
For group :math:`i` it measures the flat buffer, ``aligned_numel`` elements: the group's trained elements
rounded up to ``alignment = nccl_start_alignment_factor (2) x world_size`` (``parameter_alignment`` is off
by default: no per-parameter padding), in the group's dtype. When the accelerator's free memory holds that
buffer (``flatten_on_accelerator``) it flattens there, ``flatten_dense_tensors_aligned``: one ``cat`` of the
group's parameters (and the alignment's zero pad) while every parameter is still its own tensor; only then
does ``_update_model_bit16_weights`` make the parameters views into the buffer, freeing the originals.
Nothing of the step exists yet; the fp32 master partition of a group is cloned after its flatten.

The Trainer's optimizer and DeepSpeed's CPU Adam under offload each hand one group of every trained
parameter, so with :math:`W` the module's parameters on the GPU (the analytic ``weights`` and adapters, with
the quantization metadata), :math:`P` the trained elements, :math:`N` the ranks and :math:`b` the trained
parameters' bytes in DeepSpeed's dtype,

.. math::  M_\\text{flatten} = W + b \\cdot 2N \\lceil P / 2N \\rceil

Where the GPU lacks the room DeepSpeed moves the parameters to the host and flattens there (the GPU then
never holds both); the estimate assumes the room, as the card that trains the run usually has it (and as
the simulation, whose accelerator is the host, always does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.xp import ceil_div

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


# stage_1_and_2.py ``nccl_start_alignment_factor``: all-gather send buffers aligned to 4 bytes of fp16
NCCL_START_ALIGNMENT = 2


def zero12_flatten_bytes(run: Run, module_bytes: int) -> int:
    """:math:`M_\\text{flatten}` (module docstring) in bytes, ``module_bytes`` the module's parameters on
    this GPU as DeepSpeed keeps them (:math:`W`); 0 outside ZeRO-1/2 or with nothing trained."""
    setup, params = run.setup, run.param_plan
    if setup.zero not in (1, 2) or not params.trainable_params:
        return 0
    alignment = NCCL_START_ALIGNMENT * setup.world_size
    aligned = ceil_div(params.trainable_params, alignment) * alignment
    # the trained parameters' dtype once the engine has cast the module (16 bits under bf16 / fp16)
    element = min(params.trainable_bytes, run.dtypes.compute)
    return module_bytes + params.quant_meta_bytes + aligned * element
