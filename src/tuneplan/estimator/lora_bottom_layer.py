"""The bottom decoder layer's linears that a LoRA run without checkpointing leaves outside the autograd
graph: nothing below the bottom layer requires grad (the embedding is frozen and, without checkpointing,
no ``enable_input_require_grads``), so a frozen linear's output requires grad only when a LoRA target
upstream of it inside the layer does.

The data flow by what each linear reads (``Linear.reads``): ``attn_in`` (the normed layer input) never
requires grad; ``attn_core`` (the attention output) does when a query/key/value projection is targeted;
``mlp_in`` reads the layer input in a parallel block (Phi / GPT-J shared norm, GPT-NeoX
``use_parallel_residual``, Falcon ``parallel_attn`` or ``new_decoder_architecture``: transformers'
``FalconDecoderLayer.forward``, ``GPTNeoXLayer.forward``, ``PhiDecoderLayer.forward``) and the residual
after the attention otherwise, which requires grad when any attention linear is targeted; ``mlp_mid``
(the down projection's input) when an ``mlp_in`` linear is targeted or its input requires grad. A linear
outside the graph saves nothing, and DeepSpeed ZeRO-3 registers no backward fetch for it (its output
does not require grad: ``parameter_offload.py`` ``_post_forward_module_hook``)."""

from __future__ import annotations

from tuneplan.specs.model import LayerSpec, ModelSpec


def parallel_block(model: ModelSpec, spec: LayerSpec) -> bool:
    """Whether the layer's MLP reads the layer input rather than the residual after the attention."""
    config = model.config
    if model.model_type == "falcon":
        return bool(config.get("parallel_attn", True) or config.get("new_decoder_architecture"))
    if model.model_type == "gpt_neox":
        return bool(config.get("use_parallel_residual", True))
    return model.family == "gpt" and spec.n_norms == 1


def bottom_gradient_free(model: ModelSpec, targets: frozenset[str]) -> frozenset[str]:
    """Names of the bottom layer's linears whose input does not require grad in a LoRA run without
    checkpointing (module docstring); unknown ``reads`` are taken to require grad."""
    spec = model.layer_groups[0][0]
    hit = {r: any(m.name in targets for m in spec.linears if m.reads == r)
           for r in ("attn_in", "attn_core", "mlp_in")}
    grad = {"attn_in": False, "attn_core": hit["attn_in"]}
    grad["mlp_in"] = not parallel_block(model, spec) and (hit["attn_in"] or hit["attn_core"])
    grad["mlp_mid"] = grad["mlp_in"] or hit["mlp_in"]
    return frozenset(m.name for m in spec.linears if m.reads in grad and not grad[m.reads])


def bottom_gradient_free_params(model: ModelSpec, targets: frozenset[str]) -> int:
    """Elements of the linears of :func:`bottom_gradient_free`."""
    free = bottom_gradient_free(model, targets)
    return sum(m.params for m in model.layer_groups[0][0].linears if m.name in free)
