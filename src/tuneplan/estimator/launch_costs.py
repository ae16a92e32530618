"""CPU cost of launching a training step's work in eager PyTorch: seconds per dispatched op, ops per counted
kernel, what FSDP / ZeRO-3 add per sharded unit, what an optimizer step dispatches, and the fixed cost of a
micro-batch. A GPU cannot work ahead of the CPU, so the time model takes the longer of these launches and
the kernels' work (``throughput.py``)."""

from __future__ import annotations

from tuneplan.specs.setup import TrainSetup

# CPU time per launched kernel in eager PyTorch (horace.io: the "overhead" regime). A GPU cannot work ahead
# of the CPU, so each class of kernels takes the longer of its launches and its execution (a per-kernel
# roofline): small micro-batches are launch-bound. Two factors:
# - every aten op passes Python, pybind, autograd recording and the dispatcher before any launch: ~5-25 us
#   of CPU work per op ("From PyTorch op to kernel launch", jiahuanglin.xyz GPU-kernel lessons, layer-by-layer
#   costs); OP_DISPATCH_SECONDS takes the middle, 15 us;
# - ops per kernel that compute.py counts: transformers' Llama decoder layer dispatches 219 aten ops in
#   forward + backward (LoRA q/v: 246; with checkpointing 338 / 373), views and metadata ops included,
#   against 82.5 / 102.5 / 115.5 / 143.5 kernels counted here: 2.4-2.9, mean 2.6 (counted by running the
#   model code under a TorchDispatchMode, tests/test_time_model.py::test_dispatched_ops_per_counted_kernel).
OP_DISPATCH_SECONDS = 15e-6
OPS_PER_KERNEL = 2.6
DISPATCH_SECONDS = OPS_PER_KERNEL * OP_DISPATCH_SECONDS
# FSDP / ZeRO-3 add CPU work per sharded unit (one decoder layer) per micro-batch: unshard / reshard,
# the views of the original parameters (use_orig_params), gradient padding, pre/post-divide and the copy
# into the sharded gradient. Counted as aten ops by running transformers' Llama wrapped per decoder layer
# in FSDP1 (world size 2, a fake process group, CPU) against the same model unwrapped, forward + backward:
# +93 ops per unit for a full fine-tune, +168 with LoRA q/v (the flat parameter mixes frozen and trained
# tensors), +204 with LoRA and checkpointing (tests/test_time_model.py::test_fsdp_ops_per_unit), at
# OP_DISPATCH_SECONDS each. A lower bound: FSDP's own Python between those ops (hooks, handle and stream
# bookkeeping) is not an aten op; timing the same comparison on a CPU (tiny shapes, so dispatch-bound)
# put FSDP's whole CPU cost at ~2x the plain layer's, which overshoots the published FSDP rows: the truth
# lies between. DeepSpeed ZeRO-3 hooks every submodule: the count is a lower bound there too.
FSDP_UNIT_OPS_FULL = 93
FSDP_UNIT_OPS_LORA = 168
FSDP_UNIT_OPS_LORA_CHECKPOINTED = 204
# The optimizer step launches its own kernels, once per step: a per-parameter loop dispatches a few ops for
# every trainable tensor, a foreach / fused implementation a few ops per chunk of tensors (PyTorch's
# multi_tensor_apply packs up to 36-110 tensors in one launch, by operand count; 48 taken). Counted from the
# implementations' ``step`` (dispatched aten ops, each at OP_DISPATCH_SECONDS):
# - transformers' AdamW (``adamw_hf``): mul_, add_, mul_, addcmul_, sqrt, add_, addcdiv_ per tensor: 7;
# - transformers' Adafactor (factored, no first moment): 28 per matrix (2 norms, the row / column means
#   and their moving averages, the rsqrt approximation, the clip by RMS), ~17 per vector: 22 taken;
# - bitsandbytes 8-bit / paged optimizers: one update kernel per tensor from a Python loop, with its ctypes
#   bookkeeping: 2;
# - torch AdamW foreach (the default on CUDA since 2.0): 9 foreach ops per chunk (step, weight decay, lerp,
#   mul, addcmul, sqrt, div, add, addcdiv); fused AdamW: 1 per chunk; SGD: 1 per chunk.
# The step takes the longer of these launches and its memory traffic (the per-kernel roofline). Sharded
# optimizers (ZeRO: one flat partition per group; FSDP: flat parameters per unit) launch few: left at 0.
OPTIMIZER_OPS_PER_TENSOR = {"adamw-hf": 7, "adafactor": 22, "adamw-8bit": 2, "paged-adamw-8bit": 2,
                            "paged-adamw": 2}
OPTIMIZER_OPS_PER_CHUNK = {"adamw": 9, "adamw-fused": 1, "sgd": 1}
FOREACH_TENSORS_PER_LAUNCH = 48
# Per-micro-batch fixed cost outside the layers: data loading to the GPU, loss bookkeeping, logging.
MICRO_BATCH_FIXED_SECONDS = 2e-3


def fsdp_unit_ops(setup: TrainSetup) -> int:
    """aten ops FSDP adds per sharded unit per micro-batch (forward + backward), see FSDP_UNIT_OPS_*."""
    if setup.method == "full":
        return FSDP_UNIT_OPS_FULL
    return FSDP_UNIT_OPS_LORA_CHECKPOINTED if setup.gradient_checkpointing else FSDP_UNIT_OPS_LORA


def optimizer_ops(name: str, tensors: int) -> int:
    """aten ops one optimizer step dispatches over ``tensors`` trainable tensors (see OPTIMIZER_OPS_*)."""
    if name in OPTIMIZER_OPS_PER_TENSOR:
        return OPTIMIZER_OPS_PER_TENSOR[name] * tensors
    return OPTIMIZER_OPS_PER_CHUNK.get(name, 0) * -(-tensors // FOREACH_TENSORS_PER_LAUNCH)
