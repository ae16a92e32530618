"""LLaMA-Factory training YAML (``llamafactory-cli train F``) with LLaMA-Factory's own key names.

Keys and values are those of LLaMA-Factory 0.9.5's hparams (model_args.py, finetuning_args.py,
data_args.py) and of the transformers TrainingArguments it extends; the tests validate every key and
choice against a record of both. Layout follows LLaMA-Factory's examples (### model / method / dataset /
output / train). Settings LLaMA-Factory would otherwise default differently from the plan are written
out (``lora_rank`` defaults to 8 there, ``cutoff_len`` to 2048, the batch to the Trainer's 8, and
checkpointing is on unless ``disable_gradient_checkpointing``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tuneplan.errors import TuneplanError
from tuneplan.export.common import header_lines, plain_keys, trainer_kernels
from tuneplan.ingest.common import OPTIMIZER_TO_HF
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.api import Estimate

LF_ATTN = {"sdpa": "sdpa", "flash": "fa2", "eager": "disabled"}  # LLaMA-Factory AttentionFunction values

# Chat template by model_type (LLaMA-Factory data/template.py names); "default" otherwise. Only the
# prompt format depends on it, not memory.
TEMPLATES = {
    "qwen2": "qwen", "qwen2_moe": "qwen", "qwen3": "qwen3", "qwen3_moe": "qwen3", "mistral": "mistral",
    "mixtral": "mistral", "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
    "phi3": "phi", "phi": "default", "chatglm": "glm4", "glm4": "glm4", "deepseek_v3": "deepseek3",
    "deepseek_v2": "deepseek", "falcon": "falcon", "internlm2": "intern2",
}


def template_for(model: ModelSpec) -> str:
    if model.model_type == "llama":
        return "llama3" if model.vocab >= 128000 else "llama2"  # Llama 3's 128256-token vocabulary
    return TEMPLATES.get(model.model_type, "default")


def lora_target_value(model: ModelSpec, targets: str | None) -> str:
    if targets in ("all", "all-linear"):
        return "all"
    chosen = resolve_targets(model, targets)
    return ",".join(n for n in model.linear_names() if n in chosen)


def _precision_keys(setup: TrainSetup) -> dict[str, Any]:
    p = setup.precision
    if p == "bf16-mixed":
        return {"bf16": True}
    if p == "fp16-mixed":
        return {"fp16": True}
    if p == "bf16":
        return {"pure_bf16": True}
    if p == "fp16":
        raise TuneplanError("LLaMA-Factory has no pure-fp16 training", field="precision",
                            accepted="fp16-mixed, bf16, bf16-mixed (or {format=hf-script})")
    if setup.method != "full":
        raise TuneplanError("LLaMA-Factory loads the frozen weights in bf16/fp16 whenever the card has them "
                            "(infer_optim_dtype), so an fp32 adapter or freeze run is not expressible",
                            field="precision",
                            accepted="bf16-mixed, fp16-mixed, bf16 (or {format=hf-script})")
    return {}  # no flag: full fine-tune in fp32 (trainable parameters are cast to fp32)


def llamafactory_config(model: ModelSpec, setup: TrainSetup, acc: Accelerator | None = None, *,
                        deepspeed_file: str | None = None, dataset: str = "alpaca_en_demo",
                        output_dir: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The YAML's sections, in LLaMA-Factory's example order."""
    s = setup
    model_sec: dict[str, Any] = {"model_name_or_path": model.name, "trust_remote_code": True}
    if s.method == "qlora":
        model_sec["quantization_bit"] = s.quant_bits
        model_sec["quantization_method"] = "bnb"
        if s.quant_bits == 4:
            model_sec.update(plain_keys(s, "llamafactory", ("quant_type", "double_quant")))
    model_sec["flash_attn"] = LF_ATTN[s.attn or "sdpa"]
    model_sec["disable_gradient_checkpointing"] = not s.gradient_checkpointing

    method: dict[str, Any] = {"stage": "sft", "do_train": True,
                              "finetuning_type": "lora" if s.is_lora else s.method}
    if s.is_lora:
        method.update(plain_keys(s, "llamafactory", ("rank", "alpha", "dropout")))
        method["lora_target"] = lora_target_value(model, s.targets)
    if s.method == "freeze":
        method["freeze_trainable_layers"] = s.freeze_trainable_layers
        method["freeze_trainable_modules"] = "all"
    if s.zero:
        method["deepspeed"] = deepspeed_file or f"ds_z{s.zero}_config.json"
    method.update({k: v for k, v in _precision_keys(s).items() if k == "pure_bf16"})

    data = {"dataset": dataset, "template": template_for(model), **plain_keys(s, "llamafactory", ("seq",)),
            "overwrite_cache": True, "preprocessing_num_workers": 16, "dataloader_num_workers": 4}
    short = model.name.split("/")[-1].lower()
    output = {"output_dir": output_dir or f"saves/{short}/{'lora' if s.is_lora else s.method}/sft",
              "logging_steps": 10, "save_steps": 500, "plot_loss": True, "report_to": "none"}
    train: dict[str, Any] = {
        **plain_keys(s, "llamafactory", ("batch", "grad_accum")),
        "learning_rate": 1.0e-4 if s.is_lora else 1.0e-5,
        "num_train_epochs": 3.0,
        "lr_scheduler_type": "cosine",
        "optim": OPTIMIZER_TO_HF[s.optimizer or "adamw-fused"],
        "ddp_timeout": 180000000,
    }
    trainer_kernels(s, "LLaMA-Factory")
    if s.loss == "fused-linear":
        train["enable_liger_kernel"] = True
    if s.compile:
        train["torch_compile"] = True
    if s.optimizer_in_backward:
        raise TuneplanError("LLaMA-Factory has no optimizer-in-backward", field="optimizer_in_backward",
                            accepted="{optimizer_in_backward=false}")
    train.update({k: v for k, v in _precision_keys(s).items() if k != "pure_bf16"})
    return [("model", model_sec), ("method", method), ("dataset", data), ("output", output), ("train", train)]


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):  # YAML 1.1 reads 1.0e-04 as a float only with the dot and the exponent sign
        return f"{v:.1e}" if 0 < abs(v) < 1e-3 else repr(v)
    if isinstance(v, int):
        return str(v)
    s = str(v)
    plain = s and s[0].isalnum() and not any(c in s for c in ":#{}[]&*!|>'\"%@`") and \
        s.lower() not in ("true", "false", "null", "yes", "no", "on", "off", "~")
    return s if plain else json.dumps(s)


