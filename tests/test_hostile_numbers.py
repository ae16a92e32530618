"""Numbers past float range, a broken hardware file in the config folder, a hardware file that cannot be
used: exit 2 naming the file and key, or a warning naming the file; never an OverflowError (exit 3)."""

from __future__ import annotations

import json

import pytest

HUGE = 10**400  # float(HUGE) raises OverflowError; TOML reads the literal as a Python int


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(tmp_path / "empty-config"))


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from tuneplan.cli.app import run

    code = run(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "OverflowError" not in out + err
    return code, out, err


@pytest.mark.parametrize("key", ["memory_gb", "memory_gib", "bf16_tflops", "cloud_usd_per_hr"])
def test_an_integer_past_float_range_in_a_hardware_file_names_the_file_and_key(capsys, tmp_path, key):
    hw = tmp_path / "hw.toml"
    hw.write_text(f'[accelerators.big]\nvendor = "nvidia"\nmemory_gb = 80\n{key} = {HUGE}\n'
                  if key != "memory_gb" else f'[accelerators.big]\nvendor = "nvidia"\nmemory_gb = {HUGE}\n')
    code, out, _ = cli(capsys, "estimate", "qwen2.5-0.5b", "--gpu", "big", "--hardware-file", str(hw),
                       "--json")
    err = json.loads(out)["error"]
    assert code == 2 and err["kind"] == "bad_input" and err["field"] == "hardware_file"
    assert str(hw) in err["message"] and f"accelerators.big.{key}" in err["message"]


@pytest.mark.parametrize("argument", ["price", "card_price", "kwh_price", "own_years"])
def test_the_api_refuses_a_price_past_float_range_by_its_argument_name(argument):
    from tuneplan.api import estimate

    with pytest.raises(ValueError) as caught:
        estimate("qwen2.5-0.5b", gpu="l4", **{argument: HUGE})
    assert getattr(caught.value, "field", None) == argument
    assert str(caught.value).startswith(f"{argument}:")


def test_a_price_flag_past_float_range_is_bad_input_naming_the_flag(capsys):
    code, _, err = cli(capsys, "estimate", "qwen2.5-0.5b", "--gpu", "l4", "--price", str(HUGE))
    assert code == 2 and err.startswith("error: --price")


@pytest.mark.parametrize("text", ["[accelerators.x]\nvendor = 'nvidia'\nmemory_gib = nan\n",
                                  f"[accelerators.x]\nvendor = 'nvidia'\nmemory_gib = {HUGE}\n",
                                  "not toml at all [[[\n"])
def test_a_broken_hardware_file_in_the_config_folder_is_a_warning_not_a_crash(capsys, tmp_path, monkeypatch,
                                                                              text):
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "hardware.toml").write_text(text)
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(folder))
    code, out, err = cli(capsys, "estimate", "qwen2.5-0.5b", "--gpu", "l4", "--json")
    assert code == 0 and json.loads(out)["fits"] is True  # the unrelated estimate still runs
    assert f"warning: the hardware file of the config folder is ignored: {folder / 'hardware.toml'}" in err
    code, _, err = cli(capsys, "accelerators")
    assert code == 0 and "hardware.toml" in err


def test_the_same_file_named_on_the_command_line_stays_an_error(capsys, tmp_path):
    hw = tmp_path / "hardware.toml"
    hw.write_text("[accelerators.x]\nvendor = 'nvidia'\nmemory_gib = nan\n")
    code, _, err = cli(capsys, "estimate", "qwen2.5-0.5b", "--gpu", "l4", "--hardware-file", str(hw))
    assert code == 2 and "memory_gib" in err


def test_a_hardware_file_without_a_gpu_is_said_to_be_unused(capsys, tmp_path):
    hw = tmp_path / "hw.toml"
    hw.write_text("[accelerators.mine]\nvendor = 'nvidia'\nmemory_gib = 20\n")
    code, out, err = cli(capsys, "estimate", "qwen2.5-0.5b", "--hardware-file", str(hw), "--json")
    assert code == 0 and "model" in json.loads(out)  # memory only: no GPU to judge
    assert "warning: the hardware file is not used" in err and "--gpu" in err
    code, _, err = cli(capsys, "estimate", "qwen2.5-0.5b", "--hardware-file", str(hw), "--gpu", "mine")
    assert code == 0 and "not used" not in err
