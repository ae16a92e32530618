"""How a profile puts the model's parameters in memory before training: the dtype it loads them in, and
whether accelerate wraps FSDP with a mixed-precision policy (and upcasts trainable parameters) for it. Both
engines and the compatibility rules read these, so each rule lives once."""

from __future__ import annotations

from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup


def loads_fp32(setup: TrainSetup, prof: Profile) -> bool:
    """Whether the profile loads the model in fp32 (``torch_dtype`` at ``from_pretrained``) rather than the
    16-bit compute dtype: an fp32 precision; a full fine-tune under ``-mixed`` where trainable parameters
    keep an fp32 master; or an unquantized method under ``-mixed`` where the profile keeps the frozen base
    in fp32 too (fsdp_qlora train.py's bf16_autocast: ``torch_dtype=float32``, then ``model.to(float32)``)."""
    if setup.precision == "fp32":
        return True
    mixed = setup.precision.endswith("-mixed")
    if setup.method == "full" and mixed and prof.trainable_fp32_in_mixed:
        return True
    return setup.method != "qlora" and mixed and prof.mixed_base_fp32


def fsdp_mixed_precision(setup: TrainSetup, prof: Profile) -> bool:
    """Whether accelerate runs FSDP with a MixedPrecision policy in the 16-bit dtype and upcasts the 16-bit
    trainable parameters to fp32 masters (accelerate ``Accelerator.prepare_model`` for FSDP1 after wrapping,
    ``fsdp2_prepare_model`` before ``fully_shard``; both when ``mixed_precision != "no"``, which
    ``AcceleratorState`` turns into ``FullyShardedDataParallelPlugin.set_mixed_precision``): a ``-mixed``
    precision, or a pure 16-bit one whose profile still sets the Trainer's bf16 / fp16 (TrainingArguments
    then sets ``ACCELERATE_MIXED_PRECISION``)."""
    if setup.precision == "fp32":
        return False
    return setup.precision.endswith("-mixed") or prof.pure_trainer_amp
