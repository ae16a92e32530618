"""ZeRO-1's lowest trained layer: its gradients are made as its activations are released.

DeepSpeed 0.19.8 ``DeepSpeedZeroOptimizer`` (stage_1_and_2.py) at stage 1, without ``overlap_comm``: a
gradient hook's ``process_gradients`` only allocates the IPG bucket (``setup_buckets``); the reduction
(``reduce_ready_partitions_and_remove_grads``) runs in hooks only when ``partition_gradients or
overlap_comm``, and otherwise at the accumulation boundary, after the backward (``engine.allreduce_gradients
-> reduce_gradients``). So every trained layer's gradient stays whole in ``param.grad`` (the module's dtype)
through the backward, and the lowest trained layer's own gradients, ``E`` bytes, are made as its saved
activations and scratch are released::

    bottom row = max(start: G - E + A + S,  end: G + max(A - E, 0) + ...)  (wrapper_rows.folded_layer_row)

with G every gradient and the bucket, A the layer's activations, S its scratch: where E exceeds A and S
the end is the larger moment (simulate: Llama-3-8B freeze fp32 over 2 GPUs, the peak at the lowest trained
layer's q_proj weight gradient, its activations all but gone). Where the attention's backward materialises
the scores' gradients (eager, SDPA's math path), its attention core is back-propagated with the layer's MLP
and o_proj weight gradients already made (fsdp1_bottom.attention_moment_elements, in the module's dtype)
beside its activations and the core's own scratch (wrapper_rows.fold_bottom_rows; simulate: falcon-40b
freeze fp32 over 8 GPUs, the peak at the lowest layer's softmax backward). Between them, its MLP's input
norm's backward, the MLP's weight gradients made (estimator/mlp_norm_moment.py).

Not under gradient accumulation (a later micro-batch adds into gradients that exist from its start), nor
where frozen layers below are back-propagated (wrappers/fsdp1_bottom.layers_below_back_propagated), nor on
one-layer models or LoRA (its adapters' gradients are small beside the layer's activations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.mlp_norm_moment import mlp_block_elements
from tuneplan.estimator.wrappers.base import TopLayer
from tuneplan.estimator.wrappers.fsdp1_bottom import attention_moment_elements, layers_below_back_propagated

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero1_bottom_layer(run: Run) -> TopLayer | None:
    """The lowest trained layer as a :class:`TopLayer` whose gradients (one decoder layer's parameters in
    the module's dtype, counted already) end its backward; None where it does not apply (module docstring)."""
    setup, model = run.setup, run.model
    if (setup.zero != 1 or setup.ds_overlap_comm or setup.method not in ("full", "freeze")
            or setup.grad_accum > 1 or model.n_layers < 2 or layers_below_back_propagated(run)):
        return None
    layer = model.params_layers // model.n_layers * run.dtypes.compute
    return TopLayer(counted=layer, gradients_at_end=layer, gathered=0, keeps_scratch=False,
                    gradients_at_attention=attention_moment_elements(run) * run.dtypes.compute,
                    attention_scratch_only=True,
                    gradients_at_mlp_norm=mlp_block_elements(model, setup) * run.dtypes.compute)