def render_llamafactory(est: Estimate, *, deepspeed_file: str | None = None,
                        accelerate_file: str | None = None, dataset: str = "alpaca_en_demo") -> str:
    """The LLaMA-Factory YAML for the plan ``est`` estimated (its model, setup and card)."""
    model, setup, acc = est.model, est.setup, est.gpu
    lines = [f"# {line}" for line in header_lines(est)]
    if setup.fsdp:
        lines.append(f"# Launch: accelerate launch --config_file {accelerate_file or 'accelerate_fsdp.yaml'} "
                     "src/train.py THIS_FILE   (from the LLaMA-Factory folder)")
    elif setup.world_size > 1:
        env = f"FORCE_TORCHRUN=1 NPROC_PER_NODE={setup.gpus}"
        if setup.nodes > 1:
            env += f" NNODES={setup.nodes} NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=29500"
        lines.append(f"# Launch: {env} llamafactory-cli train THIS_FILE")
    else:
        lines.append("# Launch: llamafactory-cli train THIS_FILE")
    for title, sec in llamafactory_config(model, setup, acc, deepspeed_file=deepspeed_file, dataset=dataset):
        lines.append("")
        lines.append(f"### {title}")
        lines.extend(f"{k}: {_scalar(v)}" for k, v in sec.items())
    return "\n".join(lines) + "\n"
