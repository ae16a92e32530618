"""The setup fields, once: type, default, accepted values, unit, help, CLI flag, web label and widget, and
the names each field has in the files people train with.

Every ``TrainSetup`` field has one row here (a test holds the two together: same names, same defaults).
Faces are generated from the rows: ``cli/options.py`` builds the setup flags (name, help, metavar) and
``web/wording.py`` the page's labels. The ``keys`` of a row name the field in LLaMA-Factory YAML, axolotl
YAML, Hugging Face ``TrainingArguments`` / PEFT ``LoraConfig`` / ``BitsAndBytesConfig`` ("transformers"),
DeepSpeed JSON and accelerate YAML. The first key of a format listed in ``plain`` carries the value
unchanged (same meaning, same vocabulary or a number); the other keys feed a hand-written translation in
the reader or writer of that format (``quantization_bit`` sets the method, ``pure_bf16`` the precision).
A test checks that every key the ingest readers and the exporters use for a field is in its row.

Adding a setup field: a row here, the field on ``TrainSetup``, the formula that reads it, its tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tuneplan.specs.setup import (
    ATTENTIONS,
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
    (``()`` = not a flag: the calibration switches and the DeepSpeed details read from a config)."""

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
    plain: frozenset[str] = frozenset()

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
    keys = kw.pop("keys", {})
    return Field(name, type_, default, help, keys=MappingProxyType(dict(keys)), **kw)


