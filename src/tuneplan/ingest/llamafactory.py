"""LLaMA-Factory training YAML (``llamafactory-cli train x.yaml``) -> the run it describes.

Key names and defaults from LLaMA-Factory 0.9.5 ``src/llamafactory/hparams`` (model_args.py,
finetuning_args.py, data_args.py) and its ``parser.py``; the remaining keys are transformers'
Seq2SeqTrainingArguments. A key left out takes LLaMA-Factory's default, and the run uses it, so the
reader fills those that matter (``lora_rank`` 8, ``cutoff_len`` 2048, the Trainer's
``per_device_train_batch_size`` 8) and says so in the source.
"""

from __future__ import annotations

from tuneplan.ingest.common import (
    HF_IGNORED,
    HF_IGNORED_PREFIXES,
    HF_NOT_MODELLED,
    Collector,
    Ingested,
    map_hf_training,
    map_plain,
    map_precision,
)
from tuneplan.ingest.document import Document

# LLaMA-Factory defaults the run relies on when the key is absent (hparams dataclasses, 0.9.5).
LF_DEFAULTS = {"lora_rank": 8, "cutoff_len": 2048, "freeze_trainable_layers": 2}
HF_DEFAULT_BATCH = 8  # transformers TrainingArguments.per_device_train_batch_size default

