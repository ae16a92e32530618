"""transformers 5's fused MoE expert stacks run ``torch._grouped_mm``, not ``F.linear``: what a layer's walk
(layer_walk.LayerWalk.linear) keeps of their inputs under ZeRO-3.

DeepSpeed 0.19.8 ``zero.Init`` (runtime/zero/partition_parameters.py) replaces ``torch.nn.functional.linear``
with ``zero3_linear_wrap`` -> ``LinearFunctionForZeroStage3`` (runtime/zero/linear.py), whose
``setup_context`` saves the input, the weight and the bias whenever the op is recorded: a frozen linear keeps
its input too. The experts of transformers 5 (integrations/moe.py ``_grouped_mm``, ``*Experts.forward``)
multiply the routed tokens by the 3-D stacks with ``torch._grouped_mm``, which the replacement does not
reach: its autograd formula (derivatives.yaml, one per input) keeps the input only for the stack's weight
gradient, so a frozen stack without an adapter keeps neither the gathered tokens nor the gated product, as
without ZeRO-3."""

from __future__ import annotations

from tuneplan.estimator.bnb_scope import fused_expert
from tuneplan.estimator.layer_walk import LayerWalk
from tuneplan.specs.model import Linear


def walk_linear(walk: LayerWalk, m: Linear, reads: str, share: float, weight_grad: bool) -> None:
    """``walk.linear`` for ``m`` reading ``reads`` on ``share`` copies of each token, except a fused expert
    stack whose weight takes no gradient and carries no adapter: under ZeRO-3 it is not DeepSpeed's
    linear, and it keeps nothing (module docstring; simulate: Mixtral-8x7B, 4 layers, LoRA on the
    attention in fp32 over 2 GPUs, 4 x 2048: each layer keeps the gate_up stack's output, SiLU's and the
    down stack's output, not its 16384 x 4096 gathered tokens nor its 16384 x 14336 gated product)."""
    stack = fused_expert(m, "hf" if walk.python_model_code else "")
    if (stack and walk.setup.zero == 3 and not walk.trainable and not weight_grad
            and m.name not in walk.targets and not walk.quantized):
        return
    walk.linear(m.name, reads, m.d_in, share, weight_grad)
