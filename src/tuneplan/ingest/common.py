"""What every reader shares: the result type, a collector that records each value's origin, the plain
keys of every format (generated from the field table, specs/fields/), and the translations of
transformers ``TrainingArguments`` keys (which LLaMA-Factory and TRL configs also carry).

Three kinds of keys: mapped (they set a TrainSetup field, and the source says ``file:line``), ignored
silently (logging, saving, data loading, learning-rate schedule: no effect on memory, step time or
compatibility), and "not modelled" (they would change memory or time but tuneplan has no term for
them): each of the last gets a warning naming the file, line and key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tuneplan.errors import ConfigError
from tuneplan.ingest.document import Document
from tuneplan.specs import fields as field_table


@dataclass
class Ingested:
    """What one config file says about the run."""

    path: str
    # llamafactory | axolotl | hf-args | peft | bitsandbytes | deepspeed | accelerate | model-config
    kind: str
    label: str  # how sources name this file's kind, e.g. "llamafactory yaml"
    fields: dict[str, Any] = field(default_factory=dict)  # TrainSetup fields
    sources: dict[str, str] = field(default_factory=dict)  # field -> "label path:line"
    weak: set[str] = field(default_factory=set)  # fields given only as hints (another file's value wins)
    model: str | None = None
    model_source: str | None = None
    warnings: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)  # deepspeed buckets, run length, world size...
    references: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, path, where it is named)


def _finite(v: int | float) -> bool:
    return isinstance(v, int) or math.isfinite(v)


def _short(value: Any) -> str:
    """A value as a message shows it, cut to 60 characters (a hostile file may hold megabytes in one)."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 100 else "a huge integer"
    return text if len(text) <= 60 else text[:57] + "..."


