"""axolotl YAML (``axolotl train x.yml``) -> the run it describes.

Key names and defaults from axolotl's pydantic schema (src/axolotl/utils/schemas/config.py,
training.py, peft.py): ``sequence_len`` 512, ``micro_batch_size`` 1, ``gradient_accumulation_steps`` 1,
``gradient_checkpointing`` false, ``bf16`` "auto" (bf16 where the card has it), ``optimizer``
adamw_torch_fused. axolotl runs the transformers Trainer with PEFT (``prepare_model_for_kbit_training``
for 4/8-bit bases), so it is estimated with the ``hf`` profile.
"""

from __future__ import annotations

from typing import Any

from tuneplan.ingest.common import (
    HF_IGNORED,
    HF_IGNORED_PREFIXES,
    HF_NOT_MODELLED,
    Collector,
    Ingested,
    map_fsdp,
    map_kernel_switches,
    map_optimizer,
    map_plain,
)
from tuneplan.ingest.document import Document

# axolotl's defaults, by field (utils/schemas: sequence_len 512, micro_batch_size 1, gradient_checkpointing
# false)
AXOLOTL_DEFAULTS = {"seq": ("sequence_len", 512), "batch": ("micro_batch_size", 1)}

_IGNORED = HF_IGNORED | frozenset({
    "base_model", "base_model_config", "model_type", "tokenizer_type", "tokenizer_config",
    "tokenizer_use_fast",
    "tokenizer_legacy", "trust_remote_code", "revision_of_model", "strict", "datasets", "test_datasets",
    "dataset_prepared_path", "val_set_size", "dataset_processes", "shuffle_merged_datasets", "chat_template",
    "chat_template_jinja", "default_system_message", "special_tokens", "tokens", "added_tokens_overrides",
    "train_on_inputs", "lora_model_dir", "lora_fan_in_fan_out", "peft_use_rslora", "peft_init_lora_weights",
    "lr_scheduler", "lr_quadratic_warmup", "cosine_min_lr_ratio", "cosine_constant_lr_ratio", "lr_div_factor",
    "num_epochs", "max_steps", "evals_per_epoch", "saves_per_epoch", "eval_table_size", "eval_max_new_tokens",
    "early_stopping_patience", "resume_from_checkpoint", "auto_resume_from_checkpoints", "debug", "tf32",
    "sample_packing", "eval_sample_packing", "pad_to_sequence_len", "sample_packing_group_size",
    "sample_packing_bin_size", "multipack_real_batches", "group_by_length", "gpu_memory_limit",
    "low_cpu_mem_usage",
    "use_tensorboard", "hf_use_auth_token", "is_llama_derived_model", "is_mistral_derived_model",
    "is_qwen_derived_model", "is_falcon_derived_model", "eval_batch_size", "adapter", "load_in_4bit",
    "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear",
    "sequence_len", "micro_batch_size", "gradient_accumulation_steps", "optimizer", "bf16", "fp16",
    "bfloat16",
    "float16", "float32", "gradient_checkpointing", "flash_attention", "sdp_attention", "eager_attention",
    "deepspeed", "fsdp", "fsdp_config", "fsdp_version", "fsdp_final_state_dict_type", "bnb_config_kwargs",
    "embedding_lr", "embedding_lr_scale", "lr_groups", "fix_untrained_tokens", "flash_attn_rms_norm",
    "flash_attn_fuse_qkv", "flash_attn_fuse_mlp", "local_rank", "seed", "device_map", "max_memory",
})
_NOT_MODELLED = {
    **HF_NOT_MODELLED,
    "lora_modules_to_save": "fully trainable copies of these modules (e.g. embed_tokens, lm_head) besides "
                            "the adapters",
    "peft_use_dora": "DoRA keeps a magnitude vector and a weight-norm pass per adapted module",
    "xformers_attention": "xformers attention (estimated as the profile's attention)",
    "s2_attention": "shifted sparse attention", "flex_attention": "flex attention",
    "unsloth_lora_mlp": "Unsloth's LoRA kernels",
    "unsloth_lora_qkv": "Unsloth's LoRA kernels", "unsloth_lora_o": "Unsloth's LoRA kernels",
    "lora_mlp_kernel": "axolotl's fused LoRA kernels", "lora_qkv_kernel": "axolotl's fused LoRA kernels",
    "lora_o_kernel": "axolotl's fused LoRA kernels", "plugins": "plugins (Liger, cut cross-entropy...)",
    "rl": "RL training (reference/reward models)",
    "relora_steps": "ReLoRA restarts", "sequence_parallel_degree": "sequence parallelism",
    "context_parallel_size": "context parallelism", "tensor_parallel_size": "tensor parallelism",
    "unfrozen_parameters": "a partial fine-tune of the named parameters", "gptq": "a GPTQ-quantized base",
    "qat": "quantization-aware training", "fp8": "fp8 training", "batch_flattening": "batch flattening",
    "llama4_linearized_experts": "linearized experts",
}


