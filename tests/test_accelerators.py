"""The accelerator catalog (facts carried from gpus.csv), loose names, and user hardware files."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuneplan.api import estimate
from tuneplan.catalog.accelerators import (
    accelerators,
    catalog_accelerators,
    load_hardware_file,
    resolve_accelerator,
)
from tuneplan.errors import TuneplanError, UnknownNameError
from tuneplan.specs.hardware import GIB

REPO = Path(__file__).resolve().parents[1]
REFERENCE_CSV = REPO.parent / "shared/reference/gpus.csv"


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path, monkeypatch):
    """Keep a developer's ~/.config/tuneplan out of these tests."""
    empty = tmp_path / "cfg"
    empty.mkdir()
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(empty))


# ---- catalog facts (figures read off gpus.csv by hand) ------------------------------------------------

def test_catalog_has_every_reference_row():
    cat = catalog_accelerators()
    assert len(cat) == 55 + 6  # gpus.csv has 55 rows, tools/accelerators_added.csv 6
    for acc_id in ("p40", "v100-sxm2-32gb", "t4", "rtx-4090", "rtx-5880-ada-generation", "a100-80gb-sxm4",
                   "h100-sxm5-80gb", "h20-96gb", "b200", "mi250x", "mi325x", "ascend-910b", "ascend-910b4"):
        assert acc_id in cat
    for a in cat.values():
        assert a.source and a.verified in ("yes", "partial", "no")


@pytest.mark.parametrize("acc_id,field,value", [
    ("h100-sxm5-80gb", "memory_gib_usable_observed", 79.65),
    ("h100-sxm5-80gb", "memory_bandwidth_gbs", 3350.0),
    ("h100-sxm5-80gb", "bf16_tflops_dense", 989.4),
    ("h100-sxm5-80gb", "compute_capability", (9, 0)),
    ("h100-sxm5-80gb", "tdp_w", 700.0),
    ("v100-sxm2-32gb", "compute_capability", (7, 0)),
    ("v100-sxm2-32gb", "bf16_support", "no"),
    ("t4", "bf16_support", "no (emulated only)"),
    ("l40s", "memory_gib_usable_observed", 44.31),
    ("rtx-4090", "launch_price_usd", 1599.0),
    ("rtx-4090", "cloud_usd_per_gpu_hr", 0.34),
    ("rtx-4090", "cloud_price_date", "2026-09-09"),
    ("rtx-6000-ada-generation", "cloud_price_date", "2026-09-07"),  # the 0.74 reading is the P2 one
    ("rtx-3090", "cloud_price_date", "2026-09-07"),  # not the 2020 launch date in the same cell
    ("t4", "cloud_price_date", "undated"),
    ("ascend-910b", "memory_gib_usable_observed", 64.0),
    ("ascend-910b4", "memory_gib_usable_observed", 32.0),
    ("rtx-4070-ti-super", "verified", "no"),  # compat.md section 9: no source found
    ("mi250x", "devices_per_package", 2),
    # unknowns stay unknown
    ("ascend-910b", "compute_capability", None),
    ("a10g", "tdp_w", None),
    # filled in by tools/accelerator_figures.csv for the time and cost model, and named as not verified
    ("ascend-910b", "bf16_tflops_dense", 313.0),
    ("h200-sxm-141gb", "cloud_usd_per_gpu_hr", 2.69),
])
def test_catalog_fact(acc_id, field, value):
    assert getattr(catalog_accelerators()[acc_id], field) == value


def test_memory_as_software_sees_it():
    cat = catalog_accelerators()
    assert cat["h100-sxm5-80gb"].memory_bytes == int(79.65 * GIB)  # observed
    assert cat["p40"].memory_bytes == int(24 * GIB * 0.99)  # derived, and says so
    assert cat["p40"].memory_source.startswith("derived")
    assert cat["mi250x"].memory_bytes == int(64 * GIB * 0.99)  # one GCD = one device of 64 GB


@pytest.mark.parametrize("acc_id,platform,target,link", [
    ("rtx-4090", "cuda", None, False), ("a100-80gb-sxm4", "cuda", None, True), ("t4", "cuda", None, False),
    ("mi300x", "rocm", "gfx942", True), ("ascend-910b", "npu", "ascend910b", True),
])
def test_platform_target_link(acc_id, platform, target, link):
    a = catalog_accelerators()[acc_id]
    assert (a.platform, a.arch_target, a.has_fast_link) == (platform, target, link)


