"""Map the rows of the calibration data (benchmarks/data/calibration/measured.csv) to tuneplan setups.

Each row becomes a ``MappedRow`` (model, setup fields, GPU, which quantity was measured, bytes) or an
``Unmapped`` with the reason. Nothing is dropped silently. The mapping reads the row as published: it
never edits values to fit the estimator (see the calibration README).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "calibration" / "measured.csv"

FRAMEWORK_OF_GROUP = {
    "litgpt": "litgpt", "torchtune": "torchtune", "unsloth": "unsloth", "llama-factory": "llamafactory",
    "hf-peft": "hf", "hf-transformers-docs": "hf",
}


# pytorch/torchtune#1390 (2024-08-22) brought chunked cross-entropy; earlier rows ran the 0.1-0.2 recipes
TORCHTUNE_CHUNKED_CE = "2024-08-22"
# PyTorch 2.0 (2023-03-15) made zero_grad(set_to_none=True) the default (pytorch/pytorch#92731); the
# transformers Trainer calls model.zero_grad() after each optimizer step, so on torch 1.x its gradient
# buffers stay allocated (zeroed) through the next forward
TORCH_2_0 = "2023-03-15"
# torch 1.11 (2022-03-10) is the first release whose softmax / log_softmax keep only their output
# (pytorch/pytorch#66018, October 2021); runs before it kept the input as well (--softmax-keeps-input)
TORCH_1_11 = "2022-03-10"
# Run dates a source shows but the CSV does not carry: the transformers single-GPU guide prints its
# nvidia-smi output "Tue Jan 11 08:58:05 2022" (docs/source/en/perf_train_gpu_one.mdx), so torch <= 1.10
RUN_DATES = {"hf-transformers-docs": "2022-01-11"}


@dataclass
class MappedRow:
    row_id: str
    source_group: str
    framework: str
    model: str
    setup: dict[str, Any]
    gpu: str | None
    outcome: str  # measured | OOM | max_seq_len_that_fits
    metric: str  # allocated | reserved | device | unknown
    measured_bytes: int | None
    budget_bytes: int | None
    confidence: str
    approximations: list[str] = field(default_factory=list)
    # CUDA context the source states for its device reading (bytes), used instead of tuneplan's default
    context_bytes: int | None = None
    # reserved memory the source states for an earlier point of the same run (after model init): the
    # caching allocator keeps those segments (no empty_cache), so a later reserved reading is at least that
    reserved_floor_bytes: int | None = None
    # what the stated sequence length is (``stated_length``): "padded" (every sample padded or packed to it,
    # or the longest sample forced into the measured batch), "bound" (a truncation limit under dynamic
    # padding, the data's lengths not given) or "unstated"
    length_kind: str = "unstated"
    # for a "bound" row: the plausible shorter length the band starts from (``shorter_length``)
    shorter_seq: int | None = None


@dataclass
class Unmapped:
    row_id: str
    source_group: str
    reason: str


# seq_len_note wordings that state the measured batch's length: padding / packing to the stated length, or
# the data's longest sample put into the measured batch ("forced into the first iteration", "value = longest")
PADDED_NOTES = ("packed to", "packing=true", "fixed length", "forced into", "value = longest")
# wordings of a truncation limit: batches padded to their longest sample, at most the stated length
BOUND_NOTES = ("truncation", "'seq length' as stated", "max length", "unpacked")


def stated_length(note: str) -> str:
    """What a row's stated sequence length is: "padded", "bound" or "unstated" (the scoring rules).

    Padding or packing to the stated length, or the data's longest sample forced into the measured batch,
    make the length the measured batch's; a truncation limit with dynamic padding bounds it only. The
    torchtune README's benchmark table ("'Seq Length' as stated in table") gives recipe settings whose
    datasets pad each batch to its longest sample (torchtune's padded_collate), so its length is a bound."""
    t = (note or "").lower()
    if any(w in t for w in PADDED_NOTES):
        return "padded"
    if any(w in t for w in BOUND_NOTES):
        return "bound"
    return "unstated"


def shorter_length(row: dict[str, str], bound: int) -> int:
    """The plausible shorter length of a "bound" row (the scoring rules: the framework's own default data, or
    half the bound where none is known).

    The rows that train on Alpaca (stated in ``task``, or torchtune's recipes, whose configs default to
    ``torchtune.datasets.alpaca_dataset`` when the table names no dataset) have the length of Alpaca's
    longest sample under their tokenizer, where a row of the data states it (LitGPT's runs forced that
    sample into their first iteration: "value = longest Alpaca sample for this tokenizer") and it is
    shorter than the bound: no batch of that data is longer. Otherwise half the bound."""
    task = row.get("task", "").lower()
    alpaca = "alpaca" in task or (row["source_group"] == "torchtune" and "dataset not stated" in task)
    longest = alpaca_longest().get(_tokenizer(row["model_hf_id"])) if alpaca else None
    return longest if longest and longest < bound else max(1, bound // 2)


def _tokenizer(model_id: str) -> tuple[str, int] | None:
    """Models that share a tokenizer share (model_type, vocab_size) in the catalog (Llama-2 7B / 13B /
    70B)."""
    from tuneplan.catalog.models import resolve_model
    from tuneplan.errors import TuneplanError

    try:
        spec = resolve_model(model_id, allow_network=False)
    except TuneplanError:
        return None
    return (str(spec.config.get("model_type")), spec.vocab)


@cache
def alpaca_longest() -> dict[tuple[str, int] | None, int]:
    """Alpaca's longest sample per tokenizer, as the rows that forced it into their batch state it."""
    out: dict[tuple[str, int] | None, int] = {}
    for row in load_rows():
        n = _int(row["seq_len"])
        if "value = longest alpaca sample" in row["seq_len_note"].lower() and n:
            out[_tokenizer(row["model_hf_id"])] = n
    return out


def _int(v: str) -> int | None:
    m = re.match(r"^\s*(\d[\d,]*)", v or "")
    return int(m.group(1).replace(",", "")) if m else None


def _targets(text: str, approx: list[str]) -> str | None:
    t = (text or "").lower()
    if not t or "peft default" in t:
        return None  # profile default
    if "all-linear" in t:
        return "all-linear"
    if "head" in t:
        approx.append("LoRA on the output head not modelled (all block linears targeted)")
        return "all-linear"
    tokens = set(re.findall(r"[a-z_]+", t.split("(")[0]))
    sem = set()
    for tok in tokens:
        sem |= {"query": {"q"}, "key": {"k"}, "value": {"v"}, "projection": {"o"}, "output_proj": {"o"},
                "mlp": {"mlp"}, "gate": {"mlp"}, "up": {"mlp"}, "down": {"mlp"}}.get(tok, {tok})
    return "sem:" + ",".join(sorted(sem))


def resolve_semantic_targets(spec: Any, sem: str) -> str:
    """'sem:q,v' -> the module names of this architecture that hold q and v."""
    want = set(sem[4:].split(","))
    names = spec.linear_names()
    roles = {m.name: (m.role, m.reads) for s, _ in spec.layer_groups for m in s.linears}
    out: list[str] = []
    fused = [n for n in names if n in ("qkv_proj", "query_key_value", "c_attn", "wqkv")]
    for n in names:
        role, reads = roles[n]
        short = n.split(".")[-1]
        if role == "attn" and reads == "attn_core" and "o" in want:
            out.append(n)
        elif role == "attn" and fused and n in fused and want & {"q", "k", "v"}:
            out.append(n)
        elif role == "attn" and (("q" in want and short in ("q_proj", "query", "q_a_proj", "q_b_proj"))
                                 or ("k" in want and short in ("k_proj", "key"))
                                 or ("v" in want and short in ("v_proj", "value"))):
            out.append(n)
        elif role in ("mlp", "expert", "shared_expert") and "mlp" in want:
            out.append(n)
    if "k" in want and "v" in want and not any(x in names for x in ("k_proj", "key")):
        for n in names:
            if n.startswith("kv_") and n not in out:
                out.append(n)
    return ",".join(out)


def _precision(text: str) -> str | None:
    t = (text or "").lower()
    if not t:
        return None
    if "bf16-true" in t or "pure bf16" in t or t.startswith("bf16 (pure"):
        return "bf16"
    if "bf16-mixed" in t or "bf16 mixed" in t:
        return "bf16-mixed"
    if "fp16" in t:
        return "fp16-mixed"
    if "fp32" in t:
        return "fp32"
    return None


def _optimizer(text: str, setup: dict[str, Any]) -> None:
    t = (text or "").lower()
    if "optimizer_in_bwd" in t or "fused into backward" in t:
        setup["optimizer_in_backward"] = True
    if not t or "not stated" in t:
        return
    if "pagedadamw8bit" in t:
        setup["optimizer"] = "paged-adamw-8bit"
    elif "pagedadamw" in t:
        setup["optimizer"] = "paged-adamw"
    elif "8bit" in t or "8-bit" in t:
        setup["optimizer"] = "adamw-8bit"
    elif "adafactor" in t:
        setup["optimizer"] = "adafactor"
    elif "sgd" in t:
        setup["optimizer"] = "sgd"
    elif "fused" in t:
        setup["optimizer"] = "adamw-fused"
    elif "trainer default adamw" in t and "adamw_torch" not in t:
        # transformers v4.2x docs: the Trainer's default optim was adamw_hf until
        # huggingface/transformers#25109
        setup["optimizer"] = "adamw-hf"
    elif "adamw" in t:
        setup["optimizer"] = "adamw"


def _metric(text: str) -> str:
    t = (text or "").lower()
    if t.startswith("not stated") or "method not stated" in t:
        # e.g. "not stated (torchtune utils of that time log alloc/reserved/active ...)": the candidates
        # are listed, the row's own metric is not; "memory consumed (method not stated)" / "GRAM (method
        # not stated)" name no reading either (allocator statistics or nvidia-smi): scored against a band
        return "unknown"
    if "max_memory_allocated" in t or "active" in t:
        return "allocated"
    if "reserved" in t:
        return "reserved"
    if "nvidia-smi" in t or "nvml" in t or "screenshot" in t or "consumed" in t or "gram" in t:
        return "device"
    return "unknown"


def _stated_context(metric: str) -> int | None:
    """'... (includes ~1343 MB CUDA context/kernels)': the source measured its own context (MiB)."""
    m = re.search(r"includes ~\s*(\d+)\s*MB CUDA context", metric or "")
    return int(m.group(1)) * 1024**2 if m else None


def _reserved_floor(row: dict[str, str]) -> int | None:
    """'peak memory reserved after model init' stated beside a reserved training reading (1e9-byte GB)."""
    if ("reserved after model init" not in row.get("peak_mem_alt_metric", "")
            or "reserved" not in row["peak_mem_metric"]):
        return None
    try:
        return int(float(row["peak_mem_alt_value"]) * 1e9)
    except ValueError:
        return None


def _bytes(row: dict[str, str]) -> int | None:
    if row["peak_mem_gib_derived"]:
        return int(float(row["peak_mem_gib_derived"]) * 1024**3)
    v = row["peak_mem_value"]
    if not v:
        return None
    try:
        val = float(v.replace(",", ""))
    except ValueError:
        return None
    unit = row["peak_mem_unit"]
    # The calibration README: litgpt and 2024 torchtune "GB" are 1e9 bytes; elsewhere GiB or as printed.
    if "1e9" in unit or row["source_group"] in ("litgpt", "torchtune"):
        return int(val * 1e9)
    if "GiB" in unit or "GB" in unit:
        return int(val * 1024**3)
    return None


def _gpu(text: str) -> str | None:
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.errors import TuneplanError

    t = (text or "")
    if not t or "not stated" in t or "budget" in t.lower() or "model not stated" in t:
        return None
    t = re.sub(r"^\s*\d+\s*x\s*", "", t)  # "1 x RTX 4090", "8x A100"
    t = t.split(";")[0].split("(")[0].strip()
    if t.upper() == "A100":
        return None  # 40 or 80 GB not stated
    try:
        return resolve_accelerator(t).id
    except TuneplanError:
        return None


def map_row(row: dict[str, str]) -> MappedRow | Unmapped:
    rid, group = row["row_id"], row["source_group"]
    method = row["method"]
    approx: list[str] = []
    if method.startswith("adapter"):
        return Unmapped(rid, group, f"method {method} (LLaMA-Adapter) is not modelled")
    if "encoder classifier" in row.get("method_detail", "") and False:
        pass
    setup: dict[str, Any] = {"framework": FRAMEWORK_OF_GROUP.get(group, "hf")}
    if method == "qlora-4bit":
        # torchao's NF4Tensor always quantizes its block scalers (int8 per 64-element block plus one factor
        # per 256 blocks): bitsandbytes' double-quant layout
        torchao = "torchao" in row["quantization"] or "torchtune nf4" in row["quantization"].lower()
        setup.update(method="qlora", bits=4, double_quant=torchao or "double quant" in row["quantization"])
    elif method in ("lora", "full"):
        setup["method"] = method
    else:
        return Unmapped(rid, group, f"method {method!r} not modelled")
    if "torchao" in row["quantization"] or "torchtune nf4" in row["quantization"].lower():
        approx.append("torchao NF4 modelled as bitsandbytes double-quantized NF4 storage")
    r = _int(row["lora_rank"])
    if setup["method"] != "full" and r:
        setup["rank"] = r
    tg = _targets(row["lora_targets"], approx)
    if tg and setup["method"] != "full":
        setup["targets"] = tg
    p = _precision(row["precision"])
    if p:
        setup["precision"] = p
    _optimizer(row["optimizer"], setup)
    b = _int(row["micro_batch_size"])
    if b:
        setup["batch"] = b
    s = _int(row["seq_len"])
    if not s:
        return Unmapped(rid, group, "sequence length not given")
    if "settings on" in row["method_detail"] and "not stated" in row["method_detail"]:
        return Unmapped(rid, group, f"the run's settings are not stated ({row['method_detail']})")
    setup["seq"] = s
    ga = _int(row["grad_accum"])
    gb, n_dev = _int(row["global_batch"]), _int(row["n_gpus"]) or 1
    if not ga and gb and b and gb > b * n_dev:
        # not stated, but implied by the published global batch: global / (micro batch x devices)
        ga = gb // (b * n_dev)
        approx.append(f"grad_accum {ga} derived from global batch {gb}")
    if ga:
        setup["grad_accum"] = ga
    gc = row["grad_checkpointing"].lower()
    if gc.startswith("on"):
        setup["gradient_checkpointing"] = True
    elif gc.startswith("off"):
        setup["gradient_checkpointing"] = False
    att = row["attention_impl"].lower()
    if "flash" in att and "not" not in att:
        setup["attn"] = "flash"
    elif "eager" in att:
        setup["attn"] = "eager"
    elif "sdpa" in att or "not fa2" in att:
        setup["attn"] = "sdpa"
    par = row["parallelism"].lower()
    n = _int(row["n_gpus"]) or 1
    if "fsdp" in par:
        setup.update(fsdp=True, gpus=n)
    elif "zero-3" in par or "zero3" in par:
        setup.update(zero=3, gpus=n)
    elif n > 1:
        setup["gpus"] = n
    off = row["offload"].lower()
    if "offload" in off and "false" not in off:
        setup["offload"] = "all" if ("param" in off or "fsdp" in off) else "optimizer"
    if RUN_DATES.get(group, row["source_date"][:10]) < TORCH_1_11:
        setup["softmax_keeps_input"] = True
    if setup["framework"] == "hf" and row["source_date"][:10] < TORCH_2_0:
        # the transformers docs' single-GPU guide printed these outputs in 2022 (v4.2x page): torch 1.x
        setup["keep_grads"] = True
    if "peft docs/source/accelerate/" in row["source_ref"] and setup["method"] != "full":
        # the CSV has no dropout column; every launch command of those docs (examples/sft/run_peft_*.sh,
        # quoted in deepspeed.md and fsdp.md) passes --lora_dropout 0.1 (PEFT's own default is 0.0)
        setup["dropout"] = 0.1
    if "classification" in row.get("task", "").lower():
        setup["num_labels"] = 2  # transformers docs: AutoModelForSequenceClassification on 0/1 labels
    if "forced into" in (row["other_opts"] + row["seq_len_note"]):
        # lit-gpt 2023 (finetune/*.py get_batch(..., longest_seq_ix if iter_num == 1)): the peak batch is
        # the first
        setup["longest_batch_first"] = True
    if "activation offloading" in row["other_opts"]:
        setup["activation_offload"] = True
    if setup["framework"] == "torchtune":
        if row["source_date"] < TORCHTUNE_CHUNKED_CE:
            setup["framework"] = "torchtune-0.2"
        elif setup.get("optimizer") == "adamw":
            # torchtune 0.3 configs: optimizer torch.optim.AdamW with fused: True
            setup["optimizer"] = "adamw-fused"
        if setup["framework"] == "torchtune" and "chunked" not in row["other_opts"].lower() \
                and "@1814feb17" in row["source_ref"]:
            setup["loss"] = "upcast"  # the memory table's rows before "+ Chunked Cross Entropy"
    if "cce" in row["other_opts"].lower() or "cut cross" in row["other_opts"].lower():
        approx.append("Apple cut cross-entropy modelled as Unsloth's fused loss")
    if "compile" in row["other_opts"]:
        setup["compile"] = True
    if _reserved_floor(row):
        approx.append("the reserved reading is compared with max(estimate, the reservation stated after "
                      "model init)")
    model = row["model_hf_id"]
    budget = None
    if row["mem_budget_gb"]:
        try:
            budget = int(float(row["mem_budget_gb"]) * 1024**3)
        except ValueError:
            budget = None
    return MappedRow(
        row_id=rid, source_group=group, framework=setup["framework"].split("-")[0], model=model, setup=setup,
        gpu=_gpu(row["gpu"]), outcome=row["outcome"], metric=_metric(row["peak_mem_metric"]),
        measured_bytes=_bytes(row), budget_bytes=budget, confidence=row["config_confidence"],
        approximations=approx, context_bytes=_stated_context(row["peak_mem_metric"]),
        reserved_floor_bytes=_reserved_floor(row), length_kind=stated_length(row["seq_len_note"]),
        shorter_seq=shorter_length(row, s) if stated_length(row["seq_len_note"]) == "bound" else None,
    )


def load_rows(path: Path = DATA) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def pct(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile q (0..1) of xs; nan when empty."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
