"""Build the real model for a measured run and apply the planned setup the way the hf profile does.

The model comes from the ModelSpec's own config.json dict (``ModelSpec.config``) with random weights,
created directly on the target device in the load dtype (no download, no CPU copy of a large model),
or from a local checkpoint when ``weights`` names one. The setup is applied as transformers' Trainer
+ PEFT apply it, reading the same dtype decisions the estimator reads (``estimator.dtypes``), so that
estimate and measurement describe the same run:
- ``-mixed`` precisions: frozen weights in 16 bits, trainable ones (full / freeze layers) in fp32, the
  forward under ``torch.autocast``; pure ``bf16``/``fp16``: everything in that dtype, no autocast;
- LoRA through ``peft.get_peft_model`` (adapters upcast to fp32 by PEFT's ``autocast_adapter_dtype``);
- QLoRA through bitsandbytes (``BitsAndBytesConfig``) and ``prepare_model_for_kbit_training`` when the
  profile upcasts; random weights are saved once to a temporary folder and loaded quantized, because
  bitsandbytes quantizes at load time;
- gradient checkpointing with ``use_reentrant=False``; the optimizer as Trainer builds it for ``optim``.
Everything heavy is imported inside the functions (the ``simulate`` extra).
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.estimator.dtypes import resolve_dtypes
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import get_profile
from tuneplan.specs.setup import TrainSetup

LEARNING_RATE = 1e-5  # any small value: the data are random and only memory and speed are measured
MEASURABLE_FRAMEWORKS = ("hf", "llamafactory")  # profiles that run transformers' model code + PEFT
BNB_OPTIMIZERS = {"adamw-8bit": "AdamW8bit", "paged-adamw-8bit": "PagedAdamW8bit",
                  "paged-adamw": "PagedAdamW"}
ATTN_IMPL = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}


def require_stack() -> tuple[Any, Any, Any]:
    """(torch, transformers, peft), or a TuneplanError saying how to install them."""
    try:
        import peft
        import torch
        import transformers
    except ImportError as exc:
        raise TuneplanError(
            f"measure runs real training steps and needs torch, transformers and peft "
            f"({exc.name} is missing)",
            field="measure", accepted="pip install 'tuneplan[simulate]'") from None
    return torch, transformers, peft


@dataclass
class BuiltRun:
    """What the step loop needs: the model, its optimizer, the autocast settings and what was done."""

    model: Any
    optimizer: Any
    device: str
    autocast_dtype: Any  # torch dtype or None
    scaler: Any  # torch GradScaler (fp16-mixed on CUDA) or None
    trainable_params: int
    details: dict[str, str] = field(default_factory=dict)


def check_measurable(setup: TrainSetup, device: str) -> None:
    """Refuse, naming the field, what one process on one device cannot run."""
    if setup.cards > 1 or setup.zero or setup.fsdp:  # cards: a device_map run spans several in one process
        raise TuneplanError("measure runs one process on one device; plan multi-GPU runs with `estimate`",
                            field="gpus" if setup.cards > 1 else ("zero" if setup.zero else "fsdp"),
                            accepted="{gpus=1} {nodes=1}, no {zero} / {fsdp}")
    if setup.framework not in MEASURABLE_FRAMEWORKS:
        raise TuneplanError(f"measure runs the transformers + PEFT stack; {setup.framework} runs its own "
                            "model code, measure it with that framework's memory logging", field="framework",
                            accepted=MEASURABLE_FRAMEWORKS)
    if setup.optimizer_in_backward:
        raise TuneplanError("optimizer-in-backward is a torchtune recipe feature, not a Trainer one",
                            field="optimizer_in_backward", accepted="{optimizer_in_backward=false}")
    gpu_only = []
    if setup.method == "qlora":
        gpu_only.append(("method", "QLoRA quantizes with bitsandbytes, which needs a CUDA GPU",
                         "full, freeze, lora on a CPU"))
    if setup.optimizer in BNB_OPTIMIZERS:
        gpu_only.append(("optimizer", f"{setup.optimizer} is a bitsandbytes CUDA optimizer",
                         "adamw, adamw-fused, adafactor, sgd on a CPU"))
    if setup.attn == "flash":
        gpu_only.append(("attn", "FlashAttention-2 is a CUDA kernel", "eager, sdpa on a CPU"))
    if device == "cpu" and gpu_only:
        name, why, ok = gpu_only[0]
        raise TuneplanError(f"{why}; this run is on the CPU", field=name, accepted=ok)
    if device != "cpu" and (setup.method == "qlora" or setup.optimizer in BNB_OPTIMIZERS):
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise TuneplanError("this setup needs bitsandbytes", field="method" if setup.method == "qlora"
                                else "optimizer", accepted="pip install bitsandbytes") from None


def _dtype(torch: Any, nbytes: int, setup: TrainSetup) -> Any:
    if nbytes == 4:
        return torch.float32
    return torch.float16 if setup.precision.startswith("fp16") else torch.bfloat16


def _hf_config(transformers: Any, model: ModelSpec, num_labels: int | None = None) -> Any:
    cfg = dict(model.config)
    if num_labels:
        cfg["num_labels"] = num_labels
        # *ForSequenceClassification on a decoder pools the last non-pad token: it needs a pad id for
        # batch > 1
        cfg.setdefault("pad_token_id", 0)
        cfg.pop("id2label", None)
        cfg.pop("label2id", None)
    model_type = str(cfg.pop("model_type", model.model_type))
    for k in ("architectures", "auto_map", "quantization_config", "_name_or_path", "transformers_version"):
        cfg.pop(k, None)
    try:
        return transformers.AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError) as exc:
        why = str(exc).split(". ")[0][:160]  # transformers appends the list of every known model type
        raise TuneplanError(f"transformers {transformers.__version__} cannot build model_type {model_type!r} "
                            f"from its config ({why}); remote-code models are not run by measure",
                            field="model") from None


def build_model(model: ModelSpec, setup: TrainSetup, device: str, weights: str | None = None) -> BuiltRun:
    """Instantiate ``model`` on ``device`` and apply ``setup`` (already resolved against its profile)."""
    with warnings.catch_warnings():
        # transformers/PEFT deprecation notices about their own internals are noise for the user here.
        warnings.simplefilter("ignore", FutureWarning)
        return _build(model, setup, device, weights)


def _build(model: ModelSpec, setup: TrainSetup, device: str, weights: str | None) -> BuiltRun:
    torch, transformers, peft = require_stack()
    check_measurable(setup, device)
    prof = get_profile(setup.framework)
    dt = resolve_dtypes(setup, prof)
    load_bytes = dt.trainable if setup.method == "full" else dt.frozen_weight
    load_dtype = _dtype(torch, load_bytes, setup)
    attn = ATTN_IMPL[setup.attn or prof.default_attn]
    details = {"weights": "random init (from config.json)" if not weights else f"local checkpoint {weights}",
               "load_dtype": str(load_dtype).replace("torch.", ""), "attn_implementation": attn}
    from tuneplan.simulate.build import head_class  # the same head the simulate engine builds

    auto = head_class(model, setup)
    kwargs: dict[str, Any] = {"dtype": load_dtype, "attn_implementation": attn}
    try:
        if setup.method == "qlora":
            net = _load_quantized(torch, transformers, model, setup, auto, kwargs, weights, device, details)
        elif weights:
            net = auto.from_pretrained(weights, device_map={"": device}, **kwargs)
        else:
            with torch.device(device):
                net = auto.from_config(_hf_config(transformers, model, setup.num_labels), **kwargs)
    except TuneplanError:
        raise
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        why = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise TuneplanError(f"could not build {model.name} with transformers: {why}", field="model") from None
    if getattr(net.config, "use_cache", None) is not None:
        net.config.use_cache = False  # training keeps no KV cache (Trainer does the same under checkpointing)
    gc_kwargs = {"use_reentrant": False}
    if setup.method == "qlora" and prof.kbit_upcast_fp32:
        net = peft.prepare_model_for_kbit_training(
            net, use_gradient_checkpointing=bool(setup.gradient_checkpointing),
            gradient_checkpointing_kwargs=gc_kwargs)
        details["kbit_prepare"] = "prepare_model_for_kbit_training (non-quantized params upcast to fp32)"
    elif setup.gradient_checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)
    details["gradient_checkpointing"] = "on (use_reentrant=False)" if setup.gradient_checkpointing else "off"
    net = _apply_method(torch, peft, net, model, setup, dt, details)
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    if not params:
        raise TuneplanError("the setup leaves no trainable parameter", field="method")
    optimizer = _optimizer(torch, transformers, setup, params, device, details)
    autocast_dtype = _dtype(torch, 2, setup) if dt.autocast else None
    scaler = None
    if autocast_dtype is torch.float16 and device.startswith("cuda"):
        scaler = torch.amp.GradScaler("cuda")  # Trainer uses a grad scaler with fp16 mixed precision
    details["autocast"] = str(autocast_dtype).replace("torch.", "") if autocast_dtype is not None else "off"
    return BuiltRun(model=net, optimizer=optimizer, device=device, autocast_dtype=autocast_dtype,
                    scaler=scaler, trainable_params=sum(p.numel() for p in params), details=details)


def _load_quantized(torch: Any, transformers: Any, model: ModelSpec, setup: TrainSetup, auto: Any,
                    kwargs: dict[str, Any], weights: str | None, device: str, details: dict[str, str]) -> Any:
    bits = setup.quant_bits or 4
    if bits == 4:
        qcfg = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=setup.quant_type,
            bnb_4bit_use_double_quant=setup.double_quant,
            bnb_4bit_compute_dtype=_dtype(torch, 2, setup) if setup.precision != "fp32" else torch.float32)
    else:
        qcfg = transformers.BitsAndBytesConfig(load_in_8bit=True)
    details["quantization"] = (f"bnb {setup.quant_type} 4-bit"
                               + (" + double quant" if setup.double_quant else "")
                               if bits == 4 else "bnb LLM.int8 8-bit")
    if weights:
        return auto.from_pretrained(weights, quantization_config=qcfg, device_map={"": device}, **kwargs)
    # bitsandbytes quantizes while loading a checkpoint: write the random 16-bit model once, then load it.
    with tempfile.TemporaryDirectory(prefix="tuneplan-measure-") as tmp:
        with torch.device(device):
            dense = auto.from_config(_hf_config(transformers, model, setup.num_labels), **kwargs)
        dense.save_pretrained(tmp)
        del dense
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return auto.from_pretrained(tmp, quantization_config=qcfg, device_map={"": device}, **kwargs)


def _decoder_layers(net: Any, n_layers: int) -> Any:
    """The ModuleList of the transformer blocks (the longest list of n_layers modules)."""
    import torch.nn as nn

    lists = [m for m in net.modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers]
    if not lists:
        raise TuneplanError("cannot find the decoder layers to unfreeze", field="method",
                            accepted="full, lora, qlora")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def _apply_method(torch: Any, peft: Any, net: Any, model: ModelSpec, setup: TrainSetup, dt: Any,
                  details: dict[str, str]) -> Any:
    if setup.method == "full":
        for p in net.parameters():
            p.requires_grad_(True)
        return net
    for p in net.parameters():
        p.requires_grad_(False)
    if setup.method == "freeze":
        layers = _decoder_layers(net, model.n_layers)
        n = min(setup.freeze_trainable_layers, model.n_layers)
        for layer in list(layers)[-n:]:
            layer.to(_dtype(torch, dt.trainable, setup))
            for p in layer.parameters():
                p.requires_grad_(True)
        details["freeze"] = f"last {n} layers trainable"
        return net
    targets = sorted(resolve_targets(model, setup.targets))
    # SEQ_CLS keeps the classification head trainable (PEFT modules_to_save), as a classifier run does
    task = ("SEQ_CLS" if setup.num_labels
            else "FEATURE_EXTRACTION" if model.architecture == "encoder" else "CAUSAL_LM")
    cfg = peft.LoraConfig(r=setup.rank, lora_alpha=setup.alpha or 2 * setup.rank, lora_dropout=setup.dropout,
                          target_modules=targets, task_type=task)
    try:
        net = peft.get_peft_model(net, cfg)
    except ValueError as exc:
        raise TuneplanError(f"PEFT could not apply LoRA to {targets}: {exc}", field="targets") from None
    if dt.adapter == 2:  # profiles that keep adapters in the base dtype (PEFT upcasts to fp32 by default)
        for name, p in net.named_parameters():
            if "lora_" in name:
                p.data = p.data.to(_dtype(torch, 2, setup))
    details["lora"] = f"r={setup.rank} on {','.join(targets)}"
    return net


def _optimizer(torch: Any, transformers: Any, setup: TrainSetup, params: list[Any], device: str,
               details: dict[str, str]) -> Any:
    name = setup.optimizer or "adamw"
    if name == "adamw":
        opt = torch.optim.AdamW(params, lr=LEARNING_RATE)  # Trainer optim="adamw_torch" (foreach)
    elif name == "adamw-fused":
        opt = torch.optim.AdamW(params, lr=LEARNING_RATE, fused=True)  # optim="adamw_torch_fused"
    elif name == "adamw-hf":
        opt = torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=False)  # a per-parameter loop, as adamw_hf
    elif name == "adafactor":
        # Trainer optim="adafactor": scale_parameter=False, relative_step=False with the given lr
        opt = transformers.optimization.Adafactor(params, lr=LEARNING_RATE, scale_parameter=False,
                                                  relative_step=False, warmup_init=False)
    elif name == "sgd":
        opt = torch.optim.SGD(params, lr=LEARNING_RATE)  # optim="sgd": no momentum, no state
    elif name in BNB_OPTIMIZERS:
        import bitsandbytes as bnb

        opt = getattr(bnb.optim, BNB_OPTIMIZERS[name])(params, lr=LEARNING_RATE)
    else:  # pragma: no cover - TrainSetup.validate admits only the names above
        raise TuneplanError(f"unknown optimizer {name!r}", field="optimizer")
    details["optimizer"] = f"{type(opt).__module__.split('.')[0]} {type(opt).__name__}" + (
        " (fused)" if name == "adamw-fused" else "")
    return opt
