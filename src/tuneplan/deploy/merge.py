"""From the trained adapter to a checkpoint to serve: memory to merge, and sizes on disk.

A LoRA adapter is merged with PEFT's ``merge_and_unload``: for each targeted linear ``W += scale * B @ A``.
``get_delta_weight`` forms ``B @ A`` in the adapter dtype (fp32 when PEFT upcast the adapters, as the hf
profile does) and the in-place add writes it into the 16-bit weight, so besides the model and the adapter
the merge holds, for the largest targeted matrix, the product and its scaled copy in that dtype.
Two paths after QLoRA (PEFT docs, "Merge LoRA weights into the base model" / ``merge_and_unload``):
- reload the base at 16 bits and merge: what is served is the 16-bit base plus the delta, although the
  adapter was trained against the 4-bit rounding of that base;
- dequantize-merge: load the 4-bit base as trained, dequantize it to 16 bits layer by layer (transformers
  ``model.dequantize()`` replaces each ``Linear4bit`` by an ``nn.Linear``), then merge: the served weights
  carry the rounding the adapter saw. Peak: the 16-bit model, the last quantized layer, adapter, temporaries.
Either way the merge runs on a 16-bit base, which needs more memory than the 4-bit training did.
A full (or freeze) fine-tune has nothing to merge: its checkpoint is saved in the trainable dtype (fp32
under a ``-mixed`` precision: ``Trainer.save_model`` writes the parameters as they are).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.estimator.weights import quant_bytes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

HALF = 2
DELTA_COPIES = 2  # B @ A, then the scaled tensor added in place (peft LoraLayer.get_delta_weight)


@dataclass(frozen=True)
class MergePlan:
    needed: bool
    path: str
    peak_bytes: int  # memory to run the merge (GPU or CPU RAM: the same tensors either way)
    base_16bit_bytes: int
    adapter_params: int
    adapter_bytes: int  # as trained and saved (PEFT saves the adapter in its dtype)
    temp_bytes: int
    quantized_base_bytes: int = 0  # QLoRA dequantize-merge: 4-bit storage of the largest layer still held
    checkpoint_bytes: int = 0  # what training leaves on disk: adapter only, or the full model
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def adapter_params(model: ModelSpec, setup: TrainSetup) -> tuple[int, int]:
    """(LoRA parameters, largest targeted matrix d_in * d_out)."""
    targets = resolve_targets(model, setup.targets) if setup.is_lora else frozenset()
    total = largest = 0
    for spec, n in model.layer_groups:
        for m in spec.linears:
            if m.name in targets:
                total += n * m.count * setup.rank * (m.d_in + m.d_out)
                largest = max(largest, m.d_in * m.d_out)
    return total, largest


def merge_plan(model: ModelSpec, setup: TrainSetup, *, qlora_path: str = "dequantize") -> MergePlan:
    base16 = HALF * model.params_total
    if not setup.is_lora:
        from tuneplan.api import trainable_params  # the one count of what a setup trains

        dt = resolve_dtypes(setup, get_profile(setup.framework))
        trained = trainable_params(model, setup)
        ckpt = trained * dt.trainable + (model.params_total - trained) * dt.frozen_weight
        return MergePlan(needed=False, path="none (full weights trained)", peak_bytes=0,
                         base_16bit_bytes=base16,
                         adapter_params=0, adapter_bytes=0, temp_bytes=0, checkpoint_bytes=ckpt,
                         notes=["no adapter: serve the trained checkpoint (cast it to 16 bits first if it "
                                "was "
                                "saved in fp32)"])
    dt = resolve_dtypes(setup, get_profile(setup.framework))
    a_params, largest = adapter_params(model, setup)
    a_bytes = a_params * dt.adapter
    temp = DELTA_COPIES * largest * dt.adapter
    notes = []
    quantized_layer = 0
    if setup.method == "qlora" and qlora_path == "dequantize":
        bits = setup.quant_bits or 4
        quantized_layer = max(sum(m.count * sum(quant_bytes(m.d_in * m.d_out, m.d_out, bits,
                                                            setup.double_quant))
                                  for m in spec.linears) for spec, _ in model.layer_groups)
        path = f"dequantize the {bits}-bit base to 16 bits, then merge (keeps the rounding the adapter saw)"
    elif setup.method == "qlora":
        path = "reload the base at 16 bits, then merge (the adapter was trained on the 4-bit rounding)"
    else:
        path = "load the base at 16 bits, merge_and_unload"
    if setup.method == "qlora":
        notes.append("the merge needs the 16-bit base in memory, more than the 4-bit training held")
    return MergePlan(needed=True, path=path, peak_bytes=base16 + a_bytes + temp + quantized_layer,
                     base_16bit_bytes=base16, adapter_params=a_params, adapter_bytes=a_bytes, temp_bytes=temp,
                     quantized_base_bytes=quantized_layer, checkpoint_bytes=a_bytes, notes=notes)
