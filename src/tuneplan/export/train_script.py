#!/usr/bin/env python3
"""Fine-tune a causal LM with the transformers Trainer + PEFT (+ bitsandbytes), as planned by tuneplan.

This file is the template of ``tuneplan export --format hf-script``: the exporter replaces this
docstring with the plan and the block between the PLAN markers with the plan's settings. It is also a
working script on its own (a tiny LoRA plan), which the tests run for one step on the CPU.

Needs: torch, transformers>=4.56, peft>=0.13, accelerate; bitsandbytes for 4/8-bit bases and 8-bit or
paged optimizers; datasets for a Hub dataset; deepspeed for a --deepspeed config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# --- PLAN START ---
PLAN = {
    "model": "tiny-llama",
    "method": "lora",
    "bits": None,
    "quant_type": "nf4",
    "double_quant": True,
    "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", "v_proj"]},
    "freeze_trainable_layers": 2,
    "load_dtype": "bfloat16",
    "trainable_fp32": False,
    "compute_dtype": "bfloat16",
    "bf16": True,
    "fp16": False,
    "optim": "adamw_torch_fused",
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "max_length": 32,
    "gradient_checkpointing": True,
    "attn_implementation": "sdpa",
    "deepspeed": None,
    "fsdp": "",
    "fsdp_version": 1,
    "world_size": 1,
    "device_map": None,
    "max_memory": None,
    "version_floors": {},
}
# --- PLAN END ---

BNB_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")


def fsdp_config(plan: dict, checkpointing: bool) -> dict:
    """The Trainer's ``fsdp_config`` for the FSDP version the plan was estimated with. The version is
    written out because the Trainer's default changed (FSDP1 in transformers 4.x, FSDP2 in 5.x:
    ``TrainingArguments._process_fsdp_args``), and FSDP1's backward prefetch because the Trainer's default
    there is NO_PREFETCH while the plan assumes BACKWARD_PRE (accelerate's launcher default)."""
    cfg = {"version": plan.get("fsdp_version", 1), "cpu_ram_efficient_loading": True,
           "activation_checkpointing": checkpointing}
    if cfg["version"] == 1:
        cfg.update(use_orig_params=True, sync_module_states=True, backward_prefetch="backward_pre")
    return cfg


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=PLAN["model"], help="HF id or local folder with the weights")
    p.add_argument("--model-config", help="a config.json (or folder): build the model with random weights, "
                   "no download (a smoke test of the plan)")
    p.add_argument("--tokenizer", help="tokenizer id or folder (default: --model)")
    p.add_argument("--dataset", required=True, help="a .jsonl/.json/.txt file, a Hub dataset id, or random:N "
                   "(N random sequences of the planned length: a smoke test without a tokenizer)")
    p.add_argument("--text-field", default="text", help="field holding the text in the dataset rows")
    p.add_argument("--split", default="train")
    p.add_argument("--output-dir", default="output")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after N optimizer steps (-1: all epochs)")
    p.add_argument("--learning-rate", type=float,
                   default=2e-4 if PLAN["method"] in ("lora", "qlora") else 1e-5)
    p.add_argument("--logging-steps", type=int, default=10)
    beside = (os.path.join(os.path.dirname(os.path.abspath(__file__)), PLAN["deepspeed"])
              if PLAN["deepspeed"] else None)
    p.add_argument("--deepspeed", default=beside,
                   help="DeepSpeed JSON (default: the one written beside this script)")
    p.add_argument("--cpu", action="store_true", help="smoke test on the CPU (fp32, no quantization)")
    return p.parse_args(argv)


def refuse_on_cpu(plan: dict) -> None:
    if plan["method"] == "qlora":
        sys.exit("QLoRA needs a CUDA GPU (bitsandbytes 4/8-bit kernels); run this on the planned GPU")
    if plan["optim"] in BNB_OPTIMIZERS:
        sys.exit(f"optimizer {plan['optim']} needs bitsandbytes on a CUDA GPU")
    if plan["deepspeed"] or plan["fsdp"]:
        sys.exit("DeepSpeed / FSDP plans need the planned GPUs")