def test_json_is_what_the_build_tool_makes_from_the_reference():
    if not REFERENCE_CSV.exists():
        pytest.skip("the reference GPU table (gpus.csv) is outside the repository and not on this machine")
    spec = importlib.util.spec_from_file_location("build_accelerators", REPO / "tools/build_accelerators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shipped = json.loads((REPO / "src/tuneplan/catalog/accelerators.json").read_text(encoding="utf-8"))
    assert mod.build(REFERENCE_CSV) == shipped
    # every row of the reference and every added card (tools/accelerators_added.csv) ships, once
    reference_rows = len(list(csv.DictReader(REFERENCE_CSV.open(encoding="utf-8"))))
    assert reference_rows + len(mod.added_rows()) == len(shipped)


# ---- names ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,acc_id", [
    ("4090", "rtx-4090"), ("rtx4090", "rtx-4090"), ("RTX 4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("a100-80g", "a100-80gb-sxm4"), ("a100 80gb sxm", "a100-80gb-sxm4"),
    ("910b", "ascend-910b"), ("910B3", "ascend-910b"), ("910B2C", "ascend-910b"), ("910b4", "ascend-910b4"),
    # bare names mean the SXM variant (docs/compatibility.md)
    ("H100 80GB", "h100-sxm5-80gb"), ("h100", "h100-sxm5-80gb"), ("a100 40gb", "a100-40gb-sxm4"),
    ("v100 16gb", "v100-sxm2-16gb"), ("h100 pcie", "h100-pcie-80gb"), ("a100 80gb pcie", "a100-80gb-pcie"),
    # what NVML prints
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"), ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla T4", "t4"), ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm4"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA H100 NVL", "h100-nvl-94gb"),
    ("v100-32gb", "v100-sxm2-32gb"), ("mi300x", "mi300x"),
])
def test_loose_names(name, acc_id):
    assert resolve_accelerator(name).id == acc_id


def test_miss_suggests():
    with pytest.raises(UnknownNameError) as e:
        resolve_accelerator("rtx 4099")
    assert "rtx-4090" in e.value.suggestions
    assert "add it with hardware_file" in str(e.value)  # the API names the field
    from tuneplan.cli.render import error_text

    assert "add it with --hardware-file" in error_text(e.value)  # the CLI, its flag


# ---- user hardware files ------------------------------------------------------------------------------

TOML = """
[accelerators.gtx-1080ti]
name = "GeForce GTX 1080 Ti"
vendor = "NVIDIA"
memory_gib = 10.9
compute_capability = "6.1"
bf16 = false
aliases = ["1080ti"]

[accelerators.rtx-4090]
cloud_usd_per_gpu_hr = 0.29
cloud_price_date = "2026-09-20"

[accelerators.my-h100]
based_on = "h100"
cloud_usd_per_gpu_hr = 1.5
"""


def test_toml_hardware_file_adds_overrides_and_derives(tmp_path):
    p = tmp_path / "hw.toml"
    p.write_text(TOML)
    user = load_hardware_file(p)
    assert set(user) == {"gtx-1080ti", "rtx-4090", "my-h100"}
    card = resolve_accelerator("1080ti", extra=str(p))
    assert card.id == "gtx-1080ti" and card.compute_capability == (6, 1) and card.supports_bf16 is False
    assert card.memory_bytes == int(10.9 * GIB) and card.origin == str(p.resolve())
    over = resolve_accelerator("rtx4090", extra=p)
    assert over.cloud_usd_per_gpu_hr == 0.29 and over.bf16_tflops_dense == 165.2  # the rest is the catalog's
    mine = accelerators(p)["my-h100"]
    assert mine.compute_capability == (9, 0) and mine.cloud_usd_per_gpu_hr == 1.5
    assert catalog_accelerators()["rtx-4090"].cloud_usd_per_gpu_hr == 0.34  # the shipped catalog is untouched


