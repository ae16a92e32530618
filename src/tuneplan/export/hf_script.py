"""A complete, runnable training script (transformers Trainer + PEFT + bitsandbytes) for the plan.

The script is ``train_script.py`` beside this file with its PLAN block and docstring filled in, so the
code that runs is code the tests run. Each plan setting maps to what the HF stack does with it
(the dtypes are those ``estimator/dtypes.py`` assumes for the ``hf`` profile):
- ``-mixed`` precisions: the Trainer's ``bf16``/``fp16`` (autocast); a full or freeze fine-tune keeps
  its trainable parameters in fp32 (loaded in fp32 / cast), LoRA loads the frozen base in 16 bits and
  PEFT keeps the adapters in fp32; pure ``bf16``/``fp16`` load everything in 16 bits;
- QLoRA: ``BitsAndBytesConfig`` (bits, nf4/fp4, double quant, compute dtype) and
  ``prepare_model_for_kbit_training``; LoRA targets the modules the plan resolved for this
  architecture (``all-linear`` stays PEFT's own shorthand);
- optimizer -> ``optim``; attention -> ``attn_implementation``; checkpointing, batch, accumulation,
  sequence length (every row padded to it), DeepSpeed JSON / FSDP settings.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from tuneplan.errors import TuneplanError
from tuneplan.export.common import header_lines, launch_line, plain_keys, trainer_kernels
from tuneplan.ingest.common import OPTIMIZER_TO_HF
from tuneplan.specs.lora_targets import resolve_targets
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.api import Estimate

HF_ATTN = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}
_START, _END = "# --- PLAN START ---\n", "# --- PLAN END ---\n"


def script_plan(model: ModelSpec, setup: TrainSetup, deepspeed_file: str | None = None) -> dict:
    s = setup
    if s.optimizer_in_backward:
        raise TuneplanError("the transformers Trainer has no optimizer-in-backward",
                            field="optimizer_in_backward",
                            accepted="{optimizer_in_backward=false}, or a torchtune recipe")
    trainer_kernels(s, "the transformers Trainer")
    if s.precision == "fp16" and s.method in ("full", "freeze"):
        raise TuneplanError("the Trainer's fp16 loss scaler refuses fp16 gradients "
                            "(pure fp16 full/freeze tuning)",
                            field="precision", accepted="fp16-mixed, bf16, bf16-mixed, fp32")
    half = ("bfloat16" if s.precision.startswith("bf16")
            else "float16" if s.precision.startswith("fp16") else "float32")
    mixed = s.precision.endswith("-mixed")
    # full fine-tune under '-mixed': the fp32 master is the model itself (Trainer + autocast)
    load = "float32" if (s.precision == "fp32" or (mixed and s.method == "full")) else half
    # PEFT resolves the literal "all-linear" itself and, on the MoE types it converts for transformers 5,
    # adds the fused experts and the router (transformers_weight_conversion._resolve_string_target_modules);
    # the estimate's all-linear is the nn.Linear names (specs/lora_targets.resolve_targets): a MoE script
    # lists them, so that the run adapts what was estimated
    if not s.is_lora or (s.targets in ("all", "all-linear") and not model.is_moe):
        targets: list[str] | str = "all-linear"
    else:
        chosen = resolve_targets(model, s.targets)
        targets = [n for n in model.linear_names() if n in chosen]
    fsdp = ""
    if s.fsdp:
        if s.offload == "optimizer":
            raise TuneplanError("FSDP has no optimizer-only offload", field="offload",
                                accepted="{offload=all} with {fsdp}, or {zero=2|3} {offload=optimizer}")
        fsdp = "full_shard auto_wrap" + (" offload" if s.offload == "all" else "")
    return {
        "model": model.name,
        "method": s.method,
        "bits": s.quant_bits,
        "quant_type": s.quant_type,
        "double_quant": s.double_quant,
        "lora": {"r": s.rank, "alpha": s.alpha if s.alpha is not None else 2 * s.rank,
                 "dropout": float(s.dropout or 0.0), "targets": targets},
        "freeze_trainable_layers": s.freeze_trainable_layers,
        "load_dtype": load,
        "trainable_fp32": mixed and s.method == "freeze",
        "compute_dtype": half,
        "bf16": half == "bfloat16",
        "fp16": half == "float16",
        "optim": OPTIMIZER_TO_HF[s.optimizer or "adamw-fused"],
        # TrainingArguments / SFTConfig names, from the field table
        **plain_keys(s.replace(gradient_checkpointing=bool(s.gradient_checkpointing)), "transformers",
                     ("batch", "grad_accum", "seq", "gradient_checkpointing")),
        "use_liger_kernel": s.loss == "fused-linear",
        "torch_compile": s.compile,
        "attn_implementation": HF_ATTN[s.attn or "sdpa"],
        "deepspeed": (deepspeed_file or "ds_config.json") if s.zero else None,
        "fsdp": fsdp,
        "fsdp_version": s.fsdp_version,
        "world_size": s.world_size,
    }


def render_hf_script(est: Estimate, *, deepspeed_file: str | None = None, dataset: str = "data.jsonl") -> str:
    """The training script for the plan ``est`` estimated (its model, setup and card)."""
    model, setup, acc = est.model, est.setup, est.gpu
    template = resources.files("tuneplan.export").joinpath("train_script.py").read_text(encoding="utf-8")
    head, rest = template.split(_START, 1)
    _, tail = rest.split(_END, 1)
    from tuneplan.compat import version_floors

    plan = script_plan(model, setup, deepspeed_file)
    # known breakages on the planned card for some versions: pinned below and checked before training
    plan["version_floors"] = version_floors(acc, setup, model) if acc is not None else {}
    if setup.device_map != "none":
        from tuneplan.estimator.device_map import assumed_max_memory

        plan["device_map"] = setup.device_map
        plan["max_memory"] = assumed_max_memory(setup, acc)
    needs = ["torch", "'transformers>=4.56'", "'peft>=0.13'", "accelerate"]  # quoted for the shell
    if (setup.method == "qlora"
            or plan["optim"] in ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit")):
        needs.append("bitsandbytes")
    if setup.zero:
        needs.append("deepspeed")
    if setup.attn == "flash":
        needs.append("flash-attn")
    if setup.loss == "fused-linear":
        needs.append("liger-kernel")
    for dist, floor in plan["version_floors"].items():
        needs = [n for n in needs if n != dist] + [f"'{dist}>={floor}'"]
    doc = [f"Fine-tune {model.name} ({setup.method}) with the transformers Trainer, "
           "as planned by tuneplan.", ""]
    doc += header_lines(est)
    doc += ["", f"Run:   {launch_line(setup, 'python train.py' if setup.world_size == 1 else 'train.py')} "
                f"--dataset {dataset}",
            "Smoke: python train.py --model-config config.json --dataset random:8 --max-steps 1 --cpu"
            + ("  (LoRA/full plans only: bitsandbytes needs a GPU)" if setup.method == "qlora" else ""),
            f"Needs: pip install {' '.join(needs)}"]
    shebang, _, body = head.partition('"""')
    _, _, body = body.partition('"""')  # drop the template's own docstring
    # The docstring holds user text (model path, dataset): backslashes doubled so that a path with \U or
    # \N compiles and reads back unchanged, triple quotes turned to single ones.
    doc_text = "\n".join(doc).replace("\\", "\\\\").replace('"""', "'''").replace("\x00", "")
    text = shebang + '"""' + doc_text + '\n"""' + body
    block = "PLAN = {\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in plan.items()) + "}\n"
    return text + _START + block + _END + tail