class Collector:
    """Builds an :class:`Ingested` from a :class:`Document`, with ``file:line`` on every value."""

    def __init__(self, doc: Document, kind: str, label: str) -> None:
        self.doc = doc
        self.out = Ingested(path=doc.path, kind=kind, label=label)
        self.handled: set[str] = set()  # top-level keys consumed by a mapping

    # ---- reading values ------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return self.doc.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        self.handled.add(key)
        v = self.doc.data.get(key)
        return default if v is None else v

    def fail(self, key: tuple[Any, ...] | str, message: str, accepted: Any = None) -> ConfigError:
        k = (key,) if isinstance(key, str) else key
        return ConfigError(f"{self.doc.where(*k)}: `{'.'.join(map(str, k))}`: {message}",
                           field=".".join(map(str, k)), accepted=accepted)

    def as_int(self, value: Any, key: tuple[Any, ...] | str, *, minimum: int = 1) -> int:
        # YAML 1.1 reads 5e8 as a string; JSON writes 1e9 as a float: accept both when integral.
        # NaN and infinity (YAML .nan / .inf) are no integer; the upper bound is the field's own (specs).
        v = value
        if isinstance(v, str):
            try:
                v = float(v) if len(v) <= 64 else float("nan")
            except ValueError:
                raise self.fail(key, f"expected a number, got {_short(value)}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or v != int(v):
            raise self.fail(key, f"expected an integer, got {_short(value)}")
        if int(v) < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {_short(value)}")
        return int(v)

    def as_bool(self, value: Any, key: tuple[Any, ...] | str) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise self.fail(key, f"expected true or false, got {_short(value)}", accepted="true, false")

    def as_float(self, value: Any, key: tuple[Any, ...] | str) -> float:
        """A finite number (NaN and infinity refused: every later total would be NaN or infinite)."""
        try:
            if isinstance(value, bool) or (isinstance(value, str) and len(value) > 64):
                raise ValueError
            v = float(value)
        except (TypeError, ValueError, OverflowError):
            raise self.fail(key, f"expected a number, got {_short(value)}") from None
        if not _finite(v):
            raise self.fail(key, f"expected a finite number, got {_short(value)}")
        return v

    # ---- recording ---------------------------------------------------------------------------
    def source(self, *key: Any) -> str:
        return f"{self.out.label} {self.doc.where(*key)}"

    def set(self, name: str, value: Any, *key: Any, weak: bool = False) -> None:
        self.out.fields[name] = value
        self.out.sources[name] = self.source(*key)
        if weak:
            self.out.weak.add(name)
        else:
            self.out.weak.discard(name)

    def default(self, name: str, value: Any, why: str) -> None:
        """A framework default the file relies on by leaving a key out (the run uses it all the same)."""
        self.out.fields[name] = value
        self.out.sources[name] = f"{self.out.label} {self.doc.path} ({why})"

    def set_model(self, name: Any, *key: Any) -> None:
        if not isinstance(name, str) or not name.strip():
            raise self.fail(key, f"expected a model id or path, got {name!r}")
        self.out.model = name.strip()
        self.out.model_source = self.source(*key)

    def warn(self, key: tuple[Any, ...] | str, message: str) -> None:
        k = (key,) if isinstance(key, str) else key
        self.out.warnings.append(f"{self.doc.where(*k)}: `{'.'.join(map(str, k))}`: {message}")

    def note(self, message: str) -> None:
        self.out.warnings.append(f"{self.doc.path}: {message}")

    def reference(self, kind: str, path: str, *key: Any) -> None:
        self.out.references.append((kind, path, self.doc.where(*key)))

    def finish(self, ignored: frozenset[str], ignored_prefixes: tuple[str, ...], not_modelled: dict[str, str],
               unknown: str) -> Ingested:
        """Warn about every key that was neither mapped nor known to be harmless."""
        for key, value in self.doc.data.items():
            if key in self.handled or key in ignored or key.startswith(ignored_prefixes):
                continue
            if key in not_modelled:
                if value not in (None, False, "", [], {}, 0):
                    self.warn(key, f"not modelled: {not_modelled[key]}")
            elif value not in (None, False, "", [], {}):  # an unknown switch left off changes nothing
                self.warn(key, unknown)
        return self.out


# ---- transformers TrainingArguments (and TRL SFTConfig), shared by three readers ---------------

# optim names of transformers.training_args.OptimizerNames -> TrainSetup.optimizer
HF_OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw-hf",
    "adamw_torch_fused": "adamw-fused",
    "adamw_apex_fused": "adamw-fused",
    "adamw_torch_npu_fused": "adamw-fused",
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw_32bit": "paged-adamw",
    "paged_adamw": "paged-adamw",
    "adafactor": "adafactor",
    "sgd": "sgd",
}
# The reverse, for writers: TrainSetup.optimizer -> the HF optim name that runs it.
OPTIMIZER_TO_HF = {
    "adamw": "adamw_torch",
    "adamw-fused": "adamw_torch_fused",
    "adamw-hf": "adamw_hf",
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "paged-adamw": "paged_adamw_32bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
}

# Keys with no effect on memory, step time or compatibility (logging, saving, evaluation schedule,
# learning rate and its schedule, data loading, hub, seeds).
HF_IGNORED = frozenset({
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "learning_rate",
    "weight_decay",
    "max_grad_norm", "lr_scheduler_type", "lr_scheduler_kwargs", "seed", "data_seed", "run_name", "project",
    "report_to", "disable_tqdm", "remove_unused_columns", "label_names", "resume_from_checkpoint",
    "ignore_data_skip", "full_determinism", "tf32", "local_rank", "ddp_timeout", "ddp_backend",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph",
    "gradient_checkpointing_kwargs", "activation_checkpointing_kwargs", "average_tokens_across_devices",
    "prediction_loss_only", "include_for_metrics", "include_inputs_for_metrics",
    "include_num_input_tokens_seen",
    "include_tokens_per_second", "batch_eval_metrics", "metric_for_best_model", "greater_is_better",
    "load_best_model_at_end", "skip_memory_metrics", "debug", "use_cache", "bf16_full_eval", "fp16_full_eval",
    "fp16_opt_level", "half_precision_backend", "fp16_backend", "past_index", "optim_args",
    "torch_empty_cache_steps", "length_column_name", "group_by_length", "train_sampling_strategy",
    "sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams",
    "generation_config", "per_device_eval_batch_size", "per_gpu_eval_batch_size", "accelerator_config",
    "restore_callback_states_from_checkpoint", "enable_jit_checkpoint", "mp_parameters",
    "use_legacy_prediction_loop",
    "jit_mode_eval", "use_ipex", "dispatch_batches", "split_batches", "torchdynamo", "ray_scope",
    "torch_compile_backend", "torch_compile_mode", "liger_kernel_config", "parallelism_config",
    "_n_gpu", "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap", "tpu_num_cores",
    "tpu_metrics_debug",
    "xpu_backend", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
    "hub_revision", "push_to_hub", "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token",
    "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "adam_beta1", "adam_beta2",
    "adam_epsilon", "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps",
    "eval_on_start", "eval_delay", "eval_steps", "eval_strategy", "evaluation_strategy", "use_mps_device",
    "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "packing", "padding_free", "eos_token",
    "pad_token", "completion_only_loss", "assistant_only_loss", "chat_template_path", "model_init_kwargs",
    "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "trust_remote_code",
    "model_revision", "dataset_streaming", "padding_side", "shuffle_dataset", "loss_type",
    "activation_offloading",
})
HF_IGNORED_PREFIXES = ("logging_", "log_", "save_", "warmup_", "dataloader_", "hub_", "eval_", "wandb",
                       "mlflow")
