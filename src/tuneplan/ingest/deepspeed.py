"""DeepSpeed config JSON -> ZeRO stage, offload, precision, batch, world size, buckets.

"auto" values are resolved the way transformers' integration does (transformers
integrations/deepspeed.py ``HfTrainerDeepSpeedConfig``): batch, accumulation and precision from the
TrainingArguments (so "auto" here leaves them to the other files and flags), and in
``trainer_config_finalize`` from the model's hidden size h: ``reduce_bucket_size`` = h*h,
``stage3_prefetch_bucket_size`` = int(0.9*h*h), ``stage3_param_persistence_threshold`` = 10*h.
Keys left out take DeepSpeed's defaults (deepspeed/runtime/zero/config.py ``DeepSpeedZeroConfig``,
checked against deepspeed 0.19.8): reduce and allgather buckets 5e8 elements, stage-3 prefetch 5e7,
persistence threshold 1e5, max live parameters and reuse distance 1e9, sub-group 1e9; ``overlap_comm``
defaults to on for stage 3 only.
"""

from __future__ import annotations

from typing import Any

from tuneplan.ingest.common import Collector, Ingested, map_plain
from tuneplan.ingest.document import Document

# Defaults of deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig, deepspeed 0.19.8), in elements.
ZERO_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
}
_ALIASES = {  # pydantic field name -> the stage3_ key most configs use
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
}
_ZERO_IGNORED = frozenset({
    "stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "overlap_comm", "contiguous_gradients", "allgather_partitions", "reduce_scatter", "round_robin_gradients",
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "load_from_fp32_weights", "elastic_checkpoint",
    "ignore_unused_parameters", "legacy_stage1", "memory_efficient_linear", "use_multi_rank_bucket_allreduce",
    "enable_sanity_checks", "log_trace_cache_warnings", "pipeline_loading_checkpoint",
    "override_module_apply",
    "compute_grad_norm", "stage3_allgather_sequential", "allgather_sequential", "parameter_alignment",
    "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
    "save_muon_momentum_buffer_in_memory",
    "stage3_model_persistence_threshold", "model_persistence_threshold",
    "stage3_module_granularity_threshold",
    "module_granularity_threshold", "leaf_module",
    *ZERO_DEFAULTS, *_ALIASES,
})
_ZERO_NOT_MODELLED = {
    "zero_quantized_weights": "ZeRO++ quantized weight all-gather",
    "zero_quantized_gradients": "ZeRO++ quantized gradient reduce-scatter",
    "zero_quantized_nontrainable_weights": "ZeRO++ quantized frozen weights",
    "zero_hpz_partition_size": "ZeRO++ hierarchical partitioning (a secondary weight copy per node)",
    "mics_shard_size": "MiCS sharding within groups",
    "zenflow": "ZenFlow asynchronous offloaded updates",
}
# The values that leave each feature above off. Compared by type and value, since True == 1 in Python:
# the ZeRO++ switches are pydantic bools defaulting to False (deepspeed/runtime/zero/config.py
# DeepSpeedZeroConfig); the secondary partition group exists only for zero_hpz_partition_size > 1
# (zero/partition_parameters.py Init); mics_shard_size defaulted to -1 (off) before DeepSpeed removed MiCS;
# zenflow defaults to None and any mapping, an empty one included, turns ZenFlow on (runtime/zenflow/engine.py
# configure_zenflow tests only for None).
_ZERO_OFF: dict[str, tuple[Any, ...]] = {
    "zero_quantized_weights": (False,),
    "zero_quantized_gradients": (False,),
    "zero_quantized_nontrainable_weights": (False,),
    "zero_hpz_partition_size": (0, 1),
    "mics_shard_size": (-1, 0),
    "zenflow": (),
}
_TOP_IGNORED = frozenset({
    "zero_optimization", "bf16", "bfloat16", "fp16", "train_batch_size", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps", "optimizer", "gradient_clipping", "steps_per_print",
    "wall_clock_breakdown",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "scheduler", "comms_config",
    "comms_logger",
    "monitor_config", "tensorboard", "wandb", "csv_monitor", "flops_profiler", "checkpoint",
    "prescale_gradients",
    "gradient_predivide_factor", "dump_state", "memory_breakdown", "aio", "autotuning", "elasticity",
    "dataloader_drop_last", "disable_allgather", "gradient_allreduce_op", "timers",
    "activation_checkpointing", "use_node_local_storage", "load_universal", "torch_autocast",
})
_TOP_NOT_MODELLED = {
    "pipeline": "pipeline parallelism", "tensor_parallel": "tensor parallelism (AutoTP)",
    "sequence_parallel_size": "sequence parallelism (Ulysses)",
    "compression_training": "compression training",
    "sparse_attention": "sparse attention",
    "communication_data_type": "a different gradient communication dtype",
    "data_types": "a different gradient accumulation dtype", "fp8": "fp8 training",
    "hybrid_engine": "hybrid engine",
}


