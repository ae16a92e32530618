"""Gradients and optimizer states of the trainable parameters.

- torch AdamW keeps ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype (torch/optim/adamw.py,
  ``torch.zeros_like(p)``): 8 bytes per fp32 param, 4 per bf16 param (no fp32 master in pure bf16).
  The foreach implementation (``_multi_tensor_adamw``) allocates ``exp_avg_sq_sqrt = _foreach_sqrt(...)``,
  one state-sized temporary over the whole group; the fused kernel updates in place.
- transformers' own AdamW (transformers.optimization.AdamW, the Trainer's ``adamw_hf``, its default until
  huggingface/transformers#25109, 2023-07): a loop over parameters, ``denom = exp_avg_sq.sqrt().add_(eps)``
  one parameter at a time: the largest trainable tensor as the step's temporary.
- bitsandbytes 8-bit AdamW: two uint8 states with one fp32 absmax per block of 256
  (bitsandbytes/optim/optimizer.py, blockwise), tensors under 4096 elements keep 32-bit states
  (``min_8bit_size=4096``). Paged variants allocate the states in CUDA unified memory: outside PyTorch's
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

BNB_8BIT_BLOCK = 256
ALLOC_ROUND = 512  # PyTorch caching allocator rounds every block to 512 bytes (kMinBlockSize)


@dataclass(frozen=True)
class OptimizerPlan:
    states: int  # allocator-visible optimizer states
    paged: int  # states in unified memory (paged optimizers)
    temp: int  # peak temporaries of the step
    notes: tuple[str, ...] = ()


def optimizer_plan(name: str, trainable_params: int, param_bytes: int, tensors: int,
                   largest_tensor: int, factored_elems: int) -> OptimizerPlan:
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
        states_8bit = 2 * trainable_params + 2 * 4 * ceil_div(trainable_params, BNB_8BIT_BLOCK)
        if name == "paged-adamw-8bit":
            return OptimizerPlan(states=0, paged=states_8bit, temp=0,
                                 notes=("8-bit states are paged (unified memory)",))
        return OptimizerPlan(states=states_8bit, paged=0, temp=0)
    if name == "paged-adamw":
        return OptimizerPlan(states=0, paged=8 * trainable_params, temp=0,
                             notes=("fp32 states are paged (unified memory)",))
    if name == "adafactor":
        return OptimizerPlan(states=4 * factored_elems, paged=0, temp=3 * 4 * largest_tensor)
    if name == "sgd":
        return OptimizerPlan(states=0, paged=0, temp=0)
    raise ValueError(name)  # validated earlier in TrainSetup