def _targets(c: Collector, d: dict[str, Any]) -> None:
    if d.get("lora_target_linear"):
        c.set("targets", "all-linear", "lora_target_linear")
        return
    mods = d.get("lora_target_modules")
    if isinstance(mods, str) and mods:
        c.set("targets", mods.replace(" ", ""), "lora_target_modules")
    elif isinstance(mods, list) and mods:
        c.set("targets", ",".join(map(str, mods)), "lora_target_modules")
    else:
        c.warn("lora_target_modules", "no LoRA targets (lora_target_modules / lora_target_linear): estimated "
                                      "with PEFT's default targets for this architecture")


def read_axolotl(doc: Document) -> Ingested:
    c = Collector(doc, "axolotl", "axolotl yaml")
    d = doc.data
    c.set("framework", "hf", *(("adapter",) if "adapter" in d else ("base_model",)))
    if d.get("base_model") is not None:
        c.set_model(d["base_model"], "base_model")
    map_kernel_switches(c)
    adapter = str(d.get("adapter") or "").lower()
    four = c.as_bool(d["load_in_4bit"], "load_in_4bit") if d.get("load_in_4bit") is not None else False
    eight = c.as_bool(d["load_in_8bit"], "load_in_8bit") if d.get("load_in_8bit") is not None else False
    if adapter in ("lora", "qlora"):
        if adapter == "qlora" and not (four or eight):
            raise c.fail("adapter", "qlora needs load_in_4bit: true (axolotl refuses it otherwise)",
                         accepted="load_in_4bit: true")
        if four or eight:
            c.set("method", "qlora", "load_in_4bit" if four else "load_in_8bit")
            c.set("bits", 4 if four else 8, "load_in_4bit" if four else "load_in_8bit")
        else:
            c.set("method", "lora", "adapter")
        if d.get("lora_r") is None:
            c.warn("lora_r", "no lora_r: estimated at tuneplan's default rank")
        _targets(c, d)
        bnb = d.get("bnb_config_kwargs") or {}
        if isinstance(bnb, dict):
            if bnb.get("bnb_4bit_quant_type"):
                c.set("quant_type", str(bnb["bnb_4bit_quant_type"]), "bnb_config_kwargs",
                      "bnb_4bit_quant_type")
            if bnb.get("bnb_4bit_use_double_quant") is not None:
                c.set("double_quant", c.as_bool(bnb["bnb_4bit_use_double_quant"],
                                                ("bnb_config_kwargs", "bnb_4bit_use_double_quant")),
                      "bnb_config_kwargs", "bnb_4bit_use_double_quant")
    elif adapter:
        raise c.fail("adapter", f"{adapter!r} is not modelled",
                     accepted="lora, qlora, or none for full fine-tuning")
    else:
        if four or eight:
            raise c.fail("load_in_4bit" if four else "load_in_8bit",
                         "a quantized base cannot be fully fine-tuned", accepted="adapter: lora or qlora")
        c.set("method", "full", *(("adapter",) if "adapter" in d else ("base_model",)))

    given = map_plain(c, "axolotl", c.out.fields["method"])
    for field, (key, value) in AXOLOTL_DEFAULTS.items():
        if field not in given:
            c.default(field, value, f"{key} unset: axolotl uses {value}")
    if d.get("optimizer") is not None:
        map_optimizer(c, d["optimizer"], "optimizer")
    gc = d.get("gradient_checkpointing")
    if gc is None:
        c.default("gradient_checkpointing", False, "gradient_checkpointing unset: axolotl uses false")
    elif isinstance(gc, str) and gc.lower() in ("offload", "offload_disk", "unsloth"):
        c.set("gradient_checkpointing", True, "gradient_checkpointing")
        c.warn("gradient_checkpointing", f"{gc}: checkpoints offloaded to CPU/disk are not modelled; "
                                         "estimated as checkpoints kept on the GPU")
    else:
        c.set("gradient_checkpointing", c.as_bool(gc, "gradient_checkpointing"), "gradient_checkpointing")

    _precision(c, d)
    for key, attn in (("flash_attention", "flash"), ("sdp_attention", "sdpa"), ("eager_attention", "eager")):
        if d.get(key):
            c.set("attn", attn, key)
    if isinstance(d.get("deepspeed"), str) and d["deepspeed"]:
        c.reference("deepspeed", d["deepspeed"], "deepspeed")
    elif isinstance(d.get("deepspeed"), dict):
        c.out.extras["inline_deepspeed"] = d["deepspeed"]
    if d.get("fsdp"):
        map_fsdp(c, d["fsdp"], "fsdp")
    fc = d.get("fsdp_config")
    if isinstance(fc, dict) and fc:
        c.set("fsdp", True, "fsdp_config")
        for k in ("fsdp_offload_params", "offload_params"):
            if fc.get(k) is not None:
                c.set("offload", "all" if c.as_bool(fc[k], ("fsdp_config", k)) else "none", "fsdp_config", k)
        for k in ("fsdp_activation_checkpointing", "activation_checkpointing"):
            if fc.get(k) is not None:
                c.set("gradient_checkpointing", c.as_bool(fc[k], ("fsdp_config", k)), "fsdp_config", k)
        for k in ("fsdp_reshard_after_forward", "reshard_after_forward"):
            if fc.get(k) is False:
                c.warn(("fsdp_config", k),
                       "no reshard after forward (SHARD_GRAD_OP): estimated as FULL_SHARD")
    run = c.out.extras.setdefault("run", {})
    for k in ("num_epochs", "max_steps"):
        if d.get(k) is not None:
            run[k] = c.as_float(d[k], k)
    if d.get("sample_packing"):
        run["packing"] = True
    return c.finish(_IGNORED, HF_IGNORED_PREFIXES, _NOT_MODELLED,
                    "not an axolotl option tuneplan knows; not modelled")


def _precision(c: Collector, d: dict[str, Any]) -> None:
    if d.get("bfloat16"):
        c.set("precision", "bf16", "bfloat16")
    elif d.get("float16"):
        c.set("precision", "fp16", "float16")
    elif d.get("fp16") is True:
        c.set("precision", "fp16-mixed", "fp16")
    elif d.get("bf16") is True:
        c.set("precision", "bf16-mixed", "bf16")
    elif "bf16" not in d or str(d.get("bf16")).lower() == "auto":
        # axolotl's "auto" (its default): bf16 where the card has it, else fp16. That is what tuneplan does
        # with a precision nobody set (bf16-mixed, fp16-mixed on a --gpu without bf16), so leave it unset.
        c.warn("bf16", "bf16: auto: bf16-mixed, or fp16-mixed on a card without bf16 (decided with {gpu})")
    elif d.get("bf16") is False and not d.get("fp16"):
        c.set("precision", "fp32", "bf16")
