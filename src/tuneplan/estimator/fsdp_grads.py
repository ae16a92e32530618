"""Gradients FSDP keeps per GPU when a framework wraps frozen and trainable weights in one unit, and when
it accumulates gradients under ``no_sync``.

Two mechanisms of ``torch.distributed.fsdp.FullyShardedDataParallel`` (FSDP1, flat parameters), read
through profile switches (``tuneplan.specs.profiles``):

- Mixed frozen / trainable units. With ``use_orig_params=True`` (Lightning Fabric's ``FSDPStrategy`` sets
  it by default for torch >= 2.0), one FSDP unit may hold frozen and trainable parameters in one
  ``FlatParameter``; the flat parameter then requires grad and its gradient covers every parameter in it.
  PyTorch's FSDP docs: mixing them is supported "but we recommend not doing so since then the gradient
  memory usage will be higher than expected (namely, equivalent to not freezing those parameters)".
  LitGPT wraps each transformer ``Block`` as a unit (``auto_wrap_policy={Block}``), and its LoRA matrices
  live inside the block's linears, so a LoRA run carries gradients for every block weight. The root unit
  (embeddings, lm_head, final norm) holds only frozen parameters in a LoRA run and gets none.
- ``no_sync``. During gradient accumulation the reduce-scatter is skipped and FSDP accumulates the
  *unsharded* gradient of every unit (``FullyShardedDataParallel.no_sync`` docstring: gradients are
  accumulated "in unsharded form", which uses more memory). LitGPT runs every accumulating micro-batch
  under ``fabric.no_backward_sync(model, enabled=is_accumulating)`` (finetune/lora.py, finetune/full.py),
  which maps to ``no_sync`` for the FSDP strategy. Only the last micro-batch of a step reduce-scatters.

Together, a LitGPT FSDP LoRA run with gradient accumulation holds, on every GPU, a full-size gradient of
all block weights next to its weight shard: the per-GPU peak of the litgpt resource tables (e.g. Llama 2
7B LoRA on 2 GPUs above a single-GPU run) follows from this, with nothing fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneplan.estimator.dtypes import Dtypes
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup

# Training loops that run every accumulating micro-batch under ``accelerator.no_sync(model)``: transformers'
# Trainer (``_inner_training_loop``: no_sync unless ``sync_each_batch``, DeepSpeed, or the step's last
# micro-batch), and LLaMA-Factory, which trains through it (simulate: FSDP1 on a fake process group).
HF_TRAINER_LOOPS = ("hf", "llamafactory")


@dataclass(frozen=True)
class FsdpGrads:
    accumulating: int  # gradient bytes live on one GPU during an accumulating (no_sync) micro-batch
    synced: int  # gradient bytes on one GPU after the reduce-scatter (the optimizer step)


def fsdp_gradients(model: ModelSpec, setup: TrainSetup, prof: Profile, dt: Dtypes,
                   trainable_params: int, adapter_params: int) -> FsdpGrads | None:
    """Per-GPU gradient bytes under the profile's FSDP wrapping; None when the generic sharded model holds."""
    n = setup.world_size
    hf_loop = setup.framework in HF_TRAINER_LOOPS
    if not setup.fsdp or n < 2 or (setup.method == "qlora" and not hf_loop) or setup.offload != "none":
        return None
    accumulate_unsharded = prof.fsdp_accumulate_unsharded or hf_loop
    if not (prof.fsdp_mixed_unit_grads or accumulate_unsharded):
        return None
    if setup.method == "full":
        grad_params, grad_bytes = trainable_params, dt.trainable
    elif setup.is_lora and prof.fsdp_mixed_unit_grads:
        # every block's flat parameter requires grad: all block weights plus the adapters inside them
        grad_params, grad_bytes = model.params_layers + adapter_params, dt.frozen_weight
    else:
        grad_params, grad_bytes = trainable_params, dt.adapter if setup.is_lora else dt.trainable
    unsharded_bytes = grad_bytes
    if setup.fsdp_version == 2 and setup.precision.endswith("-mixed") and setup.method != "qlora":
        # accelerate's fsdp2_prepare_model upcasts the trainable parameters to fp32 (no Params4bit in the
        # model): their sharded gradients are fp32; the unsharded ones accumulated under
        # set_requires_gradient_sync(False) stay in the MixedPrecisionPolicy param dtype
        grad_bytes, unsharded_bytes = 4, dt.compute
    full = grad_params * grad_bytes
    synced = -(-full // n)
    accumulating = synced
    if setup.grad_accum > 1 and accumulate_unsharded:
        accumulating = grad_params * unsharded_bytes
    return FsdpGrads(accumulating=accumulating, synced=synced)
