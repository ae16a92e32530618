"""`tuneplan doctor` on faked machines (V100, T4, RTX 4090, H100, 910B), on this machine, and its parsers."""

from __future__ import annotations

import json
import sys
import types

import pytest
from typer.testing import CliRunner

from tuneplan.cli.app import app
from tuneplan.cli.wording import cli_texts
from tuneplan.doctor import MachineInfo, StaticDetector, diagnose
from tuneplan.doctor.report import match_accelerator
from tuneplan.doctor.system import (
    SystemDetector,
    cuda_version_from_int,
    parse_npu_smi_info,
    parse_nvidia_smi_csv,
)
from tuneplan.errors import TuneplanError

GIB = 1024**3
LIBS = {"peft": "0.21.2", "transformers": "5.24.0", "accelerate": "1.15.0"}
CU130 = {"torch": "2.13.0+cu130", "torch_cuda": "13.0",
         "torch_arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]}


def machine(name, cc, mem_gib, versions, kind="cuda", n=1, driver="580.65.06", cuda="13.0") -> MachineInfo:
    devs = [{"index": i, "kind": kind, "name": name, "memory_total_bytes": int(mem_gib * GIB),
             "memory_free_bytes": int(mem_gib * GIB) - 300 * 2**20, "compute_capability": cc}
            for i in range(n)]
    return MachineInfo.from_dict({"devices": devs, "driver_version": driver if kind == "cuda" else None,
                                  "cuda_driver_version": cuda if kind == "cuda" else None,
                                  "versions": {**LIBS, **versions}})


MACHINES = {
    # a V100 with bnb 0.50 + a torch cu128 whose arch list no longer has sm_70 (2.10/2.11 cu128)
    "v100": machine("Tesla V100-SXM2-32GB", "7.0", 32.0, {
        "torch": "2.10.0+cu128", "torch_cuda": "12.8", "bitsandbytes": "0.50.2",
        "torch_arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]},
        driver="570.124.06", cuda="12.8"),
    # the V100 owner's report: torch 2.8 cu128 still has sm_70, but bitsandbytes 0.46.1's cu128 build does not
    "v100-bnb046": machine("Tesla V100-SXM2-32GB", "7.0", 32.0, {
        "torch": "2.8.0+cu128", "torch_cuda": "12.8", "bitsandbytes": "0.46.1",
        "torch_arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]},
        driver="570.124.06", cuda="12.8"),
    "t4": machine("Tesla T4", "7.5", 15.56, {**CU130, "bitsandbytes": "0.50.2"}),
    "rtx4090": machine("NVIDIA GeForce RTX 4090", "8.9", 23.99,
                       {**CU130, "bitsandbytes": "0.50.2", "flash_attn": "2.8.3"}),
    "h100x8": machine("NVIDIA H100 80GB HBM3", "9.0", 79.65,
                      {**CU130, "bitsandbytes": "0.50.2", "flash_attn": "2.8.3"}, n=8),
    "910bx8": machine("910B3", None, 64.0, {"torch": "2.7.1+cpu", "torch_npu": "2.7.1"}, kind="npu", n=8),
}


def tasks(report, i=0) -> dict[str, str]:
    return {t.key: t.status for t in report.devices[i].tasks}


def codes(report, i=0) -> dict[str, str]:
    return {f.code: f.level for f in report.devices[i].findings}


def test_v100_bnb050_torch_cu128_without_sm70():
    r = diagnose(MACHINES["v100"])
    assert r.devices[0].matched == "v100-sxm2-32gb"
    assert [f.code for f in r.devices[0].blocking] == ["torch-arch-missing"]
    assert set(tasks(r).values()) == {"breaks"}
    fix = next(f.fix for f in r.devices[0].findings if f.code == "torch-arch-missing")
    assert "whl/cu126" in fix and "torch<=2.14" in fix
    assert "bnb-sm70-cu128" not in codes(r)  # bnb 0.50 has sm70 again (PR #1715)
    assert r.exit_code == 1


def test_v100_with_bnb046_bitsandbytes_breaks_even_plain_lora():
    r = diagnose(MACHINES["v100-bnb046"])
    t = tasks(r)
    assert t["lora"] == "breaks" and t["full"] == "works"
    assert t["qlora-4bit"] == "breaks" and t["adamw-8bit"] == "breaks"
    c = codes(r)
    assert c["peft-imports-bnb"] == "error" and c["bnb-sm70-cu128"] == "error"
    assert r.exit_code == 1 and "bitsandbytes" in r.verdict


def test_t4():
    r = diagnose(MACHINES["t4"])
    t = tasks(r)
    assert t["lora"] == "works" and t["qlora-4bit"] == "works" and t["qlora-8bit"] == "works"
    assert t["flash-attn-2"] == "breaks"
    caps = {c.name: c.ok for c in r.devices[0].capabilities}
    assert caps["bf16"] is False and caps["flash_attn_2"] is False
    assert r.exit_code == 0


def test_rtx4090_everything_works():
    r = diagnose(MACHINES["rtx4090"])
    assert set(tasks(r).values()) == {"works"}
    assert not [f for f in r.devices[0].findings if f.level != "info"]
    assert r.exit_code == 0 and r.verdict.startswith("ready")


def test_h100_eight_cards_are_one_group():
    r = diagnose(MACHINES["h100x8"])
    assert len(r.devices) == 1 and r.devices[0].indices == list(range(8))
    assert r.devices[0].matched == "h100-sxm5-80gb"
    assert set(tasks(r).values()) == {"works"}
    assert codes(r).get("flash-attn-3-available") == "info"


def test_910b_no_qlora_lora_proposed():
    r = diagnose(MACHINES["910bx8"])
    d = r.devices[0]
    assert d.matched == "ascend-910b" and d.accelerator.memory_bytes == 64 * GIB
    t = tasks(r)
    assert t["lora"] == "works" and t["qlora-4bit"] == "breaks" and t["adamw-8bit"] == "breaks"
    assert t["flash-attn-2"] == "works"  # transformers routes it to torch_npu's fused attention
    qlora = next(x for x in d.tasks if x.key == "qlora-4bit")
    assert "{method=lora}" in qlora.fix  # the core names the field; the CLI words it --method lora
    assert r.exit_code == 0


def test_cpu_torch_on_a_gpu_machine_is_blocking_with_the_wheel_to_install():
    m = machine("NVIDIA GeForce RTX 4090", "8.9", 23.99, {"torch": "2.13.0+cpu", "torch_cuda": None})
    r = diagnose(m)
    assert [f.code for f in r.devices[0].blocking] == ["torch-no-gpu-build"]
    assert "whl/cu130" in r.devices[0].findings[0].fix
    old = machine("NVIDIA GeForce RTX 4090", "8.9", 23.99, {"torch": "2.13.0+cpu", "torch_cuda": None},
                  driver="570.1")
    assert "whl/cu126" in diagnose(old).devices[0].findings[0].fix  # cu130 needs driver >= 580
    assert r.exit_code == 1


def test_missing_libraries_are_not_installed_not_broken():
    m = machine("NVIDIA GeForce RTX 4090", "8.9", 23.99, {**CU130})
    t = tasks(diagnose(m))
    assert (t["qlora-4bit"] == "not installed" and t["flash-attn-2"] == "not installed"
            and t["lora"] == "works")


def test_unknown_card_keeps_detected_facts():
    acc, matched = match_accelerator(MachineInfo.from_dict({"devices": [
        {"name": "NVIDIA GeForce GTX 1080 Ti", "memory_total_bytes": 11 * GIB, "compute_capability": "6.1"}
    ]}).devices[0])
    assert matched == "detected only" and acc.compute_capability == (6, 1) and acc.memory_bytes == 11 * GIB
    # a known name with a different memory size is a different SKU: detected facts, not the catalog's
    acc, matched = match_accelerator(MachineInfo.from_dict({"devices": [
        {"name": "Tesla V100-SXM2-32GB", "memory_total_bytes": 16 * GIB, "compute_capability": "7.0"}
    ]}).devices[0])
    assert matched == "detected only" and acc.memory_bytes == 16 * GIB


def test_no_accelerator_exits_0():
    r = diagnose(MachineInfo())
    assert r.exit_code == 0 and [f.code for f in r.findings] == ["no-accelerator"]
    assert r.findings[0].source and r.findings[0].fix


def test_machine_round_trip_and_cli_machine_file(tmp_path):
    m = MACHINES["v100-bnb046"]
    again = MachineInfo.from_dict(json.loads(json.dumps(diagnose(m).to_dict())))  # a whole report works too
    assert again.to_dict() == m.to_dict()
    p = tmp_path / "box.json"
    p.write_text(json.dumps(diagnose(m).to_dict()))
    r = CliRunner().invoke(app, ["doctor", "--machine", str(p), "--json"])
    assert r.exit_code == 1
    assert json.loads(r.output) == cli_texts(diagnose(StaticDetector.from_file(p).detect()).to_dict())
    r = CliRunner().invoke(app, ["doctor", "--machine", str(p)])  # the human rendering runs too
    assert r.exit_code == 1 and "peft-imports-bnb" in r.output


def test_bad_machine_file(tmp_path):
    p = tmp_path / "box.yaml"
    p.write_text("devices:\n  - {name: x, kind: tpu}\n")
    with pytest.raises(TuneplanError, match="kind"):
        StaticDetector.from_file(p)
    p.write_text("gpus: []\n")
    with pytest.raises(TuneplanError, match="unknown key"):
        StaticDetector.from_file(p)


# ---- the detection layer itself -------------------------------------------------------------------------

def test_parse_nvidia_smi():
    text = ("0, Tesla V100-SXM2-32GB, 32768, 32500, 7.0, 570.124.06\n"
            "1, Tesla V100-SXM2-32GB, 32768, 100, 7.0, 570.124.06\n")
    devs = parse_nvidia_smi_csv(text)
    assert [d.index for d in devs] == [0, 1]
    assert devs[0].memory_total_bytes == 32768 * 2**20 and devs[1].memory_free_bytes == 100 * 2**20
    assert devs[0].compute_capability == (7, 0)
    assert parse_nvidia_smi_csv("0, Tesla K80, 11441, 11000\n")[0].compute_capability is None  # old driver


NPU_SMI = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 92.1        38                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3300 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 95.0        40                0    / 0             |
| 0                         | 0000:C2:00.0  | 12          0    / 0          60000/ 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 1       0                 | 4242          | python                   | 56700                   |
+===========================+===============+====================================================+
"""


def test_parse_npu_smi():
    devs = parse_npu_smi_info(NPU_SMI)
    assert [(d.index, d.name) for d in devs] == [(0, "910B3"), (1, "910B3")]
    assert devs[0].memory_total_bytes == 65536 * 2**20 and devs[1].memory_free_bytes == 5536 * 2**20
    acc, matched = match_accelerator(devs[0])
    assert matched == "ascend-910b" and acc.arch_target == "ascend910b"


def test_cuda_version_from_nvml_int():
    assert cuda_version_from_int(12040) == "12.4" and cuda_version_from_int(13000) == "13.0"


class _FakeMem:
    total, free = 24 * GIB, 20 * GIB


def _fake_pynvml(n: int) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: b"580.65.06"
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 4090"
    m.nvmlDeviceGetMemoryInfo = lambda h: _FakeMem()
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 9)
    return m


def test_system_detector_reads_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(2))
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr(SystemDetector, "_versions", lambda self, m: {"torch": None})
    m = SystemDetector(check_bnb_import=False).detect()
    assert [d.name for d in m.devices] == ["NVIDIA GeForce RTX 4090"] * 2
    assert m.devices[0].compute_capability == (8, 9) and m.driver_version == "580.65.06"
    assert m.cuda_driver_version == "13.0"
    r = diagnose(m)
    assert r.devices[0].matched == "rtx-4090" and r.devices[0].indices == [0, 1]
    assert [f.code for f in r.devices[0].blocking] == ["torch-no-gpu-build"]  # torch not installed


def test_system_detector_without_gpu(monkeypatch):
    broken = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setattr("shutil.which", lambda name: None)
    m = SystemDetector(check_bnb_import=False).detect()
    assert m.devices == [] and any("NVML unavailable" in n for n in m.notes)
    assert m.versions.get("torch")  # torch is installed in CI (CPU build) and reported
    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["devices"] == [] and d["exit_code"] == 0 and d["findings"][0]["code"] == "no-accelerator"


def test_doctor_on_this_machine_runs():
    """Unpatched: whatever this machine has, doctor answers with JSON and the exit code it reports."""
    r = CliRunner().invoke(app, ["doctor", "--json", "--no-import-check"])
    d = json.loads(r.output)
    assert r.exit_code == d["exit_code"] and {"machine", "devices", "findings", "verdict"} <= set(d)
