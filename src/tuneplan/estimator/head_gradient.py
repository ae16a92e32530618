"""A trained untied lm_head's weight gradient made beside the gradient buffer it is added into.

The head is the step's largest linear (a 128k vocabulary x 4096 is 525 M elements); its backward is the
first after the loss. ``MmBackward`` (torch/csrc/autograd/generated/Functions.cpp ``mm_mat2_backward``)
returns the input's gradient ``dx`` (tokens x hidden) and the weight's ``dW = dlogits^T x`` (vocab x hidden)
as new tensors in the logits' dtype, the logits' gradient still live while it runs. Where ``.grad``
already exists (a later micro-batch of an accumulation, keep_grads' zeroed buffer; one GPU, DDP, ZeRO-1,
which keep ``param.grad``) ``AccumulateGrad`` adds the new gradient into it in place (torch/csrc/autograd/
functions/accumulate_grad.h ``accumulateGrad``: ``variable_grad += new_grad``), so it is a temporary beside
every buffer. Under autocast the weight the linear used is the fp32 master's 16-bit cast: its
``ToCopyBackward`` casts ``dW`` to fp32 (``_to_copy``), both copies live while it runs; the cast the ``mm``
saved was released with the ``MmBackward`` node just before, and so were the logits' gradients.

Two moments, the larger is the instant (b = bytes, c = compute dtype, m = the master's):

- the ``mm``: :math:`T V b_{logits} + T h c + V h c` beside every saved cast;
- autocast's weight cast: :math:`T h c + V h (c + m)` beside the casts less the head's.

(simulate: Meta-Llama-3-8B-Instruct at 4 layers, full bf16-mixed, two micro-batches of 2 x 256: 1.05 GB
bf16 + 2.1 GB fp32 at ``_to_copy``; Yi-1.5-6B at 3 layers fp32 under DDP: the 1.05 GB ``mm`` beside the
fp32 logits' gradient.) ZeRO-3's gathered head has its own instant (instants.head_backward_row); a fused
linear loss makes the weight's gradient chunk by chunk (not counted here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan.estimator.xp import maximum

if TYPE_CHECKING:
    from tuneplan.estimator.memory_statics import MemoryStatics
    from tuneplan.estimator.run import Run


def head_gradient_buffered(run: Run, statics: MemoryStatics) -> bool:
    """Whether a trained untied head's new weight gradient meets an existing ``.grad`` buffer: a full
    fine-tune's, with earlier micro-batches' gradients alive (``statics.grads_prev``), on one GPU, under DDP
    or ZeRO-1 (ZeRO-2/3 and FSDP move each gradient out at its hook), no optimizer in backward, no fused
    linear loss."""
    model, setup = run.model, run.setup
    return (setup.method == "full" and not model.tied_embeddings and model.lm_head_params > 0
            and bool(statics.grads_prev) and not setup.fsdp and setup.zero < 2
            and not setup.optimizer_in_backward and run.loss != "fused_linear")


def head_gradient_row(run: Run, statics: MemoryStatics, saved: Any, tokens: Any) -> tuple[Any, ...]:
    """The ``backward_head_gradient`` row (instants.InstantRow's order): the larger of the two moments of
    the module docstring, beside the earlier gradients and the saved activations."""
    dtypes, model = run.dtypes, run.model
    compute = dtypes.compute if dtypes.autocast else run.param_plan.trainable_bytes
    weight = model.lm_head_params
    dx = tokens * model.hidden * compute
    at_mm = statics.logit_bytes * tokens * statics.vocab + dx + weight * compute
    casts = statics.autocast_copies_backward
    if dtypes.autocast and compute != run.param_plan.trainable_bytes:
        # the head's saved cast is counted with the moment: released by the cast's, held by the mm's
        head_cast = run.param_plan.head_cast_bytes
        at_cast = dx + weight * (compute + run.param_plan.trainable_bytes)
        temp = maximum(at_mm + head_cast, at_cast)
        return (statics.earlier_grads, 0, saved, casts - head_cast, 0, temp, statics.gathered_at_loss)
    dlogits = statics.logit_bytes * tokens * statics.vocab
    return (statics.earlier_grads, 0, saved, casts, dlogits, at_mm - dlogits, statics.gathered_at_loss)


def head_gradient_in_layers(run: Run, statics: MemoryStatics) -> int:
    """Bytes of a trained untied head's weight gradient as a new ``.grad`` (no buffer before it: no
    accumulation, no keep_grads), made by the head's backward, the first after the loss, and kept through
    every layer's backward on one GPU, under DDP (``gradient_as_bucket_view=False``: ``.grad`` a tensor of
    its own beside its bucket) and ZeRO-1 (``param.grad`` reduced only at the accumulation boundary):
    :math:`V h b_{grad}`, which the top layer's row adds to the gradients it counts (the bottom row's, all
    of them, include it). 0 elsewhere (ZeRO-2/3 and FSDP move it out at its hook). simulate: pythia-6.9b at
    3 layers, full, ZeRO-1 over 2 GPUs, 2 x 2048, eager: the head's 413,138,944 B bf16 gradient live at
    the top layer's softmax backward."""
    model, setup = run.model, run.setup
    if (setup.method != "full" or model.tied_embeddings or not model.lm_head_params or statics.grads_prev
            or setup.fsdp or setup.zero >= 2 or setup.optimizer_in_backward or run.loss == "fused_linear"):
        return 0
    return model.lm_head_params * run.param_plan.trainable_bytes