HF_NOT_MODELLED = {
    "neftune_noise_alpha": ("NEFTune adds noise to the embedding output; its small extra tensor is not "
                            "counted"),
    "label_smoothing_factor": "label smoothing runs a second log-softmax over the fp32 logits",
    "optim_target_modules": "GaLore/APOLLO projected optimizer states",
    "auto_find_batch_size": "the batch is found at run time by halving on OOM; estimated at the batch given",
    "use_cpu": "a CPU run: GPU memory does not apply",
}

# Switches that choose a kernel TrainSetup models: key -> (field, value when the switch is on, note).
# Liger's and Apple's fused linear cross-entropy never materialise logits ("fused-linear"); Unsloth's and
# flash-attn's cross-entropy run fused on 16-bit logits ("fused"); axolotl's chunked_cross_entropy chunks
# the upcast; torch_compile compiles the layers.
KERNEL_SWITCHES: dict[str, tuple[str, Any, str]] = {
    "use_liger_kernel": ("loss", "fused-linear",
                         "Liger's fused linear cross-entropy; its other kernels are not "
                                                 "modelled"),
    "use_liger": ("loss", "fused-linear", "Liger's fused linear cross-entropy"),
    "enable_liger_kernel": ("loss", "fused-linear",
                            "Liger's fused linear cross-entropy; its other kernels are "
                                                    "not modelled"),
    "liger_fused_linear_cross_entropy": ("loss", "fused-linear", ""),
    "cut_cross_entropy": ("loss", "fused-linear", ""),
    "unsloth_cross_entropy_loss": ("loss", "fused", ""),
    "flash_attn_cross_entropy": ("loss", "fused", ""),
    "chunked_cross_entropy": ("loss", "chunked", ""),
    "torch_compile": ("compile", True, "torch.compile: compiled layers modelled (16-bit norm inputs, SiLU "
                                       "recomputed); a compiled transformers loss is estimated as eager"),
    "activation_offloading": ("activation_offload", True, ""),
}


def map_kernel_switches(c: Collector) -> None:
    """Loss-kernel, compile and activation-offload switches of HF / TRL / LLaMA-Factory / axolotl files."""
    d = c.doc.data
    for key, (field_name, on_value, note) in KERNEL_SWITCHES.items():
        if key not in d or d.get(key) is None:
            continue
        c.handled.add(key)
        if c.as_bool(c.get(key), key):
            c.set(field_name, on_value, key)
            if note:
                c.warn(key, note)


