"""The transformers / PEFT / bitsandbytes trio a plain HF script is described by.

- ``TrainingArguments`` as ``trainer.args.to_json_string()`` writes it (every field, defaults included),
  or a TRL ``SFTConfig`` / ``trl sft --config`` YAML (which adds ``max_length``, ``model_name_or_path``
  and the ``ModelConfig`` keys ``use_peft``, ``lora_r``, ``load_in_4bit``, ``attn_implementation``...);
- PEFT ``adapter_config.json`` (``LoraConfig``: ``r``, ``lora_alpha``, ``target_modules``...);
- ``BitsAndBytesConfig.to_json_string()`` (``load_in_4bit``, ``bnb_4bit_quant_type``...).
The transformers default for a key the JSON leaves out is the run's value (``TrainingArguments``:
``per_device_train_batch_size`` 8, ``gradient_accumulation_steps`` 1, bf16/fp16 off).
"""

from __future__ import annotations

from typing import Any

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

_ATTN = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash",
         "kernels-community/flash-attn": "flash", "kernels-community/vllm-flash-attn3": "flash"}

_TRL_MODEL_KEYS = frozenset({
    "model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
    "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "attn_implementation",
    "torch_dtype", "dtype", "lora_task_type", "lora_modules_to_save", "use_rslora", "use_dora",
    "lora_target_parameters",
})


def read_hf_args(doc: Document) -> Ingested:
    c = Collector(doc, "hf-args", "hf training args")
    d = doc.data
    c.set("framework", "hf", next(iter(d)))
    if "per_device_train_batch_size" not in d:
        c.default("batch", 8, "per_device_train_batch_size unset: the Trainer uses 8")
    map_hf_training(c)
    map_precision(c, c.get("bf16"), c.get("fp16"))
    if d.get("deepspeed"):
        ds = c.get("deepspeed")
        if isinstance(ds, str):
            c.reference("deepspeed", ds, "deepspeed")
        elif isinstance(ds, dict):
            c.out.extras["inline_deepspeed"] = ds
    if d.get("model_name_or_path"):
        c.set_model(c.get("model_name_or_path"), "model_name_or_path")
    # TRL ModelConfig keys (trl sft --config x.yaml carries them beside the SFTConfig ones)
    if d.get("use_peft") is not None and c.as_bool(c.get("use_peft"), "use_peft"):
        four = bool(d.get("load_in_4bit"))
        eight = bool(d.get("load_in_8bit"))
        c.set("method", "qlora" if (four or eight) else "lora", "use_peft")
        if four or eight:
            c.set("bits", 4 if four else 8, "load_in_4bit" if four else "load_in_8bit")
        if d.get("lora_target_modules"):
            _targets(c, d["lora_target_modules"], "lora_target_modules")
        for k in ("lora_modules_to_save", "use_dora"):
            if d.get(k):
                c.warn(k, "not modelled: extra trainable parameters besides the adapters")
    elif d.get("use_peft") is not None:
        c.set("method", "full", "use_peft")
    map_plain(c, "transformers", c.out.fields.get("method"))
    if d.get("attn_implementation"):
        _attn(c, d["attn_implementation"], "attn_implementation")
    c.handled.update(_TRL_MODEL_KEYS)
    if "seq" not in c.out.fields:  # said by the merge only if no other file or flag gives it
        c.out.extras["missing"] = {"seq": f"{doc.path}: no sequence length here (TrainingArguments has "
                                          f"none): "
                                          "give {seq}, or a TRL max_length"}
    return c.finish(HF_IGNORED, HF_IGNORED_PREFIXES, HF_NOT_MODELLED,
                    "not a TrainingArguments field tuneplan knows; not modelled")


def _targets(c: Collector, value: Any, key: str) -> None:
    if isinstance(value, list):
        c.set("targets", ",".join(map(str, value)), key)
    elif isinstance(value, str) and value == "all-linear":
        c.set("targets", "all-linear", key)
    elif isinstance(value, str) and value:
        if any(ch in value for ch in ".*[]()|^$\\"):
            c.warn(key, f"a regular expression ({value!r}) is not modelled; estimated with all linear layers")
            c.set("targets", "all-linear", key)
        else:
            c.set("targets", value.replace(" ", ""), key)