_ATTN = {"disabled": "eager", "eager": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash"}

_IGNORED = HF_IGNORED | frozenset({
    "template", "dataset", "dataset_dir", "eval_dataset", "media_dir", "max_samples",
    "preprocessing_num_workers",
    "preprocessing_batch_size", "overwrite_cache", "val_size", "eval_num_beams", "buffer_size",
    "mix_strategy",
    "interleave_probs", "streaming", "tokenized_path", "plot_loss", "trust_remote_code", "cache_dir",
    "model_revision", "use_fast_tokenizer", "split_special_tokens", "hf_hub_token", "ms_hub_token",
    "om_hub_token", "print_param_status", "low_cpu_mem_usage", "use_reentrant_gc", "adapter_name_or_path",
    "adapter_folder", "create_new_adapter", "pissa_init", "pissa_iter", "pissa_convert", "use_rslora",
    "loraplus_lr_ratio", "loraplus_lr_embedding", "default_system", "enable_thinking", "mask_history",
    "train_on_prompt", "ignore_pad_token_for_loss", "tool_format", "rope_scaling", "moe_aux_loss_coef",
    "train_from_scratch", "quantization_device_map", "infer_backend", "infer_dtype", "offload_folder",
    "use_kv_cache", "export_dir", "export_size", "export_device", "export_quantization_bit",
    "export_quantization_dataset", "export_quantization_nsamples", "export_quantization_maxlen",
    "export_legacy_format", "export_hub_model_id", "ray_run_name", "ray_storage_path",
    "ray_storage_filesystem",
    "ray_num_workers", "resources_per_worker", "placement_strategy", "ray_init_kwargs", "master_addr",
    "master_port", "use_swanlab", "compute_accuracy", "disable_shuffling", "image_max_pixels",
    "image_min_pixels",
    "video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen", "audio_sampling_rate",
    "model_name_or_path", "finetuning_type", "stage", "pure_bf16", "deepspeed", "flash_attn",
    "disable_gradient_checkpointing", "quantization_bit", "quantization_method", "quantization_type",
    "double_quantization", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "cutoff_len",
    "freeze_trainable_layers", "freeze_trainable_modules", "use_unsloth", "packing", "neat_packing",
})
_NOT_MODELLED = {
    **HF_NOT_MODELLED,
    "additional_target": "extra fully-trainable modules (modules_to_save) besides the adapters",
    "use_dora": "DoRA keeps a magnitude vector and a weight-norm pass per adapted module",
    "freeze_extra_modules": "extra trainable modules in freeze tuning",
    "use_galore": "GaLore projected optimizer states", "use_apollo": "APOLLO projected optimizer states",
    "use_badam": "BAdam block-wise updates", "use_adam_mini": "Adam-mini optimizer states",
    "use_muon": "Muon optimizer states", "use_llama_pro": "LLaMA-Pro expanded blocks",
    "shift_attn": "shift short attention (S^2-Attn)", "mixture_of_depths": "mixture of depths",
    "upcast_layernorm": "layer norms upcast to fp32", "upcast_lmhead_output": "lm_head output upcast to fp32",
    "use_unsloth_gc": "Unsloth's offloaded gradient checkpointing",
    "resize_vocab": "embedding resize for new tokens",
    "new_special_tokens": "embedding resize for new tokens",
    "use_kt": "KTransformers CPU/GPU hybrid MoE", "use_mca": "Megatron Core adapter",
    "use_hyper_parallel": "HyperParallel FSDP/TP backend", "fp8": "fp8 training",
    "use_dft_loss": "DFT loss", "use_asft_loss": "ASFT loss (a reference model)",
    "use_eaft_loss": "EAFT loss",
}


def read_llamafactory(doc: Document) -> Ingested:
    c = Collector(doc, "llamafactory", "llamafactory yaml")
    d = doc.data
    c.set("framework", "llamafactory",
          *(("finetuning_type",) if "finetuning_type" in d else (next(iter(d)),)))
    if d.get("model_name_or_path") is not None:
        c.set_model(c.get("model_name_or_path"), "model_name_or_path")

    stage = str(c.get("stage", "sft"))
    if stage in ("rm", "ppo", "dpo", "kto"):
        extra = ("DPO/KTO also run a frozen reference model" if stage in ("dpo", "kto")
                 else "PPO adds value/reward models")
        c.warn("stage", f"stage {stage}: estimated as one policy model doing SFT-like steps; {extra} "
                        "(not modelled)")
    ft = str(c.get("finetuning_type", "lora"))
    if ft not in ("lora", "freeze", "full"):
        raise c.fail("finetuning_type", f"{ft!r} is not modelled", accepted="lora, freeze, full")
    qbit = d.get("quantization_bit")
    qmethod = str(c.get("quantization_method", "bnb"))
    if qbit is not None:
        bits = c.as_int(c.get("quantization_bit"), "quantization_bit")
        if ft != "lora":
            raise c.fail("quantization_bit", "LLaMA-Factory quantizes the frozen base for LoRA only "
                                             f"(finetuning_type is {ft})", accepted="finetuning_type: lora")
        if qmethod != "bnb":
            c.warn("quantization_method", f"{qmethod}: estimated as bitsandbytes {bits}-bit storage")
        if bits not in (4, 8):
            raise c.fail("quantization_bit", f"{bits}-bit is not modelled", accepted="4, 8")
        c.set("method", "qlora", "quantization_bit")
        c.set("bits", bits, "quantization_bit")
    elif "finetuning_type" in d:
        c.set("method", ft, "finetuning_type")
    else:
        c.default("method", ft, "finetuning_type unset: LLaMA-Factory uses lora")
    given = map_plain(c, "llamafactory", "qlora" if qbit is not None else ft)
    if ft == "lora":
        if "rank" not in given:
            c.default("rank", LF_DEFAULTS["lora_rank"], "lora_rank unset: LLaMA-Factory uses 8")
        target = c.get("lora_target", "all")
        if isinstance(target, list):
            target = ",".join(map(str, target))
        if "lora_target" in d:
            c.set("targets", str(target).replace(" ", ""), "lora_target")
        else:
            c.default("targets", "all", "lora_target unset: LLaMA-Factory uses all")
    if ft == "freeze":
        n = c.get("freeze_trainable_layers")
        if n is not None:
            n = int(c.as_int(abs(n) if isinstance(n, int) else n, "freeze_trainable_layers"))
            c.set("freeze_trainable_layers", n, "freeze_trainable_layers")
            if d["freeze_trainable_layers"] < 0:
                c.warn("freeze_trainable_layers", "negative: the first layers train; memory is counted for "
                                                  f"{n} trainable layers all the same")
        else:
            c.default("freeze_trainable_layers", 2, "freeze_trainable_layers unset: LLaMA-Factory uses 2")
        mods = str(c.get("freeze_trainable_modules", "all"))
        if mods != "all":
            c.warn("freeze_trainable_modules", f"{mods}: only some modules of the trainable layers train; "
                                               "estimated as whole layers")

    if "seq" not in given:
        c.default("seq", LF_DEFAULTS["cutoff_len"], "cutoff_len unset: LLaMA-Factory uses 2048")
    if d.get("packing") or d.get("neat_packing"):  # packed rows are cutoff_len long: the estimate's case
        c.out.extras.setdefault("run", {})["packing"] = True
    if "batch" not in given:
        c.default("batch", HF_DEFAULT_BATCH, "per_device_train_batch_size unset: the Trainer uses 8")
    map_hf_training(c)
    # LLaMA-Factory enables checkpointing itself (model_utils/checkpointing.py) unless told not to, so the
    # Trainer's own gradient_checkpointing key cannot turn it off.
    if d.get("gradient_checkpointing") is False:
        c.warn("gradient_checkpointing",
               "LLaMA-Factory checkpoints anyway; use disable_gradient_checkpointing")
    c.handled.update({"gradient_checkpointing", "activation_checkpointing"})
    if d.get("disable_gradient_checkpointing") is not None:
        off = c.as_bool(c.get("disable_gradient_checkpointing"), "disable_gradient_checkpointing")
        c.set("gradient_checkpointing", not off, "disable_gradient_checkpointing")
    else:
        c.default("gradient_checkpointing", True,
                  "disable_gradient_checkpointing unset: LLaMA-Factory checkpoints")

    pure = c.as_bool(c.get("pure_bf16", False), "pure_bf16")
    if pure:
        c.set("precision", "bf16", "pure_bf16")
    else:
        map_precision(c, c.get("bf16"), c.get("fp16"))
        if "bf16" not in d and "fp16" not in d:
            # No flag: no autocast; LLaMA-Factory loads the weights in bf16 where the card has it
            # (extras/misc.py infer_optim_dtype) and casts the trainable parameters to fp32 (adapter.py).
            # A full fine-tune thus trains in fp32; adapters / freeze tuning run on a bf16 base.
            full = ft == "full"
            c.default("precision", "fp32" if full else "bf16",
                      "bf16/fp16/pure_bf16 unset: no autocast, " +
                      ("trainable parameters in fp32" if full else "weights loaded in bf16"))
            c.note("no bf16/fp16/pure_bf16: " + ("estimated as fp32 training" if full else
                   "estimated as bf16 weights without autocast (fp16 on cards without bf16)"))
    attn = d.get("flash_attn")
    if attn is not None:
        a = str(c.get("flash_attn")).lower()
        if a == "auto":
            pass  # transformers picks (SDPA): the profile default
        elif a in _ATTN:
            c.set("attn", _ATTN[a], "flash_attn")
        else:
            raise c.fail("flash_attn", f"unknown value {a!r}", accepted="auto, disabled, sdpa, fa2, fa3")
    if c.as_bool(c.get("use_unsloth", False), "use_unsloth"):
        c.set("framework", "unsloth", "use_unsloth")
    ds = d.get("deepspeed")
    if isinstance(ds, str) and ds:
        c.reference("deepspeed", ds, "deepspeed")
    elif isinstance(ds, dict):
        c.out.extras["inline_deepspeed"] = ds
    run = c.out.extras.setdefault("run", {})
    if d.get("max_samples") is not None:
        run["max_samples"] = c.as_int(d["max_samples"], "max_samples")
    if d.get("dataset") is not None:
        run["dataset"] = str(d["dataset"])
    return c.finish(_IGNORED, HF_IGNORED_PREFIXES, _NOT_MODELLED,
                    "not a LLaMA-Factory 0.9.5 argument (LLaMA-Factory refuses unknown keys); not modelled")
