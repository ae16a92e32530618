"""doctor/machine.py: a machine record (devices, driver, versions) read from a previous doctor report,
every field checked, and written back the same."""

from __future__ import annotations

import json

import pytest

from tuneplan.doctor.machine import MACHINE_KEYS, Device, MachineInfo, StaticDetector
from tuneplan.errors import TuneplanError

H100 = {"index": 0, "kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85_520_809_984,
        "memory_free_bytes": 84_000_000_000, "compute_capability": "9.0", "arch_target": None}
RECORD = {"devices": [H100, {**H100, "index": 1}], "driver_version": "550.54.15",
          "cuda_driver_version": "12.4",
          "versions": {"torch": "2.5.1", "bitsandbytes": None, "torch_cuda_arch_list": ["sm_80", "sm_90"],
                       "flash_attn": False},
          "notes": ["NVML ok"], "platform": {"python": "3.11.9", "os": "Linux"}}


def test_round_trip():
    m = MachineInfo.from_dict(RECORD)
    assert m.devices[0].compute_capability == (9, 0)
    assert m.to_dict() == RECORD
    assert MachineInfo.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_a_whole_doctor_report_is_read_by_its_machine_section():
    assert MachineInfo.from_dict({"machine": RECORD, "findings": []}) == MachineInfo.from_dict(RECORD)


def test_compat_versions_add_the_driver():
    v = MachineInfo.from_dict(RECORD).compat_versions()
    assert v["driver"] == "550.54.15" and v["cuda_driver"] == "12.4" and v["torch"] == "2.5.1"


@pytest.mark.parametrize("cc, parsed", [("8.9", (8, 9)), (8.6, (8, 6)), (None, None)])
def test_compute_capability_spellings(cc, parsed):
    assert Device.from_dict({"name": "x", "compute_capability": cc}).compute_capability == parsed


@pytest.mark.parametrize("device", [
    {"kind": "cuda"},  # no name
    {"name": "x", "kind": "tpu"},
    {"name": "x", "compute_capability": "nine"},
    {"name": "x", "compute_capability": "100.0"},
    {"name": "x", "memory_total_bytes": -1},
    {"name": "x", "memory_total_bytes": 2**51},  # beyond 1 PiB: no real card
    {"name": "x", "index": True},
    {"name": "x" * 5000},
    {"name": ["a"]},
])
def test_bad_device_records_are_refused_naming_the_machine(device):
    with pytest.raises(TuneplanError) as err:
        Device.from_dict(device)
    assert err.value.field == "machine"


def test_a_float_integral_byte_count_is_accepted():
    assert Device.from_dict({"name": "x", "memory_total_bytes": 1024.0}).memory_total_bytes == 1024


@pytest.mark.parametrize("record", [
    [1, 2], {"gpus": []}, {"devices": {"a": 1}}, {"versions": ["torch"]},
    {"versions": {"torch": list(range(300))}}, {"notes": "one"}, {"platform": ["linux"]},
])
def test_bad_machine_records_are_refused(record):
    with pytest.raises(TuneplanError) as err:
        MachineInfo.from_dict(record)
    assert err.value.field == "machine"


def test_unknown_keys_name_the_accepted_ones():
    with pytest.raises(TuneplanError) as err:
        MachineInfo.from_dict({"devices": [], "gpu": "x"})
    assert err.value.accepted == ", ".join(MACHINE_KEYS)


def test_static_detector_reads_json_and_yaml(tmp_path):
    j = tmp_path / "m.json"
    j.write_text(json.dumps({"machine": RECORD}))
    assert StaticDetector.from_file(j).detect() == MachineInfo.from_dict(RECORD)
    y = tmp_path / "m.yaml"
    y.write_text("devices:\n  - name: NVIDIA A10G\n    compute_capability: '8.6'\ndriver_version: '535'\n")
    m = StaticDetector.from_file(y).detect()
    assert m.devices[0].name == "NVIDIA A10G" and m.devices[0].compute_capability == (8, 6)
    assert m.driver_version == "535"
