"""Build the transformers (+ PEFT) model of a setup on fake tensors, as the training script would.

The model comes from the same config.json dict as the ModelSpec (``ModelSpec.config``), instantiated with
``AutoModelForCausalLM.from_config`` (``AutoModelForSequenceClassification`` with ``num_labels``,
``AutoModelForMaskedLM`` for an encoder) under ``FakeTensorMode`` on the ``cpu`` fake device (fake CUDA
aborts the process once autograd touches it on a CPU-only build; ``meta`` cannot run fused AdamW).
What each framework profile switch does to the real objects:
- weights load in the precision's 16-bit dtype; a full fine-tune under a ``-mixed`` precision keeps fp32
  master weights (``trainable_fp32_in_mixed``: the Trainer loads the model in fp32 and autocasts), and
  ``mixed_base_fp32`` keeps a frozen unquantized base in fp32 too;
- QLoRA: every ``nn.Linear`` of the decoder becomes the bitsandbytes stand-in; then PEFT's
  ``prepare_model_for_kbit_training`` (profile ``kbit_upcast_fp32``) casts every other 16-bit parameter
  to fp32 and freezes the model;
- gradient checkpointing: transformers' ``gradient_checkpointing_enable()`` (non-reentrant by default);
- LoRA: ``get_peft_model`` with ``autocast_adapter_dtype`` from the profile (fp32 adapters);
- freeze: only the last N decoder layers train (LLaMA-Factory ``freeze_trainable_layers``), in fp32
  under a ``-mixed`` precision (LLaMA-Factory casts trainable parameters to fp32).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tuneplan.errors import TuneplanError
from tuneplan.simulate.kernels import ATTN_IMPL, modes_follow_recompute, register_attention
from tuneplan.simulate.qlora import SimLinear4bit, lora_class, replace_linears
from tuneplan.specs.load_precision import loads_fp32
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import Profile
from tuneplan.specs.setup import TrainSetup


def compute_dtype(setup: TrainSetup) -> torch.dtype:
    if setup.precision == "fp32":
        return torch.float32
    return torch.float16 if setup.precision.startswith("fp16") else torch.bfloat16


def uses_autocast(setup: TrainSetup, prof: Profile) -> bool:
    """Whether the forward runs under autocast: the profile's rule, except under DeepSpeed, where
    accelerate's Accelerator leaves native_amp off for fp16 and bf16 (DistributedType.DEEPSPEED: the engine
    runs the 16-bit module itself; accelerate 1.16 accelerator.py) and so never wraps the forward.
    A '-mixed' precision autocasts whatever the profile's default (fsdp_qlora train.py wraps the forward in
    ``torch.cuda.amp.autocast`` for fp16_autocast / bf16_autocast), as ``estimator.dtypes`` reads it."""
    mixed = setup.precision.endswith("-mixed")
    return (prof.autocast or mixed) and setup.precision != "fp32" and not setup.zero


@contextmanager
def data_assignment_apply() -> Any:
    """``Module._apply`` swaps parameter objects for fake tensors and fails ("Cannot swap t2 because it
    has weakref associated with it": the fake-tensor converter holds weakrefs). Assigning ``.data``
    instead gives the same storages; PEFT's ``get_peft_model`` and every ``.to()`` go through here."""
    def apply_by_data(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
        if recurse:
            for child in self.children():
                child._apply(fn)
        for p in self._parameters.values():
            if p is not None:
                with torch.no_grad():
                    new = fn(p)
                if new is not p:
                    p.data = new
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    orig = nn.Module._apply
    nn.Module._apply = apply_by_data  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._apply = orig  # type: ignore[method-assign]


@contextmanager
def fake_mode_shared_on_deepcopy() -> Any:
    """PEFT copies a ``modules_to_save`` module (a classifier head) with ``copy.deepcopy``. A fake tensor's
    ``__dict__`` holds its ``FakeTensorMode``, so the default deepcopy copies the mode too, with its
    converter's ``StorageWeakRef`` memo: each copy frees the same weak reference again when collected,
    which corrupts the heap (a segfault or glibc abort at a later garbage collection). The copy must
    share the one mode anyway, as every tensor of the run does."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    had = "__deepcopy__" in FakeTensorMode.__dict__
    old = FakeTensorMode.__dict__.get("__deepcopy__")
    FakeTensorMode.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            # Tensor.__deepcopy__ asks a fake tensor for its data pointer (0: no storage, so it clones);
            # torch warns on that read, which is expected here and not the user's concern
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            yield
    finally:
        if had:
            FakeTensorMode.__deepcopy__ = old  # type: ignore[attr-defined]
        else:
            del FakeTensorMode.__deepcopy__  # type: ignore[attr-defined]


def hf_config(spec: ModelSpec, attn_impl: str) -> Any:
    from transformers import AutoConfig

    cfg = dict(spec.config)
    model_type = cfg.pop("model_type", spec.model_type)
    if model_type == "gemma" and cfg.get("hidden_act") == "gelu":
        # transformers' GemmaConfig replaces the released checkpoints' legacy "gelu" with the tanh
        # approximation they were trained with, and logs that it did: do it here, silently
        cfg["hidden_act"] = "gelu_pytorch_tanh"
    # cache_implementation is a generation setting (Gemma 3's config carries it): transformers only warns
    # that it is not a valid flag when it builds the generation config, and training never reads it
    for k in ("architectures", "auto_map", "transformers_version", "quantization_config", "torch_dtype",
              "dtype", "cache_implementation"):
        cfg.pop(k, None)
    try:
        config = AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError) as exc:
        raise TuneplanError(
            f"transformers {_tf_version()} has no model class for model_type {model_type!r} ({exc}); "
            "simulate runs transformers' own modeling code", field="model",
            accepted="a model whose architecture transformers implements (or use {engine=analytic})",
        ) from None
    config.use_cache = False
    config._attn_implementation = attn_impl
    return config


def _tf_version() -> str:
    import transformers

    return transformers.__version__


def _load_dtype(setup: TrainSetup, prof: Profile) -> torch.dtype:
    return torch.float32 if loads_fp32(setup, prof) else compute_dtype(setup)


def sharded_qlora(setup: TrainSetup) -> bool:
    """QLoRA under FSDP: the 4-bit codes are stored in the 16-bit compute dtype (``bnb_4bit_quant_storage``)
    so that FSDP flattens them with the other weights, and TRL's SFTTrainer skips
    ``prepare_model_for_kbit_training`` for such a model (``is_sharded_qlora``: its fp32 upcast would mix
    dtypes inside one flat parameter)."""
    return setup.method == "qlora" and setup.fsdp


def head_class(spec: ModelSpec, setup: TrainSetup) -> Any:
    """The transformers auto class the training script would load: a classifier head when ``num_labels`` is
    set, the masked-LM head for an encoder, else the causal LM."""
    import transformers

    if setup.num_labels:
        return transformers.AutoModelForSequenceClassification
    if spec.architecture == "encoder":
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModelForCausalLM


def build(spec: ModelSpec, setup: TrainSetup, prof: Profile, targets: frozenset[str]) -> nn.Module:
    """The model, ready for training (call inside FakeTensorMode)."""
    register_attention()
    attn = setup.attn or prof.default_attn
    impl = ATTN_IMPL[attn]
    config = hf_config(spec, impl)
    if setup.num_labels:
        config.num_labels = setup.num_labels
        if getattr(config, "pad_token_id", None) is None:
            # decoder classifiers pool the last non-padding token and need a pad id for batches > 1; the
            # simulated inputs hold no padding, so any id other than theirs (0) gives the real gather
            config.pad_token_id = spec.vocab - 1
    auto = head_class(spec, setup)
    try:
        model = auto.from_config(config, dtype=_load_dtype(setup, prof), attn_implementation=impl)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = auto.from_config(config, torch_dtype=_load_dtype(setup, prof), attn_implementation=impl)
    model.train()
    if auto.__name__ == "AutoModelForCausalLM" and getattr(model, "loss_type", "") is None:
        # a head class not named *ForCausalLM (GPT2LMHeadModel) falls back to ForCausalLMLoss with a logged
        # warning; name that same loss up front
        model.loss_type = "ForCausalLM"
    half = compute_dtype(setup)
    if setup.method == "qlora":
        if setup.quant_bits != 4:
            raise TuneplanError("simulate models bitsandbytes 4-bit only", field="bits", accepted="4")
        sharded = sharded_qlora(setup)
        replace_linears(model, half, setup.double_quant, skip=(_kept_head(model),),
                        quant_storage=half if sharded else torch.uint8)
        model.is_loaded_in_4bit = True
        if prof.kbit_upcast_fp32 and not sharded:
            from peft import prepare_model_for_kbit_training

            with data_assignment_apply():
                model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if setup.gradient_checkpointing:
        # transformers 5 renamed gradient_checkpointing_enable (same code path: non-reentrant checkpoint)
        enable = (getattr(model, "activation_checkpointing_enable", None)
                  or model.gradient_checkpointing_enable)
        # transformers' default kwargs (use_reentrant=False) and the simulation's modes in the recomputation
        enable({"use_reentrant": False, "context_fn": modes_follow_recompute})
    for p in model.parameters():
        p.requires_grad_(setup.method == "full")
    if setup.method == "freeze":
        _unfreeze_last_layers(model, setup.freeze_trainable_layers, setup, prof)
    if setup.is_lora:
        model = _apply_lora(model, setup, prof, targets)
    return model


def _kept_head(model: nn.Module) -> str:
    """The module transformers' bitsandbytes integration leaves unquantized (``get_keys_to_not_convert``):
    the output embeddings (lm_head, BERT's MLM decoder), else the model's last module (a classifier's
    ``score`` / ``classifier``)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None:
        return next((n for n, m in model.named_modules() if m is out), "lm_head")
    return list(model.named_children())[-1][0]


def _unfreeze_last_layers(model: nn.Module, n: int, setup: TrainSetup, prof: Profile) -> None:
    layers = _decoder_layers(model)
    upcast = setup.precision.endswith("-mixed") and prof.trainable_fp32_in_mixed
    with data_assignment_apply():
        for layer in list(layers)[-n:]:
            for p in layer.parameters():
                if upcast and p.dtype != torch.float32:
                    p.data = p.data.to(torch.float32)
                p.requires_grad_(True)


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) and "DecoderLayer" in type(m[0]).__name__:
            return m
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m):
            return m
    raise TuneplanError("cannot find the decoder layers of this model", field="model")


def _apply_lora(model: nn.Module, setup: TrainSetup, prof: Profile, targets: frozenset[str]) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    from tuneplan.specs.lora_targets import CONVERSION_PATTERN, STACK_OF

    names = sorted({t.split(".")[-1] for t in targets})
    present = {n.split(".")[-1] for n, m in model.named_modules()
               if isinstance(m, (nn.Linear, SimLinear4bit)) or type(m).__name__ == "Conv1D"}  # GPT-2 Conv1D
    # under transformers 5, PEFT moves the expert names of a converted MoE type (gate_proj / up_proj /
    # down_proj, Mixtral's w1 / w3 / w2) onto the fused expert parameters itself
    # (estimator/fused_expert_lora.py): they are passed although no nn.Linear carries them
    pattern = CONVERSION_PATTERN.get(getattr(model.config, "model_type", ""))
    fused = STACK_OF[pattern].keys() if pattern else set()
    usable = [n for n in names if n in present or n in fused]
    if not usable:
        raise TuneplanError(
            f"none of the LoRA targets {names} is a linear layer in transformers' {type(model).__name__} "
            "(transformers 5 fuses MoE experts into 3-D parameters)", field="targets",
            accepted=", ".join(sorted(present)))
    # GPT-2's Conv1D stores its weight transposed: PEFT needs fan_in_fan_out (it sets it itself, warning)
    conv1d = any(type(m).__name__ == "Conv1D" and n.split(".")[-1] in usable
                 for n, m in model.named_modules())
    cfg = LoraConfig(r=setup.rank, lora_alpha=setup.alpha or 2 * setup.rank, lora_dropout=setup.dropout,
                     target_modules=usable, task_type=_peft_task(model, setup), fan_in_fan_out=conv1d)
    if setup.method == "qlora":
        cfg._register_custom_module({SimLinear4bit: lora_class()})
    with data_assignment_apply(), fake_mode_shared_on_deepcopy():
        return get_peft_model(model, cfg, autocast_adapter_dtype=prof.adapter_fp32)


def _peft_task(model: nn.Module, setup: TrainSetup) -> str | None:
    """PEFT's task type: SEQ_CLS puts the classifier head in modules_to_save; a masked LM has none (a
    plain PeftModel: PeftModelForCausalLM expects generation hooks an encoder lacks)."""
    if setup.num_labels:
        return "SEQ_CLS"
    return None if type(model).__name__.endswith("ForMaskedLM") else "CAUSAL_LM"


def lora_targets_skipped(model: nn.Module, targets: frozenset[str]) -> list[str]:
    """Targets that PEFT could not wrap (e.g. fused MoE expert weights)."""
    from tuneplan.specs.lora_targets import CONVERSION_PATTERN, STACK_OF

    present = {n.split(".")[-1] for n, m in model.named_modules() if "lora_A" in dict(m.named_children())}
    # PEFT moved the expert names of a converted MoE type onto the fused stacks (lora.ParamWrapper)
    config = getattr(getattr(model, "base_model", model), "config", None) or getattr(model, "config", None)
    pattern = CONVERSION_PATTERN.get(getattr(config, "model_type", ""))
    if pattern and any(type(m).__name__ == "ParamWrapper" for m in model.modules()):
        present |= STACK_OF[pattern].keys()
    return sorted({t.split(".")[-1] for t in targets} - present)
