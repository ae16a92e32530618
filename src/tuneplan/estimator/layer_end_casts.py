"""Autocast's saved weight casts at the top layer's end without checkpointing.

A LoRA run with each adapter an FSDP unit of its own (:func:`top_layer_end_casts`):

Under autocast a frozen fp32 linear weight is cast to 16 bits on every forward, and the cast is saved for
the input-gradient matmul (autocast_mode.cpp ``cached_cast``; ``weights.linear_params``); it dies only with
that linear's backward. Where each adapter is an FSDP unit of its own (``wrappers/fsdp.fsdp_layers_gathered``,
PEFT's and fsdp_qlora train.py's ``get_wrapping_policy``) the next layer is prefetched when the top layer's
first adapter (forward order) starts its backward (FSDP1 ``_pre_backward_hook`` -> ``_prefetch_handle``).
Autograd runs the node recorded last first, and PEFT's ``lora.Linear.forward`` adds the adapter's output
after the base matmul, so at that moment the top layer's base linears up to and including its first
adapted one have not been back-propagated: their casts are live, beside every cast the layers below saved.
With :math:`C_\\ell = \\sum_m n_m d_{in} d_{out} b_{compute}` one layer's casts, :math:`C_{top}^{\\le t}`
the top layer's up to its first target and :math:`U` the bottom layer's unsaved casts
(``weights.bottom_casts_unsaved``)::

    casts at the top layer's end = sum_{layers} C_l - U - C_top + C_top^{<= t}

(simulate: fsdp_qlora, Mistral-7B LoRA on the MLP, fp16 autocast over fp32 weights, 3 layers: layer 0's
down_proj, layer 1's seven and the top layer's q, k, v, o and gate_proj casts live at the peak). The fp32
adapters' own casts (a few MiB) are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuneplan.estimator.bnb_scope import quantized
from tuneplan.estimator.weights import bottom_casts_unsaved
from tuneplan.estimator.wrappers.fp32_gathers import gather_upcast
from tuneplan.estimator.xp import ceil_div, maximum, minimum
from tuneplan.specs.model import LayerSpec, Linear

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def _cast(m: Linear, run: Run) -> int:
    """Elements of ``m``'s weight autocast casts and saves (``weights.linear_params``' frozen branch)."""
    if run.setup.quant_bits and quantized(m, run.profile.model_code):
        return 0
    if m.role == "expert" and not quantized(m, run.profile.model_code):
        return 0  # transformers' fused experts are not cast (weights.linear_params)
    return m.count * m.d_in * m.d_out


def _layer_casts(spec: LayerSpec, run: Run, to_first_target: bool) -> int:
    """One layer's cast elements: all of them, or those up to and including its first adapted linear."""
    total = 0
    for m in spec.linears:
        total += _cast(m, run)
        if to_first_target and m.name in run.targets:
            break
    return total


def top_layer_end_casts(run: Run) -> int:
    """Bytes of the casts live at the top layer's end (the module docstring), per GPU; 0 where no cast is
    saved (checkpointing, 16-bit or quantized weights, no autocast) or the model has one layer."""
    model, setup, dtypes = run.model, run.setup, run.dtypes
    frozen = dtypes.non_block if setup.quant_bits else dtypes.frozen_weight
    if (setup.method not in ("lora", "qlora") or setup.gradient_checkpointing or not dtypes.autocast
            or frozen != 4 or model.n_layers < 2):
        return 0
    every = sum(count * _layer_casts(spec, run, False) for spec, count in model.layer_groups)
    top = model.layer_groups[-1][0]
    live = (every - _layer_casts(top, run, False) + _layer_casts(top, run, True)) * dtypes.compute
    live -= bottom_casts_unsaved(model, setup, dtypes, run.targets)
    # a wrapper that shards the parameters casts only its shard, unless it gathers them in fp32
    # (memory_statics.autocast_copy_terms)
    if run.wrapper.shards_parameters and not (setup.fsdp and gather_upcast(run) > 1):
        live = ceil_div(live, setup.world_size)
    return max(live, 0)


def head_and_top_layer_casts(run: Run) -> tuple[int, int]:
    """(the lm_head's cast, the top layer's casts) of autocast's saved copies, per GPU, without
    checkpointing (0, 0 under it: the first forward saves no layer's cast). The head's is released by the
    head's backward, before the top layer's (its input-gradient matmul is the cast's last use); each of the
    top layer's is released by its linear's backward, which makes that weight's gradient: at the top layer's
    end its casts are gone, its gradients made (``instants.layer_backward_rows``; simulate: fsdp_qlora,
    Llama-2-70b full bf16-mixed, 2 layers: at the top layer's flat-gradient cat only layer 0's casts are
    live). Sharded as ``memory_statics.autocast_copy_terms`` shards every cast."""
    setup, params = run.setup, run.param_plan
    if setup.gradient_checkpointing or not params.autocast_copy_bytes:
        return 0, 0
    head, top = params.head_cast_bytes, params.top_layer_cast_bytes
    if run.wrapper.shards_parameters and not (setup.fsdp and gather_upcast(run) > 1):
        head, top = ceil_div(head, setup.world_size), ceil_div(top, setup.world_size)
    return head, top


def top_layer_row_casts(casts: Any, head_top: tuple[int, int], left: Any) -> Any:
    """The casts of the top layer's backward row (``instants.layer_backward_rows``), the larger of its start
    and its end: every saved cast ``casts`` but the head's, less the top layer's own ones its gradients
    outweigh once its activations and scratch are counted as released (``left`` = E - min(A, E) - the
    scratch freed)::

        casts - C_head - min(C_top, max(left, 0))"""
    head, top = head_top
    return casts - head - minimum(top, maximum(left, 0))