def version_tuple(text: str) -> tuple:
    """'0.47.0' -> (0, 47, 0); a local or pre-release suffix ('2.5.5+cu126', '0.47.0.dev0') is ignored."""
    parts = []
    for p in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit()) if p[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts + [0] * (3 - len(parts)))


def check_versions(plan: dict) -> None:
    """Stop before training when a library the plan pins is missing or older than its floor: a breakage
    known on the planned card for older versions (the plan's version_floors)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist, floor in (plan.get("version_floors") or {}).items():
        try:
            have = version(dist)
        except PackageNotFoundError:
            sys.exit(f"this plan needs {dist} >= {floor}: pip install '{dist}>={floor}'")
        if version_tuple(have) < version_tuple(floor):
            sys.exit(f"{dist} {have} is installed; on the planned card this plan needs {dist} >= {floor} "
                     f"(older versions fail there): pip install '{dist}>={floor}'")


def runtime_plan(args: argparse.Namespace, torch) -> dict:
    """The plan, adjusted only for a CPU smoke test (which cannot run bitsandbytes or 16-bit autocast)."""
    plan = json.loads(json.dumps(PLAN))
    if args.cpu or not torch.cuda.is_available():
        refuse_on_cpu(plan)
        print("no CUDA device (or --cpu): smoke run on the CPU in fp32, without mixed precision")
        plan.update(bf16=False, fp16=False, load_dtype="float32", compute_dtype="float32",
                    trainable_fp32=False)
        if plan["attn_implementation"] == "flash_attention_2":
            plan["attn_implementation"] = "sdpa"
        args.cpu = True
        return plan
    check_versions(plan)
    if plan["bf16"] or plan["load_dtype"] == "bfloat16":
        if not torch.cuda.is_bf16_supported():
            sys.exit("this GPU has no bf16 (compute capability < 8.0): re-plan with --precision fp16-mixed")
    return plan


def load_model(args: argparse.Namespace, plan: dict, torch):
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, plan["load_dtype"])
    kw = {"dtype": dtype, "attn_implementation": plan["attn_implementation"]}
    if plan["method"] == "qlora":
        from transformers import BitsAndBytesConfig

        compute = getattr(torch, plan["compute_dtype"])
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=plan["bits"] == 4, load_in_8bit=plan["bits"] == 8,
            bnb_4bit_quant_type=plan["quant_type"], bnb_4bit_use_double_quant=plan["double_quant"],
            bnb_4bit_compute_dtype=compute,
            # FSDP / ZeRO-3 shard the 4-bit storage: it must share the dtype of the other parameters.
            bnb_4bit_quant_storage=compute if (plan["fsdp"] or plan["deepspeed"]) else torch.uint8,
        )
        if not (plan["fsdp"] or plan["deepspeed"]):
            kw["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    if plan.get("device_map") and not args.cpu:
        # one process, the layers split over the visible cards (transformers + accelerate place them)
        kw["device_map"] = plan["device_map"]
        if plan.get("max_memory"):
            kw["max_memory"] = {int(card): int(n) for card, n in plan["max_memory"].items()}
    if args.model_config:
        config = AutoConfig.from_pretrained(args.model_config)
        if plan["method"] == "qlora":  # bitsandbytes quantizes while loading: save random weights, reload
            import tempfile

            folder = tempfile.mkdtemp(prefix="tuneplan-random-")
            AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
            return AutoModelForCausalLM.from_pretrained(folder, **kw)
        return AutoModelForCausalLM.from_config(config, **kw)
    return AutoModelForCausalLM.from_pretrained(args.model, **kw)


def decoder_layers(model):
    """The ModuleList of decoder blocks (its length is num_hidden_layers)."""
    import torch.nn as nn

    n = getattr(model.config, "num_hidden_layers", None)
    for _, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    sys.exit("cannot find the decoder layers to freeze")


def apply_method(model, plan: dict, torch):
    method = plan["method"]
    if method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    if method == "freeze":  # LLaMA-Factory's freeze tuning: only the last N decoder layers train
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in list(decoder_layers(model))[-plan["freeze_trainable_layers"]:]:
            for p in layer.parameters():
                p.requires_grad_(True)
                if plan["trainable_fp32"]:
                    p.data = p.data.float()
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if method == "qlora":
        # casts the non-quantized 16-bit parameters to fp32 and enables checkpointing if planned
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=plan["gradient_checkpointing"],
            gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = plan["lora"]
    config = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                        target_modules=lora["targets"], task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class Rows:
    """A list of tokenized rows as a torch-style dataset."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def read_texts(args: argparse.Namespace) -> list[str]:
    path = args.dataset
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                return [json.loads(line)[args.text_field] for line in f if line.strip()]
            if path.endswith(".json"):
                return [row[args.text_field] for row in json.load(f)]
            return [line.rstrip("\n") for line in f if line.strip()]
    from datasets import load_dataset

    return list(load_dataset(path, split=args.split)[args.text_field])


