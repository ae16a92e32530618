"""DeepSpeed config JSON with exactly what the estimate assumed.

Stage, offload and bucket sizes are written out rather than left to "auto", so the run cannot drift
from the plan: the buckets are the DeepSpeed defaults the estimator uses (``estimator/wrappers/zero.py``),
``overlap_comm`` is the setup's (off unless it says so; on, ZeRO-1/2 keep a second reduce bucket, which
the estimate counts), batch and accumulation are the
plan's, and ``train_batch_size`` = micro-batch x accumulation x GPUs (DeepSpeed asserts that equality,
so a launch on a different number of GPUs stops instead of silently changing the memory per GPU).
Keys are those of DeepSpeed 0.19's config (``deepspeed/runtime/zero/config.py``, ``precision_config.py``).
"""

from __future__ import annotations

import json
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.estimator.wrappers.zero_terms import DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET
from tuneplan.export.common import plain_keys
from tuneplan.ingest.deepspeed import ZERO_DEFAULTS
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

# fp16 dynamic loss scaling as the HF and LLaMA-Factory templates write it (DeepSpeed's own defaults).
FP16_LOSS_SCALING = {"loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
                     "min_loss_scale": 1}
MAX_GRAD_NORM = 1.0  # transformers TrainingArguments.max_grad_norm default (LLaMA-Factory keeps it)


def deepspeed_config(model: ModelSpec, setup: TrainSetup, acc: Accelerator | None = None) -> dict[str, Any]:
    s = setup
    if s.fsdp:
        raise TuneplanError("this plan uses FSDP, not DeepSpeed", field="format",
                            accepted="{format=accelerate} (FSDP), or plan with {zero=1|2|3}")
    if not s.zero:
        raise TuneplanError("this plan does not use DeepSpeed (ZeRO stage 0 is estimated as plain DDP)",
                            field="zero", accepted="plan with {zero=1|2|3} (with {offload} on one GPU)")
    cfg: dict[str, Any] = {
        "train_batch_size": s.batch * s.grad_accum * s.world_size,
        **plain_keys(s, "deepspeed"),  # micro-batch and accumulation
        "gradient_clipping": MAX_GRAD_NORM,
        # HF/LLaMA-Factory hand DeepSpeed their own optimizer (optim=...): allowed only with this flag.
        "zero_allow_untested_optimizer": True,
    }
    if s.precision.startswith("bf16"):
        cfg["bf16"] = {"enabled": True}
    elif s.precision.startswith("fp16"):
        cfg["fp16"] = {"enabled": True, **FP16_LOSS_SCALING}
    zo: dict[str, Any] = {"stage": s.zero, "overlap_comm": bool(s.ds_overlap_comm),
                          "contiguous_gradients": True,
                          "reduce_bucket_size": s.ds_reduce_bucket or DS_REDUCE_BUCKET,
                          "allgather_bucket_size": ZERO_DEFAULTS["allgather_bucket_size"]}
    if s.zero == 3:
        zo["stage3_prefetch_bucket_size"] = s.ds_prefetch_bucket or DS_PREFETCH_BUCKET
        zo["stage3_param_persistence_threshold"] = ZERO_DEFAULTS["stage3_param_persistence_threshold"]
        zo["stage3_max_live_parameters"] = ZERO_DEFAULTS["stage3_max_live_parameters"]
        zo["stage3_max_reuse_distance"] = ZERO_DEFAULTS["stage3_max_reuse_distance"]
        zo["stage3_gather_16bit_weights_on_model_save"] = True  # so save_model writes usable HF weights
    if s.offload in ("optimizer", "all"):
        if s.optimizer not in ("adamw", "adamw-fused"):
            raise TuneplanError(f"ZeRO-Offload steps with DeepSpeed's CPU Adam, not {s.optimizer}",
                                field="optimizer",
                                accepted="adamw or adamw-fused with {offload}, or {offload=none}")
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        # ZeRO-Offload runs DeepSpeed's CPU Adam; a client (HF) optimizer is refused unless forced, so
        # name DeepSpeed's AdamW here ("auto" params are filled by the HF integration).
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                         "weight_decay": "auto"}}
    if s.offload == "all":
        zo["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg["zero_optimization"] = zo
    return cfg


def render_deepspeed(model: ModelSpec, setup: TrainSetup, acc: Accelerator | None = None) -> str:
    return json.dumps(deepspeed_config(model, setup, acc), indent=2) + "\n"
