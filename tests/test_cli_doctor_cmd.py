"""cli/doctor_cmd.py: `tuneplan doctor --machine FILE` diagnoses a described machine (capabilities from the
card's compute capability, the exit status), and `tuneplan accelerators` filters the catalog."""

from __future__ import annotations

import json

import pytest

from tuneplan.cli.app import run


def machine_file(tmp_path, name: str, cc: str, torch_cuda: str | None = "12.1") -> str:
    versions = {"torch": "2.3.0", "transformers": "4.41.0", "peft": "0.11.1", "accelerate": "0.30.1",
                "bitsandbytes": "0.43.1"}
    if torch_cuda:
        versions["torch_cuda"] = torch_cuda
    p = tmp_path / "machine.json"
    p.write_text(json.dumps({"devices": [{"index": 0, "kind": "cuda", "name": name, "compute_capability": cc,
                                          "memory_total_bytes": 34_089_730_048}],
                             "driver_version": "535.104.05", "cuda_driver_version": "12.2",
                             "versions": versions}))
    return str(p)


def doctor(capsys, path: str) -> tuple[int, dict]:
    code = run(["doctor", "--machine", path, "--json"])
    return code, json.loads(capsys.readouterr().out)


def capabilities(report: dict) -> dict[str, bool]:
    return {c["name"]: c["ok"] for c in report["devices"][0]["capabilities"]}


def test_a_v100_has_tensor_cores_but_no_bf16_fp8_or_flash_attention_2(capsys, tmp_path):
    # Volta (7.0) introduced tensor cores; bf16 needs Ampere (8.0), fp8 Ada / Hopper (8.9 / 9.0);
    # FlashAttention-2 supports Ampere and newer
    code, report = doctor(capsys, machine_file(tmp_path, "Tesla V100-SXM2-32GB", "7.0"))
    caps = capabilities(report)
    assert caps["tensor_cores"] and not caps["bf16"] and not caps["fp8"] and not caps["flash_attn_2"]
    assert report["machine"]["devices"][0]["compute_capability"] == "7.0"
    assert code == report["exit_code"]


def test_an_h100_has_bf16_and_fp8(capsys, tmp_path):
    code, report = doctor(capsys, machine_file(tmp_path, "NVIDIA H100 80GB HBM3", "9.0"))
    caps = capabilities(report)
    assert caps["bf16"] and caps["fp8"] and caps["tensor_cores"]
    assert code == report["exit_code"]


def test_a_cpu_only_torch_on_a_gpu_box_exits_1_with_the_fix(capsys, tmp_path):
    code, report = doctor(capsys, machine_file(tmp_path, "NVIDIA H100 80GB HBM3", "9.0", torch_cuda=None))
    assert code == 1 == report["exit_code"]
    assert "torch-no-gpu-build" in report["verdict"] and "pip install" in report["verdict"]


def test_a_bad_machine_file_exits_2(capsys, tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"devices": [{"name": "x", "kind": "tpu"}]}))
    code = run(["doctor", "--machine", str(p), "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and err["kind"] == "bad_input" and "cuda" in err["accepted"]


@pytest.mark.parametrize("search", ["h100", "AMD", "rtx"])
def test_accelerators_filter_by_id_name_or_vendor(capsys, search):
    assert run(["accelerators", search, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["accelerators"]
    assert rows
    assert all(search.lower() in f"{a['id']} {a['name']} {a['vendor']}".lower() for a in rows)
    assert run(["accelerators", "--json"]) == 0
    everything = json.loads(capsys.readouterr().out)["accelerators"]
    assert len(rows) < len(everything)