_PLAIN_ALL = frozenset(FORMATS)

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
        keys={
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
        keys={
            "llamafactory": ("quantization_bit",),
            "axolotl": ("load_in_4bit", "load_in_8bit"),
            "transformers": ("load_in_4bit", "load_in_8bit"),
        },
        plain=frozenset({"llamafactory"}),
    ),
    _f(
        "quant_type",
        str,
        "nf4",
        "4-bit data type (default: nf4)",
        accepted=QUANT_TYPES,
        flag=("--quant-type",),
        keys={
            "llamafactory": ("quantization_type",),
            "axolotl": ("bnb_config_kwargs",),
            "transformers": ("bnb_4bit_quant_type",),
        },
        plain=frozenset({"llamafactory", "transformers"}),
    ),
    _f(
        "double_quant",
        bool,
        True,
        "nested absmax quantization (default: on)",
        flag=("--double-quant/--no-double-quant",),
        keys={
            "llamafactory": ("double_quantization",),
            "axolotl": ("bnb_config_kwargs",),
            "transformers": ("bnb_4bit_use_double_quant", "use_bnb_nested_quant"),
        },
        plain=frozenset({"llamafactory", "transformers"}),
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
        plain=frozenset({"llamafactory", "axolotl", "transformers"}),
    ),
    _f(
        "alpha",
        int,
        None,
        "LoRA alpha, scaling only, no memory effect (default: 2 x rank)",
        flag=("--alpha",),
        keys={"llamafactory": ("lora_alpha",), "axolotl": ("lora_alpha",), "transformers": ("lora_alpha",)},
        plain=frozenset({"llamafactory", "axolotl", "transformers"}),
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
        plain=frozenset({"llamafactory", "axolotl", "transformers"}),
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
        keys={
            "llamafactory": ("lora_target",),
            "axolotl": ("lora_target_modules", "lora_target_linear"),
            "transformers": ("target_modules",),
        },
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
        keys={
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
        keys={
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
        plain=_PLAIN_ALL - {"accelerate"},
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
            "transformers": ("max_length", "max_seq_length"),
        },
        plain=frozenset({"llamafactory", "axolotl", "transformers"}),
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
        plain=_PLAIN_ALL - {"accelerate"},
    ),
    _f(
        "gradient_checkpointing",
        bool,
        None,
        "recompute activations in backward instead of keeping them (default: the profile's)",
        flag=("--gradient-checkpointing/--no-gradient-checkpointing",),
        label="Gradient checkpointing",
        widget="dropdown",
        keys={
            "llamafactory": ("disable_gradient_checkpointing",),
            "axolotl": ("gradient_checkpointing", "fsdp_config"),
            "transformers": ("gradient_checkpointing",),
        },
        plain=frozenset({"axolotl", "transformers"}),
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
        keys={
            "llamafactory": ("flash_attn",),
            "axolotl": ("flash_attention", "sdp_attention"),
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
        keys={"accelerate": ("num_processes",)},
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
        plain=frozenset({"accelerate"}),
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
        keys={"deepspeed": ("zero_optimization", "stage"), "accelerate": ("distributed_type", "zero_stage")},
    ),
    _f(
        "fsdp",
        bool,
        False,
        "PyTorch FSDP full shard",
        flag=("--fsdp/--no-fsdp",),
        label="FSDP full shard",
        widget="checkbox",
        keys={"axolotl": ("fsdp_config",), "transformers": ("fsdp",), "accelerate": ("distributed_type",)},
    ),
    _f(
        "fsdp_version",
        int,
        1,
        "FSDP 1 (FullyShardedDataParallel) or 2 (fully_shard) (default: 1)",
        accepted=(1, 2),
        flag=("--fsdp-version",),
        keys={"accelerate": ("fsdp_config", "fsdp_version")},
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
        keys={
            "axolotl": ("fsdp_config",),
            "deepspeed": ("zero_optimization",),
            "accelerate": ("distributed_type",),
        },
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
        keys={"llamafactory": ("use_unsloth",)},
    ),
    _f(
        "freeze_trainable_layers",
        int,
        2,
        "method freeze: the last N layers train",
        accepted=">= 1",
        unit="layers",
        keys={"llamafactory": ("freeze_trainable_layers",)},
        plain=frozenset({"llamafactory"}),
    ),
    _f(
        "ds_reduce_bucket",
        int,
        None,
        "DeepSpeed reduce bucket (default: DeepSpeed's)",
        unit="elements",
        keys={"deepspeed": ("reduce_bucket_size",)},
        plain=frozenset({"deepspeed"}),
    ),
    _f(
        "ds_prefetch_bucket",
        int,
        None,
        "DeepSpeed ZeRO-3 prefetch bucket (default: DeepSpeed's)",
        unit="elements",
        keys={"deepspeed": ("stage3_prefetch_bucket_size",)},
        plain=frozenset({"deepspeed"}),
    ),
    _f(
        "ds_overlap_comm",
        bool,
        None,
        "DeepSpeed overlap_comm (default: on for ZeRO-3 only)",
        keys={"deepspeed": ("overlap_comm", "zero_optimization")},
        plain=frozenset({"deepspeed"}),
    ),
    _f("longest_batch_first", bool, False, "the longest batch runs first (calibration: lit-gpt 2023)"),
    _f(
        "loss",
        str,
        None,
        "cross-entropy kernel (default: the profile's)",
        accepted=LOSSES,
        flag=("--loss",),
        label="Loss kernel",
        widget="dropdown",
        keys={"axolotl": ("liger_fused_linear_cross_entropy", "cut_cross_entropy")},
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
        keys={"axolotl": ("torch_compile",), "transformers": ("torch_compile",)},
        plain=frozenset({"axolotl", "transformers"}),
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
        keys={"transformers": ("num_labels",)},
        plain=frozenset({"transformers"}),
    ),
    _f(
        "keep_grads",
        bool,
        False,
        "zero_grad keeps the gradient buffers (torch < 2.0's default)",
        flag=("--keep-grads/--no-keep-grads",),
    ),
    _f(
        "softmax_keeps_input",
        bool,
        False,
        "softmax / log_softmax keep their input for backward (torch < 1.11)",
        flag=("--softmax-keeps-input/--no-softmax-keeps-input",),
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
    """Plain keys of ``fmt`` -> field name: the keys whose value a reader can copy into the field as is."""
    if fmt not in FORMATS:
        raise KeyError(f"{fmt!r}: formats are {', '.join(FORMATS)}")
    return {f.keys[fmt][0]: f.name for f in FIELDS if fmt in f.plain and f.keys.get(fmt)}


def keys_of(fmt: str) -> dict[str, tuple[str, ...]]:
    """Field name -> every key of ``fmt`` that carries it (plain or translated)."""
    return {f.name: f.keys[fmt] for f in FIELDS if f.keys.get(fmt)}


def by_llamafactory_key() -> dict[str, str]:
    return by_key("llamafactory")


def by_axolotl_key() -> dict[str, str]:
    return by_key("axolotl")


def by_transformers_key() -> dict[str, str]:
    return by_key("transformers")


def by_deepspeed_key() -> dict[str, str]:
    return by_key("deepspeed")


def by_accelerate_key() -> dict[str, str]:
    return by_key("accelerate")
