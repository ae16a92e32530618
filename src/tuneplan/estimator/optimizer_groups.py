"""The optimizer's parameter groups and the order it steps their tensors, where they decide its
temporaries.

``Trainer.create_optimizer`` (profile ``trainer_param_groups``) makes two groups: every trainable tensor but
biases and norms (``get_decay_parameter_names``), then the rest, each in ``named_parameters()`` order. A
recipe that steps ``model.parameters()`` makes one.

torch's AdamW with ``foreach`` (``_multi_tensor_adamw``) makes ``exp_avg_sq.sqrt()`` for a whole group at
once (``torch._foreach_sqrt``): its temporary is the largest group, the weight-decay one,
:math:`(P - P_{nd}) b` with :math:`P_{nd}` the biases' and norms' elements (:func:`no_decay_elements`).

transformers' ``Adafactor.step`` walks its tensors in order: the update of the tensor stepped before is
still bound while the next tensor's first temporaries are made.

transformers 5, optimization.py ``Adafactor.step``: each iteration of ``for p in group["params"]`` ends
with ``update`` bound to that tensor's fp32 update (``_approx_sq_grad``'s product, or ``exp_avg_sq.rsqrt()``
unfactored); the next iteration's ``update = (grad**2) + eps`` makes the square and the sum before the
name is rebound, so beside them lies the previous tensor's update. ``grad`` and ``p_data_fp32`` are rebound
to the new tensor (``p.grad``, ``p``) before their fp32 copies are made, which frees the previous ones.
With :math:`n_i` the tensors in the order the optimizer steps them, :math:`k = 2` for fp32 parameters (the
square and the sum) and :math:`k = 4` for 16-bit ones (their fp32 gradient and parameter copies beside
them), the step's temporaries peak at

.. math::  T = 4 \\max_i (k n_i + n_{i-1}),\\quad n_0 = 0

In the Trainer's weight-decay group the layers' linears follow one another across layers and the head
follows the last layer's; one group walks each layer's norms after its linears, which end the chain at each
layer (simulate: Mistral-7B full bf16, the head's square and sum beside the last ``down_proj``'s update
under the Trainer's groups, none under one group; Llama-3.1-70B freeze at 2 layers, fp32 trained layers:
``up_proj``'s square and sum beside ``gate_proj``'s update, 3 x 939,524,096 bytes).
"""

from __future__ import annotations

from dataclasses import replace

from tuneplan.estimator.optimizer import OptimizerPlan
from tuneplan.estimator.run import Run
from tuneplan.estimator.wrappers.reduce_buckets import layer_tensors
from tuneplan.estimator.wrappers.zero12_reductions import trained_layers


def stepped_order(run: Run) -> list[int]:
    """The elements of the tensors the optimizer steps, in its order, for a full or freeze fine-tune (the
    token embedding, each layer's linears, an untied head; a freeze run's trained layers' linears), a
    layer's norms as one small entry where the optimizer walks them between the layers (one group); [] where
    the order is not known (another method, or tensors that do not add up to the trainable parameters)."""
    model, setup = run.model, run.setup
    if setup.method not in ("full", "freeze"):
        return []
    layers = trained_layers(model, setup)
    tensors = [layer_tensors(spec, transformers_code=run.profile.model_code == "hf") for spec in layers]
    grouped = run.profile.trainer_param_groups
    order = [n for layer in tensors for n in (layer[:-1] if grouped else layer) if n]
    rest = sum(layer[-1] for layer in tensors) if grouped else 0  # the norms, in the second group
    if setup.method == "full":
        head = [model.lm_head_params] if model.lm_head_params else []
        final_norm = [] if grouped else [model.final_norm_params]
        order = [model.embed_params, *order, *final_norm, *head]
        rest += model.final_norm_params if grouped else 0
    return order if sum(order) + rest == run.param_plan.trainable_params else []


def adafactor_step_temp(run: Run, param_bytes: int) -> int | None:
    """:math:`T` of the module docstring in bytes; None where the order is not known."""
    order = stepped_order(run)
    if not order:
        return None
    k = 2 if param_bytes >= 4 else 4
    return 4 * max(k * n + previous for n, previous in zip(order, [0, *order[:-1]], strict=True))


def no_decay_elements(run: Run) -> int:
    """Elements of the trainable biases and norms (the Trainer's second group) of a full or freeze fine-tune:
    the trained layers' norms and linear biases, and a full one's final norm; 0 for adapters (no bias, no
    norm: all in the weight-decay group)."""
    model, setup = run.model, run.setup
    if setup.method not in ("full", "freeze"):
        return 0
    layers = trained_layers(model, setup)
    biases = sum(m.d_out * m.count for spec in layers for m in spec.linears if m.bias)
    norms = sum(spec.norm_params for spec in layers)
    return biases + norms + (model.final_norm_params if setup.method == "full" else 0)


def grouped_optimizer_temp(run: Run, optimizer: OptimizerPlan) -> OptimizerPlan:
    """``optimizer`` with the temporaries its parameter groups and their order make, where the run steps
    whole tensors (optimizer_groups.py): Adafactor's in its tensor order, foreach AdamW's over the Trainer's
    weight-decay group."""
    params = run.param_plan
    if run.optimizer == "adafactor":
        temp = adafactor_step_temp(run, params.trainable_bytes)
        return optimizer if temp is None else replace(optimizer, temp=temp)
    if run.optimizer == "adamw" and run.profile.trainer_param_groups:
        decay = params.trainable_params - no_decay_elements(run)
        return replace(optimizer, temp=max(decay, params.trainable_params - decay) * params.trainable_bytes)
    return optimizer
