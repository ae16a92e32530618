"""The plan as a command line for Answer.AI's fsdp_qlora ``train.py`` (github.com/AnswerDotAI/fsdp_qlora).

A shell script with one ``python train.py --flag value ...`` line, run from a clone of that repository.
Every flag is one of train.py's ``main()`` parameters (fastcore ``call_parse``: each parameter a
``--flag``; the test holds the list as of the commit it names) and each value one its choices accept.
What each plan setting becomes (the fsdp-qlora profile reads the same script, specs/profiles.py):

- method -> ``--train_type`` lora / qlora (4-bit NF4 with double quantization: train.py's Linear4bit has
  nothing else) / full; precision -> ``--precision`` bf16 / fp32 / bf16_autocast / fp16_autocast (train.py
  has no pure fp16);
- ``--sharding_strategy full_shard`` with ``--fsdp``; on several GPUs without it ``ddp`` (FSDP NO_SHARD,
  which tuneplan estimates as DDP); CPU offload ``all`` -> ``--use_cpu_offload true`` (FSDP1 offloads
  parameters, gradients and the optimizer step together, so ``optimizer`` alone has no flag);
- LoRA targets: train.py takes ``all`` (k, q, v, up, down, gate) or ``default`` (PEFT's mapping) only;
- ``--reentrant_checkpointing true`` for QLoRA: train.py's README asks for it with bitsandbytes, whose
  non-reentrant path triggers a memory bug; the figures hold for that run;
- ``--dataset dummy`` (each sample truncated at the context length, the length tuneplan assumes for
  every row) unless a dataset of train.py's list is given.

Plans the script cannot run as planned are refused, naming the field: train.py wraps and checkpoints only
Llama and Mistral decoder layers, has one attention path (SDPA), no DeepSpeed, no 8-bit base.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.errors import TuneplanError
from tuneplan.export.common import header_lines, trainer_kernels
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import get_profile, peft_default_targets
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.api import Estimate

REPO = "https://github.com/AnswerDotAI/fsdp_qlora"
# train.py names LlamaDecoderLayer / MistralDecoderLayer in its auto-wrap policy and checkpointing check_fn
MODEL_TYPES = ("llama", "mistral")
PRECISION = {"bf16": "bf16", "fp32": "fp32", "bf16-mixed": "bf16_autocast", "fp16-mixed": "fp16_autocast"}
TRAIN_TYPE = {"full": "full", "lora": "lora", "qlora": "qlora"}
OPTIMIZER = {"adamw": "adamw", "sgd": "sgd"}
DATASETS = ("alpaca", "alpaca_sample", "dummy", "guanaco", "sql", "orca_math")


def _flag(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _refuse_what_train_py_lacks(model: ModelSpec, s: TrainSetup) -> None:
    """A TuneplanError naming the first field train.py cannot run as planned."""
    # train.py has activation offloading (torch offload_wrapper around the whole model): the rest is the
    # Trainer's list of what an HF-code run cannot express
    trainer_kernels(s.replace(activation_offload=False), "fsdp_qlora's train.py")
    quant_ok = s.quant_bits == 4 and s.quant_type == "nf4" and s.double_quant
    refusals: tuple[tuple[bool, str, str, object], ...] = (
        (s.loss not in (None, "upcast"), "loss",
         "train.py computes transformers' own cross-entropy on the whole logits",
         "upcast, or leave {loss} unset"),
        (model.model_type not in MODEL_TYPES, "model",
         f"train.py wraps and checkpoints only Llama and Mistral decoder layers, not {model.model_type}",
         "a llama or mistral model"),
        (s.method not in TRAIN_TYPE, "method", f"train.py has no {s.method!r} train type", tuple(TRAIN_TYPE)),
        (s.method == "qlora" and not quant_ok, "bits",
         "train.py quantizes with bitsandbytes Linear4bit, NF4 with double quantization only",
         "{bits=4} {quant_type=nf4} {double_quant=true}"),
        (s.precision not in PRECISION, "precision", f"train.py has no {s.precision} precision",
         tuple(PRECISION)),
        (s.optimizer not in OPTIMIZER, "optimizer", f"train.py has no {s.optimizer} optimizer",
         tuple(OPTIMIZER)),
        (s.attn != "sdpa", "attn", "train.py always loads the model with attn_implementation='sdpa'", "sdpa"),
        (bool(s.zero), "zero", "train.py shards with FSDP, not DeepSpeed", "{fsdp} with {zero=0}"),
        (s.offload == "optimizer", "offload",
         "train.py's FSDP CPUOffload moves parameters, gradients and the optimizer step together",
         "none, all"),
        (s.nodes > 1, "nodes", "this recipe starts one node (train.py spawns a process per local GPU)", "1"),
        (s.fsdp and s.fsdp_version != 1, "fsdp_version",
         "train.py wraps with FullyShardedDataParallel (FSDP1)", "1"),
        (s.optimizer_in_backward, "optimizer_in_backward", "train.py has no optimizer-in-backward",
         "{optimizer_in_backward=false}"),
        (s.compile, "compile", "train.py does not compile the model", "{compile=false}"),
    )
    for refused, field, message, accepted in refusals:
        if refused:
            raise TuneplanError(message, field=field, accepted=accepted)  # type: ignore[arg-type]


def _targets_flag(model: ModelSpec, s: TrainSetup) -> str:
    chosen = resolve_targets(model, s.targets)
    for flag, names in (("all", get_profile("fsdp-qlora").default_targets),
                        ("default", peft_default_targets(model))):
        if chosen == resolve_targets(model, names):
            return flag
    raise TuneplanError(f"train.py's lora_target_modules takes 'all' or 'default', not {s.targets}",
                        field="targets", accepted=(get_profile("fsdp-qlora").default_targets,
                                                   peft_default_targets(model)))


def train_py_flags(model: ModelSpec, setup: TrainSetup, dataset: str | None = None) -> list[tuple[str, str]]:
    """(flag, value) pairs of the ``python train.py`` line that runs ``setup`` (resolved) on ``model``."""
    s = setup
    _refuse_what_train_py_lacks(model, s)
    if dataset is not None and dataset not in DATASETS:
        raise TuneplanError(f"train.py has no dataset {dataset!r}", field="dataset", accepted=DATASETS)
    flags: list[tuple[str, object]] = [
        ("model_name", model.name), ("train_type", TRAIN_TYPE[s.method]),
        ("precision", PRECISION[s.precision]), ("world_size", s.gpus), ("batch_size", s.batch),
        ("context_length", s.seq),
        ("gradient_accumulation_steps", s.grad_accum),
        ("sharding_strategy", "full_shard" if s.fsdp or s.gpus == 1 else "ddp"),
        ("use_cpu_offload", s.offload == "all"), ("use_activation_cpu_offload", s.activation_offload),
        ("use_gradient_checkpointing", bool(s.gradient_checkpointing)),
    ]
    if s.gradient_checkpointing:
        flags.append(("reentrant_checkpointing", s.method == "qlora"))
    flags += [("low_memory", True), ("optimizer", OPTIMIZER[str(s.optimizer)])]
    if s.is_lora:
        flags += [("lora_rank", s.rank), ("lora_dropout", s.dropout),
                  ("lora_target_modules", _targets_flag(model, s))]
        if s.alpha is not None:
            flags.append(("lora_alpha", s.alpha))
    flags.append(("dataset", dataset or "dummy"))
    return [(k, _flag(v)) for k, v in flags]


def render_fsdp_qlora(est: Estimate, dataset: str | None = None) -> str:
    """A bash script: the plan ``est`` estimated as comments, then the train.py command line."""
    model, setup = est.model, est.setup
    flags = train_py_flags(model, setup, dataset)
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {line}" for line in header_lines(est)]
    lines += [f"# Run from a clone of {REPO} (train.py spawns one process per GPU itself).",
              "# train.py pads each batch to its longest sample, cut at --context_length; the estimate",
              "# assumes every sample reaches it (as --dataset dummy does).",
              "set -euo pipefail", "python train.py \\"]
    body = [f"  --{k} {v}" for k, v in flags]
    lines += [b + " \\" for b in body[:-1]] + [body[-1]]
    return "\n".join(lines) + "\n"