def _device(c: Collector, section: Any, key: tuple[str, ...]) -> str | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise c.fail(key, f"expected a mapping with a 'device', got {section!r}")
    dev = section.get("device", "none")
    if dev is None or str(dev).lower() == "none":
        return None
    if str(dev).lower() not in ("cpu", "nvme"):
        raise c.fail((*key, "device"), f"unknown device {dev!r}", accepted="none, cpu, nvme")
    if str(dev).lower() == "nvme":
        c.warn((*key, "device"),
               "NVMe offload: counted as host memory (the NVMe swap buffers are not modelled)")
    return str(dev).lower()


def _precision(c: Collector, data: dict[str, Any]) -> None:
    flags = {}
    for name, keys in (("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16",))):
        for k in keys:
            sec = data.get(k)
            if isinstance(sec, dict) and "enabled" in sec:
                flags[name] = (sec["enabled"], (k, "enabled"))
    vals = {n: v for n, (v, _) in flags.items()}
    if any(v == "auto" for v in vals.values()):
        return  # filled from TrainingArguments bf16/fp16 by the HF integration: other files / flags decide
    on = [n for n, v in vals.items() if c.as_bool(v, flags[n][1])]
    if len(on) == 2:
        raise c.fail(flags["fp16"][1], "bf16 and fp16 are both enabled", accepted="one of them")
    if on:
        # DeepSpeed keeps 16-bit module weights and an fp32 master copy in its optimizer: the estimator
        # handles that under --zero whatever '-mixed' says; bf16-mixed is what the HF Trainer's bf16=True
        # sets.
        c.set("precision", f"{on[0]}-mixed", *flags[on[0]][1])
    elif flags:
        name = next(iter(flags))
        c.set("precision", "fp32", *flags[name][1])


def _is_off(key: str, value: Any) -> bool:
    """Whether a not-modelled zero_optimization key leaves its feature off (None: DeepSpeed's default)."""
    if isinstance(value, str) and value.lower() in ("true", "false"):  # pydantic reads these as bools
        value = value.lower() == "true"
    return value is None or any(type(value) is type(off) and value == off for off in _ZERO_OFF[key])


