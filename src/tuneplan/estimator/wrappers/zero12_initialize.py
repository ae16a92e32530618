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
:math:`\\sum_{j<i} h_j + h_i + \\sum_{j \\ge i} f_j`, largest at (or near) the first cast parameter:

.. math::  M_\\text{init} = W_\\text{pre} + Q + h_\\text{first}

with :math:`W_\\text{pre}` every parameter as the script leaves it (the run's parameter plan under the
dtypes it has without DeepSpeed), :math:`Q` the quantization metadata (plain tensors, not cast), and
:math:`h_\\text{first}` the first cast parameter's 16-bit copy: the token embedding (``embed_tokens``,
the module's first parameter) when the non-block parameters are fp32, else a trained tensor (an adapter,
a trained layer's linear), bounded by the largest trainable tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.weights import param_plan

if TYPE_CHECKING:
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
    return pre.weight_bytes + pre.adapter_bytes + pre.quant_meta_bytes + first
