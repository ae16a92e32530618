"""DeepSpeed ZeRO-1/2's cast of the module to 16 bits inside ``deepspeed.initialize``: an instant before
the first step whose peak can exceed the whole step's.

The training script hands DeepSpeed a model that may hold fp32 parameters: PEFT's
``prepare_model_for_kbit_training`` (peft/utils/other.py) casts every non-quantized 16-bit parameter of a
QLoRA model to fp32 on the GPU (``param.data = param.data.to(torch.float32)``; a ``Params4bit`` is left
4-bit), ``get_peft_model(autocast_adapter_dtype=True)`` makes fp32 adapters, a full fine-tune under a
``-mixed`` precision loads in fp32, LLaMA-Factory upcasts the trained layers of a freeze run. With bf16 /
fp16 enabled, ``DeepSpeedEngine._configure_distributed_model`` (runtime/engine.py,
``_cast_module_mixed_precision``, DeepSpeed 0.19) then casts parameter by parameter in module order,
``p.data = p.data.to(param_dtype)`` for every floating parameter not in the 16-bit dtype (the uint8 4-bit
codes are not castable and stay as they are): the 16-bit copy is made while its fp32 source is still
alive, and only then ``module.to(device)``. Where that cast runs is where the model is: a bitsandbytes
model is on the GPU from its load (transformers ``Bnb4BitHfQuantizer.update_device_map``: no device_map
means the current CUDA device), so a QLoRA run casts on the GPU; any other model stays on the host until
then (``Trainer.__init__``: ``place_model_on_device = False`` with DeepSpeed) and is cast there, then moved
in 16 bits: no instant on the GPU. Nothing of the step exists yet: no gradient, no optimizer state, no
workspace.

With :math:`f_j` and :math:`h_j` parameter :math:`j`'s bytes before and after the cast (equal when it is
not cast), the bytes live while parameter :math:`i` is cast are
:math:`\\sum_{j<i} h_j + h_i + \\sum_{j \\ge i} f_j`, so

.. math::  M_\\text{init} = W_\\text{pre} + Q + \\max_i \\Big(h_i - \\sum_{j<i} (f_j - h_j)\\Big)

with :math:`W_\\text{pre}` every parameter as the script leaves it (the run's parameter plan under the
dtypes it has without DeepSpeed) and :math:`Q` the quantization metadata (plain tensors, not cast). The
first cast parameter gives :math:`h_\\text{first}`: the token embedding (``embed_tokens``, the module's
first parameter) when the non-block parameters are fp32, else a trained tensor (an adapter, a trained
layer's linear), bounded by the largest trainable tensor. A later parameter wins when it is larger than
what the casts before it have freed: a MoE's fused expert stack (``gate_up_proj`` [E, 2f, h], not
quantized by bitsandbytes, fp32 after PEFT's kbit preparation: ``bnb_scope``) cast after the embedding
and the bottom layer's attention (module order, :func:`_cast_sequence`): Mixtral-8x7B's first
``gate_up_proj`` is 1.75 GiB in bf16 against the embedding's 0.24 GiB freed before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import expert_stack_bytes, fused_expert, quantized
from tuneplan.estimator.dtypes import Dtypes, resolve_dtypes
from tuneplan.estimator.fused_expert_lora import expert_stacks
from tuneplan.estimator.weights import lora_targets, param_plan

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tuneplan.estimator.run import Run


def zero12_initialize_bytes(run: Run) -> int:
    """:math:`M_\\text{init}` (module docstring), bytes on this GPU at the peak of DeepSpeed's 16-bit cast
    of the module; 0 when nothing is cast on the GPU (a 16-bit module, an fp32 run that DeepSpeed does not
    cast, a model that is cast on the host)."""
    setup, model = run.setup, run.model
    compute = run.dtypes.compute
    if setup.zero not in (1, 2) or compute != 2 or not setup.quant_bits:
        return 0
    plain = setup.replace(zero=0)  # the dtypes the training script leaves, before DeepSpeed casts
    before = resolve_dtypes(plain, run.profile)
    if setup.method == "full":
        embedding_fp32 = before.trainable > compute
    else:
        embedding_fp32 = before.non_block > compute
    trained_fp32 = (before.adapter if setup.is_lora else before.trainable) > compute
    if not (embedding_fp32 or trained_fp32):
        return 0
    pre = param_plan(model, plain, before, quant_lm_head=run.profile.quantizes_lm_head)
    if embedding_fp32:
        first = model.vocab * model.hidden * compute
    else:
        first = pre.largest_trainable_tensor * compute
    later = _largest_later_cast(run, before) if setup.is_lora else 0
    return pre.weight_bytes + pre.adapter_bytes + pre.quant_meta_bytes + max(first, later)


def _largest_later_cast(run: Run, before: Dtypes) -> int:
    """:math:`\\max_i (h_i - \\sum_{j<i} (f_j - h_j))` (module docstring) over the parameters
    :func:`_cast_sequence` walks, 0 when none is cast."""
    best = freed = 0
    for f, h in _cast_sequence(run, before):
        if f > h:
            best = max(best, h - freed)
            freed += f - h
    return best


def _cast_sequence(run: Run, before: Dtypes) -> Iterator[tuple[int, int]]:
    """(bytes before, bytes after) of each parameter of a QLoRA model DeepSpeed's cast visits, in
    ``module.parameters()`` order: the token embedding, then each decoder layer as transformers registers
    it (``*DecoderLayer.__init__``: self_attn, mlp, then the layer's norms), where a bitsandbytes linear
    leaves its uint8 codes (not castable) and casts its bias and its LoRA factors (lora_A, lora_B after
    ``base_layer``); a linear bitsandbytes leaves alone (``bnb_scope``: routers, fused experts) is cast
    whole, the routed experts as their fused stacks ``gate_up_proj`` (the gate and up linears' rows) and
    ``down_proj`` (``*Experts.__init__``) ahead of their ParamWrapper factors. The final norm and lm_head
    come last, after every layer's casts: never the largest term, so not walked."""
    model, setup = run.model, run.setup
    compute = run.dtypes.compute
    code = run.profile.model_code
    targets = lora_targets(model, setup)
    kept = before.non_block  # the non-quantized parameters: upcast by PEFT's kbit preparation or not
    stack = expert_stack_bytes(setup.quant_bits, before)
    ratio = (before.adapter, compute)
    yield model.vocab * model.hidden * kept, model.vocab * model.hidden * compute
    for spec, count in model.layer_groups:
        for _ in range(count):
            fused_in = fused_out = 0
            for m in spec.linears:
                numel = m.count * m.d_in * m.d_out
                if fused_expert(m, code):  # one fused stack per side of the expert MLP
                    fused_in += numel if m.reads == "mlp_in" else 0
                    fused_out += numel if m.reads != "mlp_in" else 0
                    continue
                if not quantized(m, code):
                    yield numel * kept, numel * compute
                if m.bias:
                    yield m.count * m.d_out * kept, m.count * m.d_out * compute
                if m.name in targets:
                    yield from ((n * ratio[0], n * ratio[1])
                                for n in (m.count * setup.rank * m.d_in, m.count * setup.rank * m.d_out))
            yield from ((n * stack, n * compute) for n in (fused_in, fused_out) if n)
            for st in expert_stacks(spec, targets, setup.rank):
                width = st.rank * st.experts
                yield from ((n * ratio[0], n * ratio[1]) for n in (width * st.d_in, width * st.d_out))
            yield spec.norm_params * kept, spec.norm_params * compute