def _attn(c: Collector, value: Any, key: str) -> None:
    a = _ATTN.get(str(value))
    if a is None:
        c.warn(key, f"attention {value!r} is not modelled; estimated with the profile's attention")
    else:
        c.set("attn", a, key)


_PEFT_IGNORED = frozenset({
    "peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode", "fan_in_fan_out",
    "init_lora_weights", "use_rslora", "auto_mapping", "lora_bias", "megatron_config", "megatron_core",
    "layers_pattern", "loftq_config", "eva_config", "corda_config", "runtime_config", "peft_version",
    "exclude_modules", "trainable_token_indices", "qalora_group_size", "use_qalora", "ensure_weight_tying",
    "alora_invocation_tokens", "arrow_config",
})
_PEFT_NOT_MODELLED = {
    "modules_to_save": "fully trainable copies of these modules besides the adapters",
    "use_dora": "DoRA keeps a magnitude vector and a weight-norm pass per adapted module",
    "layers_to_transform": "adapters on a subset of layers (estimated on all layers)",
    "rank_pattern": "per-module ranks (estimated at r everywhere)",
    "layer_replication": "replicated layers", "target_parameters": "LoRA on nn.Parameter (MoE experts)",
}


def read_peft(doc: Document) -> Ingested:
    c = Collector(doc, "peft", "peft adapter config")
    d = doc.data
    ptype = str(d.get("peft_type", "LORA")).upper()
    if ptype != "LORA":
        raise c.fail("peft_type", f"{ptype} adapters are not modelled", accepted="LORA")
    c.set("method", "lora", *(("peft_type",) if "peft_type" in d else ("r",)), weak=True)
    map_plain(c, "transformers", "lora")
    if d.get("target_modules"):
        _targets(c, c.get("target_modules"), "target_modules")
    if d.get("bias") not in (None, "none"):
        c.warn("bias", f"bias={d['bias']!r}: trainable biases are not modelled")
    c.handled.add("bias")
    if d.get("base_model_name_or_path"):
        c.set_model(d["base_model_name_or_path"], "base_model_name_or_path")
    c.handled.update({"target_modules", "alpha_pattern"})
    return c.finish(_PEFT_IGNORED, (), _PEFT_NOT_MODELLED,
                    "not a LoraConfig field tuneplan knows; not modelled")


_BNB_IGNORED = frozenset({
    "quant_method", "llm_int8_threshold", "bnb_4bit_quant_storage", "_load_in_4bit", "_load_in_8bit",
    "llm_int8_skip_modules", "bnb_4bit_compute_dtype",
})
_BNB_NOT_MODELLED = {
    "llm_int8_enable_fp32_cpu_offload": "modules kept in fp32 on the CPU",
    "llm_int8_has_fp16_weight": "an fp16 weight copy kept beside the int8 one",
}
_COMPUTE = {"bfloat16": "bf16-mixed", "float16": "fp16-mixed", "float32": "fp32"}


def read_bnb(doc: Document) -> Ingested:
    c = Collector(doc, "bitsandbytes", "bitsandbytes config")
    d = doc.data
    four = bool(d.get("load_in_4bit") or d.get("_load_in_4bit"))
    eight = bool(d.get("load_in_8bit") or d.get("_load_in_8bit"))
    c.handled.update({"load_in_4bit", "load_in_8bit"})
    if four or eight:
        key = "load_in_4bit" if four else "load_in_8bit"
        c.set("method", "qlora", key)
        c.set("bits", 4 if four else 8, key)
    if four:  # the 4-bit data type and nested quantization mean nothing to an 8-bit base
        map_plain(c, "transformers", "qlora")
    c.handled.update({"bnb_4bit_quant_type", "bnb_4bit_use_double_quant"})
    cd = d.get("bnb_4bit_compute_dtype")
    if four and isinstance(cd, str) and cd in _COMPUTE:
        # Only a hint: the Trainer's bf16/fp16 decides autocast; this wins only when nothing else says.
        c.set("precision", _COMPUTE[cd], "bnb_4bit_compute_dtype", weak=True)
    if d.get("llm_int8_skip_modules"):
        c.warn("llm_int8_skip_modules", "modules kept unquantized are not modelled (estimated as quantized)")
    return c.finish(_BNB_IGNORED, (), _BNB_NOT_MODELLED, "not a BitsAndBytesConfig field tuneplan knows")
