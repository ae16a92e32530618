"""The setup fields, once: type, default, accepted values, unit, help, CLI flag, web label and widget, and
the names each field has in the files people train with.

Every ``TrainSetup`` field has one row here (a test holds the two together: same names, same defaults).
Faces are generated from the rows: ``cli/options.py`` builds the setup flags (name, help, metavar),
``web/wording.py`` the page's labels, ``ingest/common.py`` ``map_plain`` the plain part of every reader,
and ``export/common.py`` ``plain_keys`` the plain part of every writer.

A row names the field in LLaMA-Factory YAML, axolotl YAML, Hugging Face ``TrainingArguments`` / TRL
``SFTConfig`` + ``ModelConfig`` / PEFT ``LoraConfig`` / ``BitsAndBytesConfig`` ("transformers"),
DeepSpeed JSON and accelerate YAML, in two kinds:
- ``keys``: plain names. The value is the field's, unchanged (same meaning, a number, a switch or the same
  vocabulary); readers copy it, checked by the field's type, and writers write the first name (the others
  are older spellings a reader still accepts).
- ``via``: names (top-level, or inside the section named before them) that feed a hand-written
  translation in that format's reader or writer (``quantization_bit`` sets the method too, ``pure_bf16``
  the precision, optimizer names differ).
``methods`` limits a field to the methods it applies to (LoRA rank: lora, qlora): a reader reads its plain
keys only for those, a writer writes them only for those.

Adding a setup field: a row here, the field on ``TrainSetup``, the formula that reads it, its tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tuneplan.specs.setup import (
    ATTENTIONS,
    DEVICE_MAPS,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    QUANT_TYPES,
)

FORMATS = ("llamafactory", "axolotl", "transformers", "deepspeed", "accelerate")
WIDGETS = ("radio", "dropdown", "number", "checkbox", "textbox", "none")


@dataclass(frozen=True)
class Field:
    """One setup field. ``accepted``: the values (a tuple) or a range in words; ``flag``: the CLI names
    (``()`` = not a flag: the DeepSpeed details read from a config)."""

    name: str
    type: type
    default: Any
    help: str
    accepted: tuple[Any, ...] | str = ""
    unit: str = ""
    flag: tuple[str, ...] = ()
    label: str = ""
    widget: str = "none"
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    via: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    methods: tuple[str, ...] = ()

    def names(self, fmt: str) -> tuple[str, ...]:
        """Every name of the field in ``fmt``: plain, then translated."""
        return (*self.keys.get(fmt, ()), *self.via.get(fmt, ()))

    def applies_to(self, method: str | None) -> bool:
        """The field means something for ``method`` (None: not known yet, so only the universal fields)."""
        return not self.methods or method in self.methods

    @property
    def is_switch(self) -> bool:
        return self.type is bool

    @property
    def metavar(self) -> str:
        """What the help shows after the flag: the field in capitals, ``N`` for counts, ``X`` for numbers."""
        if self.type is int:
            return "N"
        if self.type is float:
            return "X"
        return self.name.upper()

    def cli_help(self) -> str:
        accepted = " | ".join(map(str, self.accepted)) if isinstance(self.accepted, tuple) else self.accepted
        parts = [self.help]
        if accepted and not self.is_switch:
            parts.append(f"[{accepted}]")
        if self.unit:
            parts.append(f"({self.unit})")
        return " ".join(parts)


def _f(name: str, type_: type, default: Any, help: str, **kw: Any) -> Field:
    keys, via = kw.pop("keys", {}), kw.pop("via", {})
    return Field(
        name, type_, default, help, keys=MappingProxyType(dict(keys)), via=MappingProxyType(dict(via)), **kw
    )


LORA = ("lora", "qlora")

FIELDS: tuple[Field, ...] = (
    _f(
        "method",
        str,
        "lora",
        "how the weights train (default: lora)",
        accepted=METHODS,
        flag=("--method",),
        label="Method",
        widget="radio",
        via={
            "llamafactory": ("finetuning_type", "quantization_bit"),
            "axolotl": ("adapter",),
            "transformers": ("use_peft",),
        },
    ),
    _f(
        "bits",
        int,
        None,
        "quantization of the frozen base, qlora only (default: 4)",
        accepted=(4, 8),
        unit="bits",
        flag=("--bits",),
        label="QLoRA bits",
        widget="radio",
        via={
            "llamafactory": ("quantization_bit",),
            "axolotl": ("load_in_4bit", "load_in_8bit"),
            "transformers": ("load_in_4bit", "load_in_8bit"),
        },
        methods=("qlora",),
    ),
    _f(
        "quant_type",
        str,
        "nf4",
        "4-bit data type (default: nf4)",
        accepted=QUANT_TYPES,
        flag=("--quant-type",),
        keys={"llamafactory": ("quantization_type",), "transformers": ("bnb_4bit_quant_type",)},
        via={"axolotl": ("bnb_config_kwargs",)},
        methods=("qlora",),
    ),
    _f(
        "double_quant",
        bool,
        True,
        "nested absmax quantization (default: on)",
        flag=("--double-quant/--no-double-quant",),
        keys={
            "llamafactory": ("double_quantization",),
            "transformers": ("bnb_4bit_use_double_quant", "use_bnb_nested_quant"),
        },
        via={"axolotl": ("bnb_config_kwargs",)},
        methods=("qlora",),
    ),
    _f(
        "rank",
        int,
        16,
        "LoRA rank (default: 16)",
        accepted="1..65536",
        flag=("--rank", "-r"),
        label="LoRA rank",
        widget="number",
        keys={"llamafactory": ("lora_rank",), "axolotl": ("lora_r",), "transformers": ("r", "lora_r")},
        methods=LORA,
    ),
    _f(
        "alpha",
        int,
        None,
        "LoRA alpha, scaling only, no memory effect (default: 2 x rank)",
        flag=("--alpha",),
        keys={"llamafactory": ("lora_alpha",), "axolotl": ("lora_alpha",), "transformers": ("lora_alpha",)},
        methods=LORA,
    ),
    _f(
        "dropout",
        float,
        None,
        "LoRA dropout (default: the profile's)",
        accepted="0 <= p < 1",
        flag=("--dropout",),
        keys={
            "llamafactory": ("lora_dropout",),
            "axolotl": ("lora_dropout",),
            "transformers": ("lora_dropout",),
        },
        methods=LORA,
    ),
    _f(
        "targets",
        str,
        None,
        "LoRA target modules (default: the profile's)",
        accepted="q_proj,v_proj | attn | mlp | all-linear",
        flag=("--targets",),
        label="LoRA targets",
        widget="dropdown",
        via={
            "llamafactory": ("lora_target",),
            "axolotl": ("lora_target_modules", "lora_target_linear"),
            "transformers": ("target_modules", "lora_target_modules"),
        },
        methods=LORA,
    ),
    _f(
        "precision",
        str,
        "bf16-mixed",
        "weights and compute dtype (default: the profile's)",
        accepted=PRECISIONS,
        flag=("--precision",),
        label="Precision",
        widget="dropdown",
        via={
            "llamafactory": ("bf16", "fp16", "pure_bf16"),
            "axolotl": ("bf16", "fp16", "bfloat16", "float16"),
            "transformers": ("bf16", "fp16", "bnb_4bit_compute_dtype"),
            "accelerate": ("mixed_precision",),
        },
    ),
    _f(
        "optimizer",
        str,
        None,
        "optimizer (default: the profile's)",
        accepted=OPTIMIZERS,
        flag=("--optimizer",),
        label="Optimizer",
        widget="dropdown",
        via={
            "llamafactory": ("optim",),
            "axolotl": ("optimizer",),
            "transformers": ("optim",),
            "deepspeed": ("optimizer",),
        },
    ),
    _f(
        "optimizer_in_backward",
        bool,
        False,
        "step each parameter during backward (torchtune)",
        flag=("--optimizer-in-backward/--no-optimizer-in-backward",),
    ),
    _f(
        "batch",
        int,
        1,
        "micro-batch per GPU (default: 1)",
        accepted=">= 1",
        unit="sequences",
        flag=("--batch", "-b"),
        label="Micro-batch per GPU",
        widget="number",
        keys={
            "llamafactory": ("per_device_train_batch_size",),
            "axolotl": ("micro_batch_size",),
            "transformers": ("per_device_train_batch_size",),
            "deepspeed": ("train_micro_batch_size_per_gpu",),
        },
    ),
    _f(
        "seq",
        int,
        512,
        "tokens per sample (default: 512)",
        accepted="1..4194304",
        unit="tokens",
        flag=("--seq", "--cutoff-len", "-s"),
        label="Tokens per sample (cutoff_len)",
        widget="number",
        keys={
            "llamafactory": ("cutoff_len",),
            "axolotl": ("sequence_len",),
            # TRL SFTConfig: max_length since TRL 0.20, max_seq_length before
            "transformers": ("max_length", "max_seq_length"),
        },
    ),
    _f(
        "grad_accum",
        int,
        1,
        "gradient accumulation steps (default: 1)",
        accepted=">= 1",
        unit="steps",
        flag=("--grad-accum",),
        label="Grad. accumulation",
        widget="number",
        keys={
            "llamafactory": ("gradient_accumulation_steps",),
            "axolotl": ("gradient_accumulation_steps",),
            "transformers": ("gradient_accumulation_steps",),
            "deepspeed": ("gradient_accumulation_steps",),
        },
        via={"accelerate": ("deepspeed_config",)},
    ),
    _f(
        "gradient_checkpointing",
        bool,
        None,
        "recompute activations in backward instead of keeping them (default: the profile's)",
        flag=("--gradient-checkpointing/--no-gradient-checkpointing",),
        label="Gradient checkpointing",
        widget="dropdown",
        keys={"transformers": ("gradient_checkpointing", "activation_checkpointing")},
        via={
            "llamafactory": ("disable_gradient_checkpointing",),
            "axolotl": ("gradient_checkpointing", "fsdp_config"),
            "accelerate": ("fsdp_config",),
        },
    ),
    _f(
        "attn",
        str,
        None,
        "attention kernel (default: the profile's)",
        accepted=ATTENTIONS,
        flag=("--attn",),
        label="Attention",
        widget="dropdown",
        via={
            "llamafactory": ("flash_attn",),
            "axolotl": ("flash_attention", "sdp_attention", "eager_attention"),
            "transformers": ("attn_implementation",),
        },
    ),
    _f(
        "gpus",
        int,
        1,
        "GPUs per node (default: 1)",
        accepted=">= 1",
        flag=("--gpus",),
        label="GPUs per node",
        widget="number",
        via={"accelerate": ("num_processes",)},  # the total over all machines
    ),
    _f(
        "nodes",
        int,
        1,
        "nodes (default: 1)",
        accepted=">= 1",
        flag=("--nodes",),
        label="Nodes",
        widget="number",
        keys={"accelerate": ("num_machines",)},
    ),
    _f(
        "zero",
        int,
        0,
        "DeepSpeed ZeRO stage (default: 0)",
        accepted=(0, 1, 2, 3),
        flag=("--zero",),
        label="DeepSpeed ZeRO stage",
        widget="dropdown",
        via={
            "deepspeed": ("zero_optimization", "stage"),
            "accelerate": ("distributed_type", "deepspeed_config", "zero_stage"),
        },
    ),
    _f(
        "fsdp",
        bool,
        False,
        "PyTorch FSDP full shard",
        flag=("--fsdp/--no-fsdp",),
        label="FSDP full shard",
        widget="checkbox",
        via={
            "axolotl": ("fsdp", "fsdp_config"),
            "transformers": ("fsdp",),
            "accelerate": ("distributed_type", "fsdp_config"),
        },
    ),
    _f(
        "fsdp_version",
        int,
        1,
        "FSDP 1 (FullyShardedDataParallel) or 2 (fully_shard) (default: 1)",
        accepted=(1, 2),
        flag=("--fsdp-version",),
        via={"accelerate": ("fsdp_config",)},
    ),
    _f(
        "offload",
        str,
        "none",
        "CPU offload of ZeRO / FSDP states (default: none)",
        accepted=OFFLOADS,
        flag=("--offload",),
        label="CPU offload",
        widget="dropdown",
        via={
            "axolotl": ("fsdp", "fsdp_config"),
            "transformers": ("fsdp",),
            "deepspeed": ("zero_optimization",),
            "accelerate": ("distributed_type", "deepspeed_config", "fsdp_config"),
        },
    ),
    _f(
        "device_map",
        str,
        "none",
        "split the layers over --gpus cards of one process, one card busy at a time (transformers "
        "from_pretrained device_map); none: one data-parallel process per GPU (default: none)",
        accepted=DEVICE_MAPS,
        flag=("--device-map",),
        label="Layers split over the GPUs (device_map)",
        widget="dropdown",
    ),
    _f(
        "framework",
        str,
        "hf",
        "whose defaults and code path (default: hf)",
        accepted=FRAMEWORKS,
        flag=("--framework",),
        label="Framework profile",
        widget="dropdown",
        via={"llamafactory": ("finetuning_type", "use_unsloth"), "axolotl": ("adapter", "base_model")},
    ),
    _f(
        "freeze_trainable_layers",
        int,
        2,
        "method freeze: the last N layers train",
        accepted=">= 1",
        unit="layers",
        via={"llamafactory": ("freeze_trainable_layers",)},  # negative: the first layers train
        methods=("freeze",),
    ),
    _f(
        "ds_reduce_bucket",
        int,
        None,
        "DeepSpeed reduce bucket (default: DeepSpeed's)",
        unit="elements",
        via={"deepspeed": ("zero_optimization", "reduce_bucket_size")},  # "auto" = hidden^2
    ),
    _f(
        "ds_prefetch_bucket",
        int,
        None,
        "DeepSpeed ZeRO-3 prefetch bucket (default: DeepSpeed's)",
        unit="elements",
        via={"deepspeed": ("zero_optimization", "stage3_prefetch_bucket_size")},  # "auto" = 0.9 hidden^2
    ),
    _f(
        "ds_overlap_comm",
        bool,
        None,
        "DeepSpeed overlap_comm (default: on for ZeRO-3 only)",
        via={"deepspeed": ("zero_optimization", "overlap_comm")},  # counted for ZeRO-1/2 only
    ),
    _f(
        "loss",
        str,
        None,
        "cross-entropy kernel (default: the profile's)",
        accepted=LOSSES,
        flag=("--loss",),
        label="Loss kernel",
        widget="dropdown",
        via={  # switches that pick a kernel (ingest/common.py KERNEL_SWITCHES)
            "llamafactory": ("enable_liger_kernel",),
            "axolotl": ("liger_fused_linear_cross_entropy", "cut_cross_entropy", "chunked_cross_entropy"),
            "transformers": ("use_liger_kernel",),
        },
    ),
    _f(
        "activation_offload",
        bool,
        False,
        "offload saved activations to CPU (torchtune)",
        flag=("--activation-offload/--no-activation-offload",),
        label="Offload activations",
        widget="checkbox",
    ),
    _f(
        "compile",
        bool,
        False,
        "torch.compile the layers and the loss",
        flag=("--compile/--no-compile",),
        label="torch.compile",
        widget="checkbox",
        # on-only switches with a note on what is modelled (ingest/common.py KERNEL_SWITCHES)
        via={
            "llamafactory": ("torch_compile",),
            "axolotl": ("torch_compile",),
            "transformers": ("torch_compile",),
        },
    ),
    _f(
        "num_labels",
        int,
        None,
        "train a sequence-classification head with N labels (classifiers, reward models)",
        accepted=">= 1",
        flag=("--num-labels",),
        label="Classifier labels",
        widget="textbox",
    ),
)

BY_NAME: Mapping[str, Field] = MappingProxyType({f.name: f for f in FIELDS})


def get(name: str) -> Field:
    return BY_NAME[name]


def cli_fields() -> tuple[Field, ...]:
    """The rows that are CLI flags, in the table's order (the order of ``--help``)."""
    return tuple(f for f in FIELDS if f.flag)


def web_labels() -> dict[str, str]:
    """Field name -> the label the web page shows (rows that have a widget)."""
    return {f.name: f.label for f in FIELDS if f.label}


def by_key(fmt: str) -> dict[str, str]:
    """Plain keys of ``fmt`` -> field name: the keys whose value a reader copies into the field as is."""
    return {k: f.name for f in plain_fields(fmt) for k in f.keys[fmt]}


def plain_fields(fmt: str, method: str | None = "") -> tuple[Field, ...]:
    """The rows with plain keys in ``fmt``; with ``method`` given, those that apply to it."""
    if fmt not in FORMATS:
        raise KeyError(f"{fmt!r}: formats are {', '.join(FORMATS)}")
    return tuple(f for f in FIELDS if f.keys.get(fmt) and (method == "" or f.applies_to(method)))