def read_deepspeed(doc: Document, label: str = "deepspeed json") -> Ingested:
    c = Collector(doc, "deepspeed", label)
    data = doc.data
    zo = data.get("zero_optimization") or {}
    if not isinstance(zo, dict):
        raise c.fail("zero_optimization", f"expected a mapping, got {zo!r}")
    stage = c.as_int(zo.get("stage", 0), ("zero_optimization", "stage"), minimum=0)
    if stage > 3:
        raise c.fail(("zero_optimization", "stage"), f"unknown ZeRO stage {stage}", accepted="0, 1, 2, 3")
    if "stage" in zo:
        c.set("zero", stage, "zero_optimization", "stage")
        if stage == 0:
            c.warn(("zero_optimization", "stage"), "stage 0: DeepSpeed without partitioning is estimated as "
                                                  "plain data parallelism (its fp32 master copy is not "
                                                  "counted)")
    else:
        c.default("zero", 0, "zero_optimization.stage unset: DeepSpeed uses 0")

    opt_dev = _device(c, zo.get("offload_optimizer"), ("zero_optimization", "offload_optimizer"))
    if opt_dev is None and zo.get("cpu_offload") is True:  # deprecated spelling
        opt_dev = "cpu"
    par_dev = _device(c, zo.get("offload_param"), ("zero_optimization", "offload_param"))
    if par_dev is None and zo.get("cpu_offload_param") is True:
        par_dev = "cpu"
    if (opt_dev or par_dev) and stage == 0:
        raise c.fail(("zero_optimization", "stage"), "CPU offload needs ZeRO stage 1, 2 or 3",
                     accepted="stage 1-3 with offload_optimizer, stage 3 with offload_param")
    if par_dev and stage < 3:
        c.warn(("zero_optimization", "offload_param"), "parameter offload only applies to ZeRO-3; ignored")
        par_dev = None
    if par_dev:
        if not opt_dev:
            c.warn(("zero_optimization", "offload_param"),
                   "parameters offloaded but not the optimizer: estimated as {offload=all} (both)")
        c.set("offload", "all", "zero_optimization", "offload_param")
    elif opt_dev:
        c.set("offload", "optimizer", "zero_optimization", "offload_optimizer")
    elif "stage" in zo:
        c.set("offload", "none", "zero_optimization", "stage")

    _precision(c, data)
    # "auto": filled from the TrainingArguments by the HF integration, so the other files / flags decide
    map_plain(c, "deepspeed", skip=("auto",))
    micro, ga = c.out.fields.get("batch"), c.out.fields.get("grad_accum")
    tbs = data.get("train_batch_size")
    if tbs not in (None, "auto"):
        tbs = c.as_int(tbs, "train_batch_size")
        if micro is not None and ga is not None:
            if tbs % (micro * ga):
                raise c.fail("train_batch_size", f"{tbs} is not micro-batch {micro} x accumulation {ga} x "
                                                 "a whole number of GPUs (DeepSpeed asserts this)")
            c.out.extras["world_size"] = (tbs // (micro * ga), c.source("train_batch_size"))

    buckets: dict[str, Any] = {}
    for k, v in zo.items():
        name = _ALIASES.get(k, k)
        if name in ZERO_DEFAULTS:
            buckets[name] = v if v == "auto" else c.as_int(v, ("zero_optimization", k), minimum=0)
    overlap = zo.get("overlap_comm")
    overlap = (stage == 3) if overlap is None else c.as_bool(overlap, ("zero_optimization", "overlap_comm"))
    ds = {"stage": stage, "buckets": buckets, "overlap_comm": overlap,
          "offload_optimizer": opt_dev, "offload_param": par_dev}
    if overlap and stage in (1, 2):
        # ZeRO-1/2 then double-buffer the contiguous-gradients bucket (stage_1_and_2 setup_buckets' buf_1),
        # which the estimate counts; stage 3 allocates its one bucket either way (stage3.py __init__)
        c.set("ds_overlap_comm", True, "zero_optimization", "overlap_comm")
    opt = data.get("optimizer")
    if isinstance(opt, dict) and opt.get("type"):
        ds["optimizer"] = str(opt["type"])
        if str(opt["type"]).lower() in ("adam", "adamw", "fusedadam", "cpuadam"):
            # DeepSpeed's own Adam (FusedAdam / CPU Adam) replaces the Trainer's: a hint, flags and the
            # training YAML's optim still win (same states either way: two fp32 moments per parameter).
            c.set("optimizer", "adamw", "optimizer", "type", weak=True)
        else:
            c.warn(("optimizer", "type"), f"DeepSpeed optimizer {opt['type']!r} is not modelled")
    ac = data.get("activation_checkpointing")
    if isinstance(ac, dict) and (ac.get("partition_activations") or ac.get("cpu_checkpointing")):
        c.warn("activation_checkpointing",
               "DeepSpeed's activation partitioning/CPU checkpointing applies only "
                                           "to models using deepspeed.checkpointing; not modelled")
    c.out.extras["deepspeed"] = ds
    for k, v in zo.items():
        if k in _ZERO_NOT_MODELLED and not _is_off(k, v):
            c.warn(("zero_optimization", k), f"not modelled: {_ZERO_NOT_MODELLED[k]}")
        elif k not in _ZERO_IGNORED and k not in _ZERO_NOT_MODELLED:
            c.warn(("zero_optimization", k),
                   "not a DeepSpeed zero_optimization key tuneplan knows; not modelled")
    c.handled.update(_TOP_IGNORED)
    return c.finish(frozenset(), (), _TOP_NOT_MODELLED,
                    "not a DeepSpeed key tuneplan knows (DeepSpeed ignores unknown top-level keys too)")


def resolve_buckets(ds: dict[str, Any], hidden: int | None) -> dict[str, int | str]:
    """Bucket sizes in elements as the run will use them: file value, "auto" via the HF rule, or default."""
    stage = ds.get("stage", 0)
    out: dict[str, int | str] = {}
    for name, default in ZERO_DEFAULTS.items():
        if name.startswith("stage3_") and stage != 3:
            continue
        v = ds.get("buckets", {}).get(name, default)
        if v == "auto":
            if hidden is None:
                out[name] = "auto (from the model's hidden size)"
                continue
            if name == "reduce_bucket_size":
                v = hidden * hidden
            elif name == "stage3_prefetch_bucket_size":
                v = int(0.9 * hidden * hidden)
            elif name == "stage3_param_persistence_threshold":
                v = 10 * hidden
            else:  # transformers fills only the three above; DeepSpeed would reject "auto" elsewhere
                v = default
        out[name] = v
    return out