def build_dataset(args: argparse.Namespace, plan: dict, vocab: int, torch) -> Rows:
    seq = plan["max_length"]
    if args.dataset.startswith("random:"):
        n = int(args.dataset.split(":", 1)[1])
        ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))
        return Rows([{"input_ids": r, "attention_mask": torch.ones_like(r), "labels": r.clone()}
                     for r in ids])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    # Padding to the planned length makes every step the size the memory estimate is for.
    enc = tok(read_texts(args), truncation=True, max_length=seq, padding="max_length", return_tensors="pt")
    rows = []
    for ids, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True):
        labels = ids.clone()
        labels[mask == 0] = -100
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return Rows(rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cpu:
        refuse_on_cpu(PLAN)  # before the slow imports
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    plan = runtime_plan(args, torch)
    model = apply_method(load_model(args, plan, torch), plan, torch)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    print(f"trainable parameters: {trainable:,} of {total:,}")
    train = build_dataset(args, plan, model.config.vocab_size, torch)
    fsdp_gc = bool(plan["fsdp"]) and plan["gradient_checkpointing"]
    targs = {
        "output_dir": args.output_dir,
        "per_device_train_batch_size": plan["per_device_train_batch_size"],
        "gradient_accumulation_steps": plan["gradient_accumulation_steps"],
        # under FSDP, checkpointing is FSDP's own (the Trainer refuses both at once)
        "gradient_checkpointing": plan["gradient_checkpointing"] and not fsdp_gc,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "bf16": plan["bf16"],
        "fp16": plan["fp16"],
        "optim": plan["optim"],
        "use_liger_kernel": plan.get("use_liger_kernel", False),
        "torch_compile": plan.get("torch_compile", False),
        "learning_rate": args.learning_rate,
        "num_train_epochs": args.epochs,
        "max_steps": args.max_steps,
        "logging_steps": args.logging_steps,
        "save_strategy": "no",
        "report_to": "none",
        "remove_unused_columns": False,
        "use_cpu": args.cpu,
    }
    if args.deepspeed:
        targs["deepspeed"] = args.deepspeed
    if plan["fsdp"]:
        targs["fsdp"] = plan["fsdp"]
        targs["fsdp_config"] = fsdp_config(plan, fsdp_gc)
    trainer = Trainer(model=model, args=TrainingArguments(**targs), train_dataset=train,
                      data_collator=default_data_collator)
    result = trainer.train()
    trainer.save_model(args.output_dir)
    print("tuneplan-summary " + json.dumps({"trainable_params": trainable, "global_step": result.global_step,
                                            "train_loss": result.training_loss}))


if __name__ == "__main__":
    main()
