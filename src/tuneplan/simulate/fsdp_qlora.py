"""Answer.AI's fsdp_qlora ``train.py`` (github.com/AnswerDotAI/fsdp_qlora, 05ed9f2) on the fake process group:
its FSDP1 wrapping, and the transformers 4.37-4.45 causal-LM loss its runs computed.

The model is built as for the other profiles (``simulate/build.py``: bf16 weights, every decoder linear a
4-bit stand-in stored in bf16 as ``Linear4bit(quant_storage=torch_dtype)``, the lm_head left, no fp32
upcast, PEFT LoRA in bf16, checkpointing per decoder layer, non-reentrant: train.py's default). Then:

- ``wrap_train_py``: ``FullyShardedDataParallel`` with train.py's arguments (``fsdp_main``): FULL_SHARD,
  ``auto_wrap_policy=_or_policy([leaf modules whose weight requires grad, the decoder layers])`` (decoder
  layers only for full fine-tuning), ``use_orig_params=False``, ``limit_all_gathers=True``, the default
  backward prefetch (BACKWARD_PRE), ``CPUOffload(offload_params=True)`` when offloading, no mixed-precision
  policy for bf16 / fp32 (``MixedPrecision`` in fp32 for the autocast precisions). ``sync_module_states``
  (``low_memory``) broadcasts at load time only and is left out.
- ``legacy_causal_lm_loss``: the model returns fp32 logits (``logits = logits.float()`` in
  ``LlamaForCausalLM.forward`` of transformers 4.37-4.45, which train.py's imports require) and the loss
  is ``CrossEntropyLoss`` on ``logits[..., :-1, :].contiguous()`` with the labels shifted alike.
- the loop keeps ``output`` (its fp32 logits) through backward and the optimizer step: train.py sets
  ``output = None`` only after the step (``simulate/step.py`` ``outputs_until_step``).
- gradient accumulation runs under ``model.no_sync()`` only with CPU offload (``train_py_no_sync``: train.py's
  ``no_sync`` defaults to False and is forced on for ``use_cpu_offload`` with accumulation); otherwise every
  micro-batch reduce-scatters and FSDP adds the shards.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from tuneplan.specs.setup import TrainSetup

TRAIN_PY = "torch FullyShardedDataParallel (FSDP1) as fsdp_qlora's train.py wraps it"
LAYER_CLASSES = ("LlamaDecoderLayer", "MistralDecoderLayer")  # train.py get_wrapping_policy / check_fn


def _trainable_leaf(module: nn.Module) -> bool:
    """train.py's ``lambda_policy_fn``: a module without children whose weight requires grad."""
    weight = getattr(module, "weight", None)
    return len(list(module.named_children())) == 0 and weight is not None and bool(weight.requires_grad)


def wrap_policy(model: nn.Module, full: bool) -> Any:
    from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

    layers = {type(m) for m in model.modules() if type(m).__name__ in LAYER_CLASSES}
    transformer = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers)
    if full:
        return transformer
    leaves = functools.partial(lambda_auto_wrap_policy, lambda_fn=_trainable_leaf)
    return functools.partial(_or_policy, policies=[leaves, transformer])


def wrap_train_py(model: nn.Module, setup: TrainSetup) -> nn.Module:
    """``FullyShardedDataParallel`` as train.py builds it (call inside FakeTensorMode)."""
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    mp = None
    if setup.precision.endswith("-mixed"):  # bf16_autocast / fp16_autocast
        mp = MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                auto_wrap_policy=wrap_policy(model, setup.method == "full"), use_orig_params=False,
                cpu_offload=CPUOffload(offload_params=True) if setup.offload != "none" else None,
                limit_all_gathers=True, device_id=torch.device("cpu"), sync_module_states=False,
                mixed_precision=mp)


def train_py_no_sync(setup: TrainSetup) -> bool:
    """Whether train.py runs the accumulating batches under ``model.no_sync()``: its ``no_sync`` argument
    defaults to False and ``fsdp_qlora()`` sets it for ``use_cpu_offload`` with
    ``gradient_accumulation_steps > 1`` (``fsdp_main``: ``sync_context = model.no_sync()`` when
    ``args['no_sync'] and not accumulate_grads``)."""
    return setup.offload != "none" and setup.grad_accum > 1


def _legacy_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, **_: Any) -> torch.Tensor:
    """transformers 4.37-4.45 ``LlamaForCausalLM.forward``: shift, contiguous copy, mean CrossEntropyLoss."""
    shift_logits = logits[..., :-1, :].contiguous().view(-1, vocab_size)
    shift_labels = labels[..., 1:].contiguous().view(-1).to(shift_logits.device)
    return nn.functional.cross_entropy(shift_logits, shift_labels)


def legacy_causal_lm_loss(model: nn.Module) -> None:
    """Give the causal LM inside ``model`` (under PEFT too) the 4.37-4.45 logits and loss."""
    for m in model.modules():
        head = getattr(m, "lm_head", None)
        if isinstance(head, nn.Module) and hasattr(type(m), "loss_function"):
            head.register_forward_hook(lambda _mod, _inp, out: out.float())
            m.loss_function = _legacy_loss
            return
