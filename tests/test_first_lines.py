"""What a newcomer reads first: the verdict on the first line, what it turns on (or the time) on the
second, on an 80-column terminal; a known breakage for unstated versions is the verdict, not a note;
the time names the one bound that limits the step."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QWEN7 = "Qwen/Qwen2.5-7B-Instruct"


def run(*args: str, columns: int = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "tuneplan.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def first_two(p: subprocess.CompletedProcess) -> list[str]:
    lines = p.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines[:2]), lines[:2]
    return lines[:2]


def test_qlora_on_a_v100_runs_only_with_the_fixed_bitsandbytes() -> None:
    # bitsandbytes PR #1715 re-added sm70 to the CUDA 12.8/12.9 builds, first released in 0.47.0; the
    # CUDA 12.6 builds always had it (compat_rules.toml bnb-sm70-cu128, reference compat.md 1.1)
    p = run("estimate", QWEN7, "--method", "qlora", "--gpu", "v100-sxm2-32gb")
    one, two = first_two(p)
    assert p.returncode == 1
    assert one == "RUNS ONLY WITH bitsandbytes >= 0.47.0 or a CUDA 12.6 PyTorch"
    assert two.startswith("Tesla V100 SXM2 32GB: memory fits") and "--versions" in two
    d = json.loads(run("estimate", QWEN7, "--method", "qlora", "--gpu", "v100-sxm2-32gb", "--json").stdout)
    assert d["verdict"] == "runs_only_with"
    assert d["requires"] == ["bitsandbytes >= 0.47.0 or a CUDA 12.6 PyTorch"]


@pytest.mark.parametrize("versions,code,verdict", [
    ("bitsandbytes=0.48.1,torch=2.13.0+cu126", 0, "FITS on Tesla V100 SXM2 32GB"),
    ("bitsandbytes=0.47.0,torch=2.8.0+cu128", 0, "FITS on Tesla V100 SXM2 32GB"),  # 0.47.0: sm70 back
    ("bitsandbytes=0.46.1,torch=2.8.0+cu128", 1, "CANNOT RUN on Tesla V100 SXM2 32GB: bitsandbytes 0.46.1"),
])
def test_stated_versions_answer_the_condition(versions: str, code: int, verdict: str) -> None:
    p = run("estimate", QWEN7, "--method", "qlora", "--gpu", "v100-sxm2-32gb", "--versions", versions)
    assert p.returncode == code and p.stdout.startswith(verdict), p.stdout[:300]


def test_unreadable_versions_are_refused_naming_the_field() -> None:
    p = run("estimate", QWEN7, "--method", "qlora", "--gpu", "v100-sxm2-32gb", "--versions", "bnb=new")
    assert p.returncode == 2 and "--versions" in p.stderr and "bitsandbytes" in p.stderr


def test_a_bare_v100_is_refused_listing_the_four_cards() -> None:
    p = run("estimate", QWEN7, "--method", "qlora", "--gpu", "v100")
    assert p.returncode == 2 and p.stdout == ""
    for card in ("v100-sxm2-16gb", "v100-pcie-16gb", "v100-sxm2-32gb", "v100-pcie-32gb"):
        assert card in p.stderr
    assert "Traceback" not in p.stderr


def test_a_plan_that_does_not_fit_says_so_first() -> None:
    p = run("estimate", QWEN7, "--method", "qlora", "--gpu", "rtx-4060")
    one, _ = first_two(p)
    assert p.returncode == 1 and one.startswith("DOES NOT FIT on GeForce RTX 4060") and "short by" in one


def test_the_time_line_names_the_one_bound_that_limits_the_step() -> None:
    """4 x RTX 4090 under ZeRO-3 (PCIe, no P2P): exposed communication is most of the step, so the one
    word is communication (the micro-batch roofline alone says compute)."""
    args = ("estimate", QWEN7, "--method", "lora", "--gpu", "rtx4090", "--gpus", "4", "--zero", "3")
    p = run(*args)
    one, two = first_two(p)
    assert p.returncode == 0 and one.startswith("FITS on GeForce RTX 4090")
    d = json.loads(run(*args, "--json").stdout)
    t = d["time"]
    assert "limited_by" not in t
    largest = max(t["breakdown"], key=t["breakdown"].get)
    assert largest == "communication" and t["breakdown"][largest] > t["step_seconds"] / 2
    assert t["bound"] == "communication"
    assert two.startswith("Time ") and "(communication-bound)" in two and "compute-bound" not in p.stdout


def test_every_setup_names_its_bound_as_the_largest_part_of_the_step() -> None:
    import tuneplan

    word = {"compute": "compute", "memory_bound": "memory", "communication": "communication",
            "offload": "offload", "overhead": "overhead"}
    for kw in ({"method": "qlora"}, {"method": "full", "gpus": 2, "zero": 3},
               {"method": "full", "zero": 2, "offload": "optimizer"}):
        t = tuneplan.estimate("qwen2.5-0.5b", gpu="rtx4090", **kw).to_dict()["time"]
        assert t["bound"] == word[max(t["breakdown"], key=t["breakdown"].get)]


def _script(path: Path):
    spec = importlib.util.spec_from_file_location("exported_train", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_exported_recipe_pins_the_floor_and_checks_it(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "train.py"
    p = run("export", QWEN7, "--method", "qlora", "--gpu", "v100-sxm2-32gb", "--format", "hf-script",
            "-o", str(out))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "'bitsandbytes>=0.47.0'" in text
    mod = _script(out)
    assert mod.PLAN["version_floors"] == {"bitsandbytes": "0.47.0"}
    import importlib.metadata as md

    for installed, stops in (("0.46.1", True), ("0.47.0", False), ("0.48.2.dev0", False)):
        monkeypatch.setattr(md, "version", lambda dist, v=installed: v)
        if stops:
            with pytest.raises(SystemExit, match="bitsandbytes 0.46.1 is installed"):
                mod.check_versions(mod.PLAN)
        else:
            mod.check_versions(mod.PLAN)
    # the same model on an RTX 4090 has no floor to pin
    p = run("export", QWEN7, "--method", "qlora", "--gpu", "rtx4090", "--format", "hf-script", "-o",
            str(tmp_path / "t4090.py"))
    assert p.returncode == 0 and _script(tmp_path / "t4090.py").PLAN["version_floors"] == {}
