"""Tell a config file's kind from its keys, and hand it to that kind's reader.

A file can be forced to a kind with ``KIND:PATH`` (e.g. ``deepspeed:zero.json``) when its keys are
ambiguous. A model ``config.json`` given with ``--from`` names the model (a local path).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tuneplan.errors import ConfigError
from tuneplan.ingest.accelerate import read_accelerate
from tuneplan.ingest.axolotl import read_axolotl
from tuneplan.ingest.common import Collector, Ingested
from tuneplan.ingest.deepspeed import read_deepspeed
from tuneplan.ingest.document import Document, load_document
from tuneplan.ingest.hf_args import read_bnb, read_hf_args, read_peft
from tuneplan.ingest.llamafactory import read_llamafactory


def _read_model_config(doc: Document) -> Ingested:
    c = Collector(doc, "model-config", "model config")
    c.out.model = str(Path(doc.path))
    c.out.model_source = f"model config {doc.path}"
    return c.out


READERS: dict[str, Callable[[Document], Ingested]] = {
    "llamafactory": read_llamafactory,
    "axolotl": read_axolotl,
    "hf-args": read_hf_args,
    "peft": read_peft,
    "bitsandbytes": read_bnb,
    "deepspeed": read_deepspeed,
    "accelerate": read_accelerate,
    "model-config": _read_model_config,
}
KINDS = tuple(READERS)

_LF_KEYS = {"finetuning_type", "cutoff_len", "lora_target", "quantization_bit", "template", "stage",
            "pure_bf16",
            "flash_attn", "disable_gradient_checkpointing", "lora_rank"}
_AXOLOTL_KEYS = {"base_model", "micro_batch_size", "sequence_len", "lora_target_linear", "adapter",
                 "datasets",
                 "sample_packing", "flash_attention", "num_epochs", "lora_model_dir"}
_HF_KEYS = {"per_device_train_batch_size", "output_dir", "gradient_accumulation_steps", "use_peft",
            "max_length",
            "max_seq_length", "optim", "bf16", "fp16", "gradient_checkpointing", "learning_rate",
            "dataset_name",
            "num_train_epochs"}


def detect_kind(doc: Document) -> str:
    keys = set(doc.data)
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu",
               "train_batch_size"} and not keys & _HF_KEYS - {
            "gradient_accumulation_steps", "bf16", "fp16"}:
        return "deepspeed"
    if "distributed_type" in keys or "compute_environment" in keys:
        return "accelerate"
    if "model_type" in keys and keys & {"hidden_size", "n_embd", "d_model", "num_hidden_layers",
                                        "text_config"}:
        return "model-config"
    if "peft_type" in keys or {"r", "target_modules"} <= keys:
        return "peft"
    if keys & _LF_KEYS:
        return "llamafactory"
    if keys & _AXOLOTL_KEYS:
        return "axolotl"
    if keys & _HF_KEYS:
        return "hf-args"  # TrainingArguments JSON, or a TRL SFTConfig / ModelConfig YAML
    if doc.data.get("quant_method") == "bitsandbytes" or keys & {"load_in_4bit", "load_in_8bit",
                                                                 "_load_in_4bit"}:
        return "bitsandbytes"
    shown = ", ".join(sorted(map(str, keys))[:8]) + (" ..." if len(keys) > 8 else "")
    raise ConfigError(f"{doc.path}: cannot tell what kind of training config this is (keys: {shown})",
                      field="from", field_is_key=False,
                      accepted="LLaMA-Factory YAML, axolotl YAML, TrainingArguments JSON, "
                      "PEFT adapter_config.json, BitsAndBytesConfig JSON, DeepSpeed JSON, accelerate YAML; "
                      "or force one with KIND:PATH, KIND in " + ", ".join(KINDS))


def split_kind(spec: str) -> tuple[str | None, str]:
    """``deepspeed:ds.json`` -> ("deepspeed", "ds.json"); a plain path -> (None, path)."""
    head, sep, tail = spec.partition(":")
    if sep and head in READERS:
        return head, tail
    return None, spec


def read_config(spec: str | Path, kind: str | None = None) -> Ingested:
    """Read one config file (``KIND:PATH`` forces the kind) into an :class:`Ingested`."""
    forced, path = split_kind(str(spec)) if kind is None else (kind, str(spec))
    if forced is not None and forced not in READERS:
        raise ConfigError(f"unknown config kind {forced!r}", field="from", field_is_key=False, accepted=KINDS)
    doc = load_document(path)
    return READERS[forced or detect_kind(doc)](doc)


def read_inline_deepspeed(data: dict, where: str) -> Ingested:
    """A DeepSpeed config given inline (TrainingArguments.deepspeed as a dict)."""
    return read_deepspeed(Document(path=where, data=data, fmt="json"))
