"""The routed experts' output back-propagated: the gradients of its routing weights' product and of its
restored token order, beside one another, in a MoE layer's backward."""

from __future__ import annotations

from tuneplan.estimator.layer_walk import LayerWalk


def expert_output_backward(walk: LayerWalk) -> float:
    """Bytes per token of the routed experts' output gradients at their widest moment; 0 without routed
    experts, or under another model code than transformers' (``walk.python_model_code``).

    transformers 5 (integrations/moe.py ``grouped_mm_experts_forward``) ends the experts with
    ``weighted_out = proj_out * sample_weights_g.unsqueeze(-1)``, ``weighted_out[inv_perm]`` and
    ``.view(T, k, h).sum(dim=1)``, all S = T k rows of h features. Back-propagated, the sum's expanded
    gradient is copied whole by the view's backward (``clone``), ``IndexBackward`` makes the zeros it
    scatters into and the scattered gradient (``new_zeros``, ``index_put``: out of place on a tensor
    subclass, torch FunctionsManual.cpp ``index_backward``), and ``MulBackward0`` then makes the gradient
    of ``proj_out`` and the product with ``proj_out`` summed into the weights' gradient, beside the
    scattered one: three S x h tensors in the experts' output dtype at either moment::

        temp = 3 k h out_b  per token

    (simulate: Qwen3-30B-A3B QLoRA at 8192 tokens, k = 8, h = 2048: 3 x 268,435,456 B at the top layer's
    ``index_put``). Where the experts are wider than h, the gated product's gradients (3 k f out_b,
    layer_saved.down_adapter_backward) come later and are the larger."""
    spec = walk.spec
    if not walk.python_model_code or not any(m.role == "expert" for m in spec.linears):
        return 0.0
    return 3.0 * walk.output_bytes * spec.top_k * walk.model.hidden