def test_yaml_hardware_file_from_config_dir(tmp_path, monkeypatch):
    cfg = tmp_path / "conf"
    cfg.mkdir()
    (cfg / "hardware.yaml").write_text("accelerators:\n  lab-a6000:\n    based_on: rtx-a6000\n"
                                       "    memory_gib: 47.4\n    aliases: [labcard]\n")
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(cfg))
    card = resolve_accelerator("labcard")  # no extra: found through the config directory
    assert card.id == "lab-a6000" and card.compute_capability == (8, 6)
    assert "lab-a6000" in accelerators()


@pytest.mark.parametrize("text,needle", [
    ("[accelerators.x]\nvendor = \"NVIDIA\"\nmemory_gib = 8\nclock_mhz = 1500\n",
     "accelerators.x.clock_mhz: unknown field"),
    ("[accelerators.x]\nvendor = \"NVIDIA\"\nmemory_gib = \"lots\"\n",
     "accelerators.x.memory_gib: expected a non-negative number"),
    ("[accelerators.x]\nvendor = \"NVIDIA\"\nmemory_gib = 8\ncompute_capability = \"sm80\"\n",
     "compute_capability"),
    ("[accelerators.rtx4090]\ncloud_usd_per_gpu_hr = 0.3\n", "new accelerator needs vendor"),
    ("[gpus.x]\nvendor = \"NVIDIA\"\n", "top-level `accelerators`"),
    ("[accelerators.x\n", "not valid TOML"),
    ("[accelerators.x]\nbased_on = \"rtx9999\"\n", "based_on: unknown accelerator"),
])
def test_hardware_file_errors_name_file_and_key(tmp_path, text, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(TuneplanError) as e:
        load_hardware_file(p)
    assert needle in str(e.value) and str(p.name) in str(e.value)


def test_new_card_named_like_a_catalog_alias_points_at_the_catalog_id(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[accelerators.rtx4090]\ncloud_usd_per_gpu_hr = 0.3\n")
    with pytest.raises(TuneplanError, match="rtx-4090"):
        load_hardware_file(p)


def test_missing_hardware_file(tmp_path):
    with pytest.raises(TuneplanError, match="no such file"):
        resolve_accelerator("4090", extra=str(tmp_path / "nope.toml"))


def test_estimate_uses_the_hardware_file(tmp_path):
    """A user card with 10.9 GiB and CC 6.1: an explicit bf16 is refused, and the fit is judged on
    10.9 GiB."""
    p = tmp_path / "hw.toml"
    p.write_text(TOML)
    default = estimate("Qwen/Qwen2.5-0.5B", gpu="gtx-1080ti", hardware_file=str(p), method="lora")
    assert default.setup.precision == "fp16-mixed"  # the profile's bf16 default falls back on this card
    assert "bf16-unsupported" not in {f.code for f in default.findings}
    est = estimate("Qwen/Qwen2.5-0.5B", gpu="gtx-1080ti", hardware_file=str(p), method="lora",
                   precision="bf16")
    assert est.gpu.memory_bytes == int(10.9 * GIB)
    assert {f.code for f in est.findings} >= {"bf16-unsupported", "no-tensor-cores"}
    assert est.fits is False
    from tuneplan.cli.app import app

    r = CliRunner().invoke(app, ["estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "1080ti", "--hardware-file",
                                 str(p), "--precision", "fp32", "--json"])
    d = json.loads(r.output)
    assert d["gpu"]["id"] == "gtx-1080ti" and "bf16-unsupported" not in {f["code"] for f in d["findings"]}


def test_cli_accelerators_lists_catalog_and_user_cards(tmp_path):
    from tuneplan.cli.app import app

    p = tmp_path / "hw.toml"
    p.write_text(TOML)
    r = CliRunner().invoke(app, ["accelerators", "--json", "--hardware-file", str(p)])
    assert r.exit_code == 0
    out = json.loads(r.output)
    assert list(out) == ["accelerators"]  # one object, never a bare list
    rows = {d["id"]: d for d in out["accelerators"]}
    assert len(rows) == 63  # 55 + 6 added + two new user cards (the third overrides rtx-4090)
    assert rows["h100-sxm5-80gb"]["source"] and rows["h100-sxm5-80gb"]["verified"] == "yes"
    assert rows["h100-sxm5-80gb"]["compute_capability"] == "9.0"
    assert rows["gtx-1080ti"]["verified"] == "user"
    r = CliRunner().invoke(app, ["accelerators", "910b"])
    assert r.exit_code == 0 and "ascend-910b" in r.output
