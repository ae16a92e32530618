"""Compatibility rules: every rule fires where its source says it must, and stays quiet next door.

Expected levels and thresholds come from the compatibility reference notes (cited per case), not from the
rules file: a wrong threshold in the data makes a case here fail.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import resolve_accelerator
from tuneplan.catalog.models import resolve_model
from tuneplan.compat import (
    LEVELS,
    arch_covered,
    capabilities,
    check,
    rules,
    table_arch_list,
    vtuple,
)
from tuneplan.compat.predicates import PREDICATES
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import model_from_config
from tuneplan.specs.setup import TrainSetup

GTX980 = Accelerator(id="gtx-980", name="GTX 980", vendor="NVIDIA", memory_gb_marketed=4,
                     compute_capability=(5, 2))
ASCEND_910A = Accelerator(id="ascend-910a", name="Ascend 910A", vendor="Huawei", memory_gb_marketed=32)
NO_CC = Accelerator(id="mystery", name="Mystery GPU", vendor="NVIDIA", memory_gb_marketed=24)
OTHER_VENDOR = Accelerator(id="mlu370", name="MLU370-X8", vendor="Cambricon", memory_gb_marketed=48)
TOY_HD512 = model_from_config({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 4096,
                               "vocab_size": 1000, "head_dim": 512}, "toy-hd512")
CU128_28 = {"torch": "2.8.0+cu128", "torch_cuda": "12.8",
            "torch_arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]}
CU130 = {"torch": "2.13.0+cu130", "torch_cuda": "13.0", "driver": "580.65.06",
         "torch_arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]}


def acc(x: str | Accelerator) -> Accelerator:
    return x if isinstance(x, Accelerator) else resolve_accelerator(x)


def model(name: str | None):
    if name is None:
        return None
    return TOY_HD512 if name == "toy-hd512" else resolve_model(name)


# code -> (level expected, triggering case, a near miss). A case: (card or None, setup fields, model,
# versions).
CASES: dict[str, tuple[str, tuple, tuple]] = {
    # compat.md 7: no tensor cores below CC 7.0 (P40 is 6.1, V100 7.0)
    "no-tensor-cores": ("warning", ("p40", {"precision": "fp32"}, None, None),
                        ("v100-sxm2-32gb", {"precision": "fp16-mixed"}, None, None)),
    # 3.1: bf16 needs CC >= 8.0; 910A fp16-only
    "bf16-unsupported": ("error", ("v100-32gb", {"precision": "bf16"}, None, None),
                         ("a100-80gb-sxm4", {"precision": "bf16"}, None, None)),
    "fp16-pure-trainable": ("error", ("a100-80gb-sxm4", {"method": "full", "precision": "fp16"}, None, None),
                            ("a100-80gb-sxm4", {"method": "lora", "precision": "fp16"}, None, None)),
    "fp16-overflow-risk": ("info",
                           ("a100-80gb-sxm4", {"precision": "fp16-mixed"}, "meta-llama/Llama-3.1-8B", None),
                           ("a100-80gb-sxm4", {"precision": "fp16-mixed"}, "meta-llama/Llama-2-7b-hf", None)),
    # 2.1: FA2 on Ampere/Ada/Hopper only; T4 not supported
    "flash-attn-unsupported": ("error", ("t4", {"attn": "flash", "precision": "fp16-mixed"}, None, None),
                               ("rtx3090", {"attn": "flash"}, None, None)),
    "flash-attn-npu": ("info", ("910b", {"attn": "flash"}, None, None),
                       ("910b", {"attn": "sdpa"}, None, None)),
    "flash-attn-unverified": ("info", ("rtx5090", {"attn": "flash"}, None, None),
                              ("rtx4090", {"attn": "flash"}, None, None)),
    # FA2 head dim <= 256 (CUDA), ROCm CK backward <= 128
    "attn-kernel-missing": ("error", ("a100-80gb-sxm4", {"attn": "sdpa"}, "google/gemma-2-2b", None),
                            ("a100-80gb-sxm4", {"attn": "flash"}, "google/gemma-2-2b", None)),
    "flash-attn-head-dim": ("error", ("a100-80gb-sxm4", {"attn": "flash"}, "toy-hd512", None),
                            ("a100-80gb-sxm4", {"attn": "flash"}, "google/gemma-7b", None)),
    "flash-attn-hdim256-consumer": (
        "error",
        ("rtx4090", {"attn": "flash"}, "google/gemma-7b", {**CU130, "flash_attn": "2.5.0"}),
        ("rtx4090", {"attn": "flash"}, "google/gemma-7b", {**CU130, "flash_attn": "2.5.5"})),
    "flash-attn-3-available": ("info", ("h100", {"attn": "flash"}, None, None),
                               ("a100-80gb-sxm4", {"attn": "flash"}, None, None)),
    "flash-attn-3-not-hopper": ("warning", ("rtx4090", {}, None, {**CU130, "flash_attn_3": "3.0.0b1"}),
                                ("h100", {}, None, {**CU130, "flash_attn_3": "3.0.0b1"})),
    "sdpa-no-flash-backend": ("info", ("t4", {"attn": "sdpa", "precision": "fp16-mixed"}, None, None),
                              ("a100-80gb-sxm4", {"attn": "sdpa"}, None, None)),
    # 1.3 / 5: no bitsandbytes on Ascend
    "qlora-unavailable-npu": ("error", ("910b", {"method": "qlora"}, None, None),
                              ("910b", {"method": "lora"}, None, None)),
    "bnb-optimizer-unavailable-npu": ("error", ("910b", {"optimizer": "paged-adamw-8bit"}, None, None),
                                      ("910b", {"optimizer": "adamw"}, None, None)),
    # 1.1: wheels from 0.48 need CC >= 6.0; 0.46-0.47 covered 5.0
    "bnb-arch-too-old": ("error", (GTX980, {"method": "qlora"}, None, None),
                         (GTX980, {"method": "qlora"}, None, {**CU128_28, "bitsandbytes": "0.47.0"})),
    # 1.2: LLM.int8 needs 7.5
    "bnb-llm-int8-unavailable": (
        "error",
        ("v100-sxm2-32gb", {"method": "qlora", "bits": 8, "precision": "fp16-mixed"}, None, None),
        ("t4", {"method": "qlora", "bits": 8, "precision": "fp16-mixed"}, None, None)),
    # PR #1715 (2025-07-21), first released in 0.47.0: cu128 builds before it lack sm70
    "bnb-sm70-cu128": (
        "error",
        ("v100-sxm2-32gb", {"method": "qlora", "precision": "fp16-mixed"}, None,
         {**CU128_28, "bitsandbytes": "0.46.1"}),
        ("v100-sxm2-32gb", {"method": "qlora", "precision": "fp16-mixed"}, None,
         {**CU128_28, "bitsandbytes": "0.47.0"})),
    "bnb-no-cuda-build": ("error", ("t4", {"method": "qlora"}, None, {**CU128_28, "bitsandbytes": "0.45.2"}),
                          ("t4", {"method": "qlora"}, None, {**CU128_28, "bitsandbytes": "0.45.3"})),
    "bnb-torch-floor": (
        "error",
        ("a100-80gb-sxm4", {"method": "qlora"}, None,
         {**CU128_28, "torch": "2.3.1+cu121", "bitsandbytes": "0.50.0"}),
        ("a100-80gb-sxm4", {"method": "qlora"}, None,
         {**CU128_28, "torch": "2.4.0+cu121", "bitsandbytes": "0.50.0"})),
    "peft-imports-bnb": (
        "error",
        ("v100-sxm2-32gb", {"method": "lora", "precision": "fp16-mixed"}, None,
         {**CU128_28, "bitsandbytes": "0.46.1"}),
        ("v100-sxm2-32gb", {"method": "lora", "precision": "fp16-mixed"}, None,
         {**CU128_28, "bitsandbytes": None})),
    "bnb-rocm": (
        "warning",
        ("mi300x", {"method": "qlora"}, None,
         {"torch": "2.13.0+rocm7.2", "torch_hip": "7.2", "bitsandbytes": "0.49.2"}),
        ("mi300x", {"method": "qlora"}, None,
         {"torch": "2.13.0+rocm7.2", "torch_hip": "7.2", "bitsandbytes": "0.50.0"})),
    # 4.2: PyTorch 2.10+ cu128 builds and cu13x have no sm_70
    "torch-arch-missing": ("error", ("v100-sxm2-32gb", {"precision": "fp16-mixed"}, None,
                                     {"torch": "2.10.0+cu128", "torch_cuda": "12.8", "driver": "570.1",
                                      "torch_arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                                          "sm_120"]}),
                           ("v100-sxm2-32gb", {"precision": "fp16-mixed"}, None, CU128_28)),
    "torch-legacy-wheels": ("info", ("v100-sxm2-32gb", {"precision": "fp16-mixed"}, None, None),
                            ("t4", {"precision": "fp16-mixed"}, None, None)),
    "torch-blackwell-wheels": ("info", ("rtx5090", {}, None, None), ("h100", {}, None, None)),
    "torch-no-gpu-build": ("error", ("rtx4090", {}, None, {"torch": "2.13.0+cpu", "torch_cuda": None}),
                           ("rtx4090", {}, None, CU130)),
    "torch-npu-mismatch": ("error", ("910b", {}, None, {"torch": "2.6.0+cpu", "torch_npu": "2.7.1"}),
                           ("910b", {}, None, {"torch": "2.7.1+cpu", "torch_npu": "2.7.1.post2"})),
    # 4.1: CUDA 13.x needs driver >= 580
    "driver-too-old": ("error", ("rtx4090", {}, None, {**CU130, "driver": "570.124.06"}),
                       ("rtx4090", {}, None, CU130)),
    "ascend-stack": ("info", ("910b", {}, None, None), ("a100-80gb-sxm4", {}, None, None)),
    "rocm-stack": ("info", ("mi300x", {}, None, None), ("a100-80gb-sxm4", {}, None, None)),
    "multi-device-package": ("info", ("mi250x", {}, None, None), ("mi300x", {}, None, None)),
    "multi-gpu-no-fast-link": ("info", ("rtx4090", {"gpus": 2}, None, None),
                               ("a100-80gb-sxm4", {"gpus": 2}, None, None)),
    "qlora-sharded-quant-storage": ("warning", (None, {"method": "qlora", "gpus": 2, "zero": 3}, None, None),
                                    (None, {"method": "qlora", "gpus": 2, "zero": 2}, None, None)),
    "hardware-unknown": ("info", (NO_CC, {}, None, None), ("rtx4090", {}, None, None)),
    # transformers' Adafactor: factored states as plain tensors beside FSDP2's DTensor parameters
    "adafactor-fsdp2": ("error",
                        (None, {"optimizer": "adafactor", "gpus": 2, "fsdp": True, "fsdp_version": 2}, None,
                         None),
                        (None, {"optimizer": "adafactor", "gpus": 2, "fsdp": True}, None, None)),
    # PEFT _convert_peft_config_moe: gate_proj and up_proj are fused into the experts' gate_up_proj
    "moe-fused-target-partial": ("error",
                                 (None, {"method": "lora", "targets": "gate_proj,down_proj"},
                                  "Qwen/Qwen3-30B-A3B", None),
                                 (None, {"method": "lora", "targets": "gate_proj,up_proj"},
                                  "Qwen/Qwen3-30B-A3B", None)),
    # peft ParamWrapper reads lora_A/lora_B .weight outside their FSDP1 unit's forward (1-D sharded view)
    "fsdp1-lora-fused-experts": ("error",
                                 (None, {"method": "lora", "targets": "mlp", "gpus": 4, "fsdp": True},
                                  "deepseek-ai/DeepSeek-V2-Lite", None),
                                 (None, {"method": "lora", "targets": "attn", "gpus": 4, "fsdp": True},
                                  "deepseek-ai/DeepSeek-V2-Lite", None)),
    # BertEmbeddings its own FSDP1 unit; the MLM decoder shares word_embeddings.weight from the root unit
    "fsdp1-tied-embeddings-unit": ("error",
                                   (None, {"method": "lora", "gpus": 8, "fsdp": True},
                                    "google-bert/bert-large-uncased", None),
                                   (None, {"method": "lora", "gpus": 8, "fsdp": True, "fsdp_version": 2},
                                    "google-bert/bert-large-uncased", None)),
    # PEFT lora.ParamWrapper (fused expert stacks) refuses lora_dropout != 0
    "moe-fused-target-dropout": ("error",
                                 (None, {"method": "qlora", "targets": "mlp", "dropout": 0.05},
                                  "Qwen/Qwen3-30B-A3B", None),
                                 (None, {"method": "qlora", "targets": "attn", "dropout": 0.05},
                                  "Qwen/Qwen3-30B-A3B", None)),
    # transformers keeps DeepSeek's gate.weight fp32 (_keep_in_fp32_modules_strict); FSDP1 flattens a
    # layer in one dtype
    "fsdp1-fp32-router": ("error",
                          (None, {"method": "lora", "precision": "bf16-mixed", "gpus": 2, "fsdp": True},
                           "deepseek-ai/DeepSeek-V2-Lite", None),
                          (None, {"method": "full", "precision": "bf16-mixed", "gpus": 2, "fsdp": True},
                           "deepseek-ai/DeepSeek-V2-Lite", None)),
    # FSDP2 _init_mp_dtypes: one dtype among a group's trainable parameters
    "fsdp2-fp32-router-trainable": ("error",
                                    (None, {"method": "full", "precision": "bf16", "gpus": 2, "fsdp": True,
                                            "fsdp_version": 2, "framework": "llamafactory"},
                                     "deepseek-ai/DeepSeek-V3", None),
                                    (None, {"method": "lora", "precision": "bf16", "gpus": 2, "fsdp": True,
                                            "fsdp_version": 2}, "deepseek-ai/DeepSeek-V3", None)),
    # fsdp_qlora train.py: LlamaDecoderLayer / MistralDecoderLayer only
    "fsdp-qlora-layer-classes": ("warning",
                                 (None, {"framework": "fsdp-qlora"}, "Qwen/Qwen2.5-7B-Instruct", None),
                                 (None, {"framework": "fsdp-qlora"}, "meta-llama/Llama-2-7b-hf", None)),
}


def run(case: tuple) -> dict[str, str]:
    card, fields, model_name, versions = case
    setup = TrainSetup(**{"attn": "sdpa", **fields})
    found = check(acc(card) if card is not None else None, setup, model(model_name), versions)
    return {f.code: f.level for f in found}


def test_every_rule_has_a_case_a_predicate_and_a_source():
    codes = [r.code for r in rules()]
    assert len(codes) == len(set(codes))
    assert set(codes) == set(CASES), "every rule needs a triggering case and a near miss here"
    assert set(codes) == set(PREDICATES)
    for r in rules():
        assert r.level in LEVELS and (r.level_unknown is None or r.level_unknown in LEVELS)
        assert len(r.source) > 20, r.code
        # rich renders [..] as markup: keep user-facing text free of square brackets
        for text in (r.message, r.fix, r.message_unknown or "", r.fix_unknown or ""):
            assert "[" not in text, r.code


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_with_its_level(code):
    level, hit, _ = CASES[code]
    found = run(hit)
    assert found.get(code) == level, found


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_quiet_on_near_miss(code):
    _, _, miss = CASES[code]
    assert code not in run(miss)


@pytest.mark.parametrize("code,card,fields", [
    ("bnb-sm70-cu128", "v100-sxm2-32gb", {"method": "qlora", "precision": "fp16-mixed"}),
    ("peft-imports-bnb", "v100-sxm2-32gb", {"method": "lora", "precision": "fp16-mixed"}),
    ("flash-attn-hdim256-consumer", "rtx4090", {"attn": "flash"}),
    ("bnb-rocm", "mi300x", {"method": "qlora"}),
])
def test_version_dependent_rules_say_which_versions_without_versions(code, card, fields):
    """No versions (estimate): advice naming the affected versions, never an error; a known breakage
    (a version window that fails outright) is a warning that says what the setup runs only with."""
    setup = TrainSetup(**{"attn": "sdpa", **fields})
    m = resolve_model("google/gemma-7b") if code.startswith("flash") else None
    f = next(f for f in check(acc(card), setup, m, None) if f.code == code)
    breakage = code in ("bnb-sm70-cu128", "flash-attn-hdim256-consumer")
    assert f.level == ("warning" if breakage else "info")
    assert bool(f.requires) == breakage and (not breakage or re.search(r">= \d+\.\d+", f.requires))
    assert re.search(r"\d+\.\d+", f.message + f.fix)  # names versions


def test_v100_owners_report_messages_name_the_cause_and_the_fix():
    v = {**CU128_28, "bitsandbytes": "0.46.1"}
    f = {x.code: x
         for x in check(acc("v100-sxm2-32gb"), TrainSetup(method="qlora", precision="fp16-mixed"), None, v)}
    assert "sm70" in f["bnb-sm70-cu128"].message and "0.46.1" in f["bnb-sm70-cu128"].message
    assert "bitsandbytes>=0.47.0" in f["bnb-sm70-cu128"].fix
    lora = {x.code: x
            for x in check(acc("v100-sxm2-32gb"), TrainSetup(method="lora", precision="fp16-mixed"), None, v)}
    assert "pip uninstall -y bitsandbytes" in lora["peft-imports-bnb"].fix


def test_bnb_wheel_floor_moves_with_the_version():
    """A CC 5.2 card: covered by 0.46-0.47 wheels, not by 0.48+ (bnb docs v0.46.0, v0.48.1)."""
    setup = TrainSetup(method="qlora", precision="fp16-mixed")
    newest = {x.code: x for x in check(GTX980, setup, None, None)}["bnb-arch-too-old"]
    assert "6.0" in newest.message and "bitsandbytes<0.48.0" in newest.fix
    assert "bnb-arch-too-old" in run((GTX980, {"method": "qlora"}, None,
                                      {**CU128_28, "bitsandbytes": "0.48.0"}))


def test_bf16_fix_prices_the_fp16_fallback():
    pure = next(f for f in check(acc("v100-sxm2-32gb"), TrainSetup(precision="bf16"), None)
                if f.code == "bf16-unsupported")
    mixed = next(f for f in check(acc("v100-sxm2-32gb"), TrainSetup(precision="bf16-mixed"), None)
                 if f.code == "bf16-unsupported")
    assert "{precision=fp16-mixed}" in pure.fix and "fp32" in pure.fix
    assert "no extra memory" in mixed.fix
    assert "fp16-only" in next(f for f in check(ASCEND_910A, TrainSetup(), None)
                               if f.code == "bf16-unsupported").message


def test_rocm_head_dim_limit_is_the_backward_one():
    found = run(("mi300x", {"attn": "flash"}, "google/gemma-7b", None))  # head_dim 256 > 128 on ROCm
    assert found.get("flash-attn-head-dim") == "error"


def test_unknown_vendor_gets_advice_not_errors():
    found = run((OTHER_VENDOR, {"method": "qlora", "attn": "flash", "precision": "bf16"}, None, None))
    assert found == {"hardware-unknown": "info"}


def test_setup_only_findings_without_a_card():
    found = run((None, {"method": "full", "precision": "fp16", "attn": "flash"}, None, None))
    assert found == {"fp16-pure-trainable": "error"}


def test_torchtune_profile_fp16_adapters_are_not_master_weights():
    assert run(("a100-80gb-sxm4", {"method": "lora", "precision": "fp16", "framework": "torchtune"}, None,
                None)).get("fp16-pure-trainable") == "error"


def test_findings_come_errors_first():
    f = check(acc("t4"), TrainSetup(method="qlora", attn="flash", precision="bf16", gpus=2), None)
    levels = [x.level for x in f]
    assert levels == sorted(levels, key=LEVELS.index) and levels[0] == "error"


# ---- capabilities (compat.md tables, by hand) -------------------------------------------------------

@pytest.mark.parametrize("card,cap,ok", [
    ("v100-sxm2-32gb", "bf16", False), ("t4", "bf16", False), ("a100-80gb-sxm4", "bf16", True),
    ("910b", "bf16", True),
    (ASCEND_910A, "bf16", False), ("mi250x", "bf16", True),
    ("rtx4090", "fp8", True), ("a100-80gb-sxm4", "fp8", False), ("h100", "fp8", True),
    ("mi300x", "fp8", True),
    ("mi250x", "fp8", False), ("910b", "fp8", False),
    ("rtx3090", "flash_attn_2", True), ("t4", "flash_attn_2", False), ("rtx5090", "flash_attn_2", None),
    ("mi300x", "flash_attn_2", True), ("910b", "flash_attn_2", False),
    ("h100", "flash_attn_3", True), ("h20", "flash_attn_3", True), ("rtx4090", "flash_attn_3", False),
    ("t4", "sdpa_flash", False), ("rtx5090", "sdpa_flash", True), ("p40", "sdpa_mem_efficient", True),
    ("p40", "tensor_cores", False), ("v100-sxm2-32gb", "tensor_cores", True),
    ("p100", "bnb_4bit", True), (GTX980, "bnb_4bit", False), ("910b", "bnb_4bit", False),
    ("mi300x", "bnb_4bit", None),
    ("v100-sxm2-32gb", "bnb_llm_int8", False), ("t4", "bnb_llm_int8", True),
    ("p40", "torch_cu13", False), ("v100-sxm2-32gb", "torch_cu13", False), ("t4", "torch_cu13", True),
    (NO_CC, "bf16", None),
])
def test_capabilities(card, cap, ok):
    got = {c.name: c for c in capabilities(acc(card))}[cap]
    assert got.ok is ok, got.why
    assert got.source


# ---- version helpers ---------------------------------------------------------------------------------

def test_vtuple():
    assert vtuple("2.10.0+cu128") == (2, 10, 0)
    assert vtuple("0.45.3") < vtuple("0.47.0") < vtuple("0.50.2")
    assert vtuple("12.8") == (12, 8, 0)
    assert vtuple("2.7.1.post2") == (2, 7, 1)
    assert vtuple(None) is None and vtuple("garbage") is None


@pytest.mark.parametrize("cc,archs,ok", [
    ((7, 0), ["sm_75", "sm_80"], False),
    ((8, 9), ["sm_80", "sm_86"], True),  # sm_86 cubin runs on 8.9 (same major, lower minor)
    ((8, 0), ["sm_86"], False),  # but not on 8.0
    ((7, 5), ["sm_70"], True),
    ((12, 1), ["sm_90", "compute_120"], True),  # PTX JIT
    ((9, 0), ["sm_80", "compute_80"], True),
    ((6, 1), ["sm_70", "compute_70"], False),
])
def test_arch_covered(cc, archs, ok):
    assert arch_covered(cc, archs) is ok


def test_wheel_arch_table():
    assert "sm_70" in table_arch_list("2.8.0+cu128", "12.8")  # measured 2.8 cu128 list (Whisper-WebUI #653)
    assert "sm_70" not in table_arch_list("2.11.0+cu128", "12.8")
    assert "sm_70" in table_arch_list("2.14.0+cu126", "12.6")
    assert table_arch_list("2.10.0+cu128", "12.8") is None  # sources disagree: left unknown
    # no arch list reported (driver mismatch): the table decides
    found = run(("v100-sxm2-32gb", {"precision": "fp16-mixed"}, None,
                 {"torch": "2.13.0+cu130", "torch_cuda": "13.0", "driver": "580.1", "torch_arch_list": []}))
    assert found.get("torch-arch-missing") == "error"


# ---- whole estimates: the findings on three cards, and a card with none ------------------------------

def _codes(est) -> dict[str, str]:
    return {f.code: f.level for f in est.findings}


def test_estimate_v100_bf16_qlora():
    est = estimate("meta-llama/Llama-2-7b-hf", method="qlora", gpu="v100-32gb", precision="bf16")
    codes = _codes(est)
    assert codes["bf16-unsupported"] == "error"
    bf16 = next(f for f in est.findings if f.code == "bf16-unsupported")
    assert "{precision=fp16-mixed}" in bf16.fix
    assert "bnb-sm70-cu128" in codes  # the applicable bitsandbytes finding
    assert est.headroom_bytes > 0 and est.fits is False  # memory fits, the finding makes it not run


def test_estimate_t4_flash():
    assert (_codes(estimate("meta-llama/Llama-2-7b-hf", gpu="t4", attn="flash"))["flash-attn-unsupported"]
            == "error")


def test_estimate_910b_qlora_proposes_lora():
    est = estimate("meta-llama/Llama-2-7b-hf", method="qlora", gpu="910b")
    f = next(f for f in est.findings if f.code == "qlora-unavailable-npu")
    assert f.level == "error" and "{method=lora}" in f.fix and est.fits is False


def test_estimate_rtx4090_qlora_is_clean():
    est = estimate("meta-llama/Llama-2-7b-hf", method="qlora", gpu="rtx4090")
    assert not [f for f in est.findings if f.level in ("error", "warning")]
    assert not {"bf16-unsupported", "flash-attn-unsupported", "qlora-unavailable-npu"} & set(_codes(est))
    assert est.fits is True


def test_cli_estimate_reports_findings_and_exit_1():
    from tuneplan.cli.app import app

    r = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-2-7b-hf", "--method", "qlora",
                                 "--gpu", "v100-32gb", "--precision", "bf16", "--json"])
    assert r.exit_code == 1, r.output
    d = json.loads(r.output)
    assert d["fits"] is False
    assert {"bf16-unsupported", "bnb-sm70-cu128"} <= {f["code"] for f in d["findings"]}


def test_docs_list_every_rule():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs/compatibility.md").read_text(encoding="utf-8")
    assert [r.code for r in rules() if f"`{r.code}`" not in doc] == []


def test_fsdp1_real_stack_failures_named_by_the_simulation():
    """The simulation's FSDP1 1-D-view failures are named by the rule that refuses the setup, in plain
    words; a sequence classifier (untied head) and a MoE with attention-only LoRA are not."""
    from tuneplan.simulate import failure_reason

    ds, bert = resolve_model("deepseek-ai/DeepSeek-V2-Lite"), resolve_model("google-bert/bert-large-uncased")
    exc = RuntimeError("shape '[64, -1, 720896]' is invalid for input of size 720896")
    lora = TrainSetup(method="lora", targets="mlp", gpus=4, fsdp=True, attn="sdpa")
    assert "(fsdp1-lora-fused-experts)" in failure_reason(exc, ds, lora)
    assert "RuntimeError" in failure_reason(exc, ds, TrainSetup(method="lora", targets="attn", gpus=4,
                                                                  fsdp=True, attn="sdpa"))
    flat = ValueError("Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32")
    assert "(fsdp1-fp32-router)" in failure_reason(flat, ds, TrainSetup(method="lora", targets="attn", gpus=4,
                                                                        fsdp=True, attn="sdpa"))
    mm = RuntimeError("b must be 2D")
    assert "(fsdp1-tied-embeddings-unit)" in failure_reason(mm, bert, TrainSetup(method="full", gpus=8,
                                                                                 fsdp=True, attn="sdpa"))
    assert "RuntimeError" in failure_reason(mm, bert, TrainSetup(method="full", gpus=8, fsdp=True,
                                                                 attn="sdpa", num_labels=2))


@pytest.mark.parametrize("fields,codes", [
    # DeepSeek-V2-Lite: first_k_dense_replace = 1, so layer 0 has no router (config.json); freeze trains the
    # top layers, upcast to fp32 under a -mixed precision (trainable_fp32_in_mixed)
    ({"method": "freeze", "freeze_trainable_layers": 26, "precision": "bf16-mixed"}, set()),
    ({"method": "freeze", "freeze_trainable_layers": 25, "precision": "bf16-mixed"}, {"fsdp1-fp32-router"}),
    ({"method": "freeze", "freeze_trainable_layers": 26, "precision": "bf16", "fsdp_version": 2,
      "framework": "llamafactory"}, {"fsdp2-fp32-router-trainable"}),
    # the hf profile's pure bf16 gives the Trainer bf16=True: accelerate upcasts the trainable parameters
    ({"method": "freeze", "freeze_trainable_layers": 26, "precision": "bf16", "fsdp_version": 2}, set()),
    ({"method": "freeze", "freeze_trainable_layers": 26, "precision": "bf16-mixed", "fsdp_version": 2},
     set()),
    ({"method": "qlora", "precision": "bf16-mixed"}, {"fsdp1-fp32-router"}),
    ({"method": "lora", "precision": "fp32"}, set()),
    ({"method": "lora", "precision": "bf16", "zero": 3}, set()),
])
def test_fp32_router_rules_follow_the_layers_dtypes(fields, codes):
    """The rules fire exactly where a wrap unit (FSDP1, at wrapping, before accelerate's upcast) or a
    trainable group (FSDP2, after it) mixes the fp32 router with 16-bit weights; DeepSpeed casts the whole
    module to 16 bits, so ZeRO never mixes."""
    setup = {"gpus": 2, "attn": "sdpa", "targets": "attn", **fields}
    if "zero" not in fields:
        setup["fsdp"] = True
    found = run((None, setup, "deepseek-ai/DeepSeek-V2-Lite", None))
    assert {c for c in found if "router" in c} == codes