def map_precision(c: Collector, bf16: Any, fp16: Any, key_bf16: str = "bf16", key_fp16: str = "fp16",
                  *, unset_means_fp32: bool = True) -> None:
    """HF Trainer ``bf16``/``fp16`` (autocast) -> TrainSetup.precision."""
    b = c.as_bool(bf16, key_bf16) if bf16 is not None else False
    f = c.as_bool(fp16, key_fp16) if fp16 is not None else False
    if b and f:
        raise c.fail(key_fp16, "bf16 and fp16 are both true; the Trainer refuses that",
                     accepted="one of them")
    if b:
        c.set("precision", "bf16-mixed", key_bf16)
    elif f:
        c.set("precision", "fp16-mixed", key_fp16)
    elif unset_means_fp32 and (bf16 is not None or fp16 is not None):
        key = key_bf16 if bf16 is not None else key_fp16
        c.set("precision", "fp32", key)
        c.warn(key, "bf16 and fp16 are off: estimated as fp32 training; if the model is loaded in bf16, "
                    "give {precision=bf16}")


def map_optimizer(c: Collector, name: Any, key: str) -> None:
    if not isinstance(name, str):
        raise c.fail(key, f"expected an optimizer name, got {name!r}", accepted=sorted(HF_OPTIMIZERS))
    opt = HF_OPTIMIZERS.get(name.lower())
    if opt is None:
        c.warn(key, f"optimizer {name!r} is not modelled; estimated with the profile's default optimizer "
                    f"(modelled: {', '.join(sorted(HF_OPTIMIZERS))})")
        return
    c.set("optimizer", opt, key)


def map_fsdp(c: Collector, value: Any, key: str) -> None:
    """TrainingArguments.fsdp: "full_shard auto_wrap offload" or its list form."""
    if value is not None and not isinstance(value, (str, list, bool)):
        raise c.fail(key, f"expected FSDP options, got {_short(value)}",
                     accepted='"full_shard auto_wrap [offload]", or a list of those words')
    words = value.split() if isinstance(value, str) else (list(value) if isinstance(value, list) else [])
    words = [str(w).lower() for w in words]
    if not words:
        return
    if "full_shard" in words or "hybrid_shard" in words or "shard_grad_op" in words:
        c.set("fsdp", True, key)
        if "shard_grad_op" in words or "hybrid_shard" in words:
            c.warn(key, f"{' '.join(words)}: estimated as FULL_SHARD (parameters sharded too)")
    elif "no_shard" in words:
        c.set("fsdp", False, key)
    if "offload" in words:
        c.set("offload", "all", key)


def map_plain(c: Collector, fmt: str, method: str | None = None, *, skip: tuple[Any, ...] = ()) -> set[str]:
    """Every plain key of ``fmt`` in the file -> its field, checked by the field's type; the fields set.

    The keys come from the field table (specs/fields/). Fields that apply to some methods only (the LoRA
    rank, the 4-bit data type) are read only when ``method`` is one of them (None: not known, so only the
    universal fields). ``skip``: values that leave the field to another file (DeepSpeed's "auto"). Of two
    spellings of one field the first (the current one) wins.
    """
    d = c.doc.data
    done = set()
    for f in field_table.plain_fields(fmt, method):
        for key in reversed(f.keys[fmt]):
            v = d.get(key)
            c.handled.add(key)
            if v is None or (isinstance(v, str) and v in skip):
                continue
            c.set(f.name, _plain_value(c, f.type, v, key), key)
            done.add(f.name)
    return done


def _plain_value(c: Collector, type_: type, value: Any, key: str) -> Any:
    if type_ is bool:
        return c.as_bool(value, key)
    if type_ is int:
        return c.as_int(value, key)
    if type_ is float:
        return c.as_float(value, key)
    return str(value)


def map_hf_training(c: Collector) -> None:
    """The TrainingArguments keys that need a translation, from any reader whose file carries them."""
    d = c.doc.data
    map_kernel_switches(c)
    if d.get("optim") is not None:
        map_optimizer(c, c.get("optim"), "optim")
    if d.get("fsdp") not in (None, "", []):
        map_fsdp(c, c.get("fsdp"), "fsdp")
    c.handled.update({"fsdp", "fsdp_config"})
    run = c.out.extras.setdefault("run", {})
    for k in ("num_train_epochs", "max_steps"):
        if d.get(k) is not None:
            run[k] = c.as_float(c.get(k), k)
