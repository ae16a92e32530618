"""Gradients and optimizer states of the trainable parameters.

- torch AdamW keeps ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype (torch/optim/adamw.py,
  ``torch.zeros_like(p)``): 8 bytes per fp32 param, 4 per bf16 param (no fp32 master in pure bf16).
  The foreach implementation (``_multi_tensor_adamw``) allocates ``exp_avg_sq_sqrt = _foreach_sqrt(...)``,
  one state-sized temporary over the whole group; the fused kernel updates in place.
- transformers' own AdamW (transformers.optimization.AdamW, the Trainer's ``adamw_hf``, its default until
  huggingface/transformers#25109, 2023-07): a loop over parameters, ``denom = exp_avg_sq.sqrt().add_(eps)``
  one parameter at a time: the largest trainable tensor as the step's temporary.
- bitsandbytes 8-bit AdamW: per tensor, two uint8 states with one fp32 absmax per block of 256
  (bitsandbytes/optim/optimizer.py, ``Optimizer2State.init_state``, blockwise); a tensor under
  ``min_8bit_size`` = 4096 elements keeps two fp32 states whatever its dtype (the same ``init_state``), so
  the count is made tensor by tensor over ``ParamPlan.trainable_sizes`` (a LoRA B of 16 x 128 is 8 B per
  element, not 2). Paged variants allocate the states in CUDA unified memory: outside PyTorch's
  allocator, paged out under pressure instead of failing.
- bitsandbytes PagedAdamW (32-bit): fp32 states whatever the parameter dtype.
- Adafactor (transformers.optimization.Adafactor, beta1=None): factored second moment, one fp32 row and
  one fp32 column vector per 2-D tensor, full fp32 for 1-D; the step makes fp32 working copies of one
  parameter at a time (grad, update, param).
- SGD without momentum (torch default momentum=0): no state.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.estimator.xp import ceil_div
from tuneplan.specs.setup import TrainSetup

BNB_8BIT_BLOCK = 256  # bitsandbytes Optimizer2State.init_state: blockwise absmax per 256 elements
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit min_8bit_size default: smaller tensors stay 32-bit
ALLOC_ROUND = 512  # PyTorch caching allocator rounds every block to 512 bytes (kMinBlockSize)


@dataclass(frozen=True)
class OptimizerPlan:
    states: int  # allocator-visible optimizer states
    paged: int  # states in unified memory (paged optimizers)
    temp: int  # peak temporaries of the step
    notes: tuple[str, ...] = ()


def bnb_8bit_state_bytes(tensor_sizes: tuple[tuple[int, int], ...]) -> int:
    """Two-state bitsandbytes 8-bit optimizer (AdamW8bit, paged or not) over (elements, tensors) pairs."""
    total = 0
    for n, count in tensor_sizes:
        if n >= BNB_MIN_8BIT_SIZE:
            total += count * (2 * n + 2 * 4 * ceil_div(n, BNB_8BIT_BLOCK))
        else:
            total += count * 2 * 4 * n
    return total


def stepped_tensor_sizes(setup: TrainSetup, trainable_params: int,
                         sizes: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """(elements, tensors) the optimizer steps, summed over the ranks. DeepSpeed ZeRO hands it one flat fp32
    partition per rank (zero/stage_1_and_2.py sets each group's params to
    ``[single_partition_of_fp32_groups[i]]``; stage3.py steps ``fp32_partitioned_groups_flat``, sub-groups of
    up to 1e9 elements, each far above 4,096); FSDP hands it each
    parameter's part on the rank, about 1/N of it (FSDP2's DTensor local shard, FSDP1's 1-D view of the flat
    shard); otherwise it steps the parameters as they are (``sizes``, ``ParamPlan.trainable_sizes``)."""
    n = setup.world_size
    if setup.zero >= 1:
        return ((ceil_div(trainable_params, n), n),)
    if setup.fsdp and n > 1:
        return tuple((ceil_div(elements, n), count * n) for elements, count in sizes)
    return sizes


def adafactor_temp(largest_tensor: int, param_bytes: int) -> int:
    """Peak fp32 temporaries of transformers' ``Adafactor.step`` on its largest tensor of :math:`n` elements:
    ``update = (grad**2) + eps`` holds two (the square and the sum), ``_approx_sq_grad`` makes the next
    ``update`` while the old one is bound, and ``p_data_fp32.add_(-update)`` negates it into a third
    tensor beside it: :math:`2 \\cdot 4n`. A 16-bit parameter adds its fp32 gradient (``grad.float()``) and
    fp32 copy (``p_data_fp32 = p.float()``), held through the step: :math:`4 \\cdot 4n`; an fp32 one is
    stepped in place (simulate: Llama-3.1-70B full bf16_autocast, 2 x the fp32 embedding)."""
    return (2 + (2 if param_bytes < 4 else 0)) * 4 * largest_tensor


def optimizer_plan(name: str, trainable_params: int, param_bytes: int, tensors: int,
                   largest_tensor: int, factored_elems: int, *,
                   tensor_sizes: tuple[tuple[int, int], ...]) -> OptimizerPlan:
    """``tensor_sizes``: (elements, tensors) the optimizer steps, :func:`stepped_tensor_sizes`."""
    if trainable_params == 0:
        return OptimizerPlan(0, 0, 0)
    step_tensors = tensors * ALLOC_ROUND  # one device 'step' scalar per param (fused/capturable)
    adam_states = 2 * trainable_params * param_bytes  # exp_avg and exp_avg_sq
    if name == "adamw":
        return OptimizerPlan(states=adam_states, paged=0, temp=trainable_params * param_bytes)
    if name == "adamw-hf":
        return OptimizerPlan(states=adam_states, paged=0, temp=largest_tensor * param_bytes)
    if name == "adamw-fused":
        return OptimizerPlan(states=adam_states + step_tensors, paged=0, temp=0)
    if name in ("adamw-8bit", "paged-adamw-8bit"):
        states_8bit = bnb_8bit_state_bytes(tensor_sizes)
        if name == "paged-adamw-8bit":
            return OptimizerPlan(states=0, paged=states_8bit, temp=0,
                                 notes=("8-bit states are paged (unified memory)",))
        return OptimizerPlan(states=states_8bit, paged=0, temp=0)
    if name == "paged-adamw":
        return OptimizerPlan(states=0, paged=8 * trainable_params, temp=0,
                             notes=("fp32 states are paged (unified memory)",))
    if name == "adafactor":
        return OptimizerPlan(states=4 * factored_elems, paged=0,
                             temp=adafactor_temp(largest_tensor, param_bytes))
    if name == "sgd":
        return OptimizerPlan(states=0, paged=0, temp=0)
    raise ValueError(name)  # validated earlier in TrainSetup
