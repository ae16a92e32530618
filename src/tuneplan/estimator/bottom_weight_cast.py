"""The lowest trained layer's backward at its MLP's largest weight gradient, autocast over fp32 master
weights, on one GPU or under DDP (each ``.grad`` a tensor of its own), without accumulation.

``MmBackward0`` returns the weight's gradient ``dW`` in the compute dtype (torch autograd
``mm_mat2_backward``) and autocast's ``ToCopyBackward0`` casts it to the fp32 master's ``.grad``
(``_to_copy``): both are live while the cast runs. By then the MLP block has been back-propagated (its
saved tensors released but its input norm's and the input the linear reads), the attention block not: its
saved tensors, the 16-bit casts of its weights autocast saved for their input gradients
(``weight.to(bf16)`` kept by ``MmBackward0``) and none of its weight gradients::

    gradients   = G - n_attn m
    activations = A - A_mlp + (4 h + 4 + c h) t
    casts       = n_attn c
    scratch     = n_mlp c + b_res h t

with G every gradient (the bottom row's), n_attn the layer's attention weights, n_mlp its largest MLP
weight, m the master's bytes (4), c the compute dtype's, A the layer's activations, A_mlp what its MLP block
saved (``ActivationPlan.mlp_saved_bytes``), t the tokens. (simulate: phi-4 freeze at 4 layers, bf16-mixed,
1 x 512, eager: the peak at layer 2's gate_up_proj ``_to_copy``, its 367 MB bf16 gradient beside the 734 MB
fp32 one, the attention's 131 MB of weight casts and 110 MB of activations live.) The bottom row (the
larger of the layer's start and its end, memory_statics.bottom_own_gradients) misses this moment. Not
under checkpointing (the recomputed casts are counted apart), nor for MoE layers or LayerNorm models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan.estimator.saved_tensors import RSTD_BYTES

if TYPE_CHECKING:
    from tuneplan.estimator.activations import ActivationPlan
    from tuneplan.estimator.memory_statics import MemoryStatics
    from tuneplan.estimator.run import Run
    from tuneplan.specs.model import LayerSpec


def bottom_weight_cast_row(run: Run, statics: MemoryStatics, acts: ActivationPlan,
                           bottom: tuple[Any, ...]) -> tuple[Any, ...]:
    """The moment of the module docstring, from the bottom row ``bottom`` (its gradients G, what the loop
    holds, what is gathered), where :func:`bottom_weight_cast_applies` holds (statics.bottom_weight_cast)."""
    model, dtypes = run.model, run.dtypes
    master = run.param_plan.trainable_bytes
    spec = lowest_trained_layer(run)
    attn = sum(m.count * m.d_in * m.d_out for m in spec.linears if m.role == "attn")
    mlp = max((m.d_in * m.d_out for m in spec.linears if m.role == "mlp"), default=0)
    tokens, hidden, compute = acts.tokens, model.hidden, dtypes.compute
    kept = acts.top_layer_bytes - acts.mlp_saved_bytes + tokens * ((4 + compute) * hidden + RSTD_BYTES)
    scratch = mlp * compute + tokens * dtypes.residual * hidden
    return (bottom[0] - attn * master, 0, kept, attn * compute, bottom[4], scratch, bottom[6])


def lowest_trained_layer(run: Run) -> LayerSpec:
    """The spec of the lowest layer that trains (a freeze run's lowest unfrozen one)."""
    from tuneplan.estimator.memory_statics import layer_at

    model, setup = run.model, run.setup
    return layer_at(model, max(0, model.n_layers - setup.freeze_trainable_layers)
                    if setup.method == "freeze" else 0)


def bottom_weight_cast_applies(run: Run, statics: MemoryStatics) -> bool:
    """Whether the moment of the module docstring exists (resolved once per run, with the memory terms
    ``statics`` it reads): the bottom layer makes its own gradients, no checkpointing, no gradients from an
    earlier micro-batch, autocast over master weights wider than the compute dtype, RMSNorm, a full or
    freeze run, a dense lowest trained layer."""
    setup, model, dtypes = run.setup, run.model, run.dtypes
    return bool(statics.bottom_own_grads and not statics.checkpointed and not statics.grads_prev
                and dtypes.autocast and run.param_plan.trainable_bytes > dtypes.compute
                and model.norm_kind == "rms" and setup.method in ("full", "freeze")
                and not lowest_trained_layer(run).moe)
