"""catalog/config_folder.py: where the user's hardware file is looked for, and a broken one there is a
warning, not a failure of every command."""

from __future__ import annotations

import os
import warnings

import pytest

from tuneplan.catalog.config_folder import (
    HARDWARE_FILE_NAMES,
    config_dir,
    config_folder_cards,
    hardware_file_candidates,
    user_hardware_file,
)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEPLAN_CONFIG_DIR", str(tmp_path))
    return tmp_path


def test_the_config_dir_variable_wins(folder, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", "/elsewhere")
    assert config_dir() == folder
    assert hardware_file_candidates() == [os.path.join(str(folder), n) for n in HARDWARE_FILE_NAMES]


def test_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("TUNEPLAN_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_dir() == tmp_path / "xdg" / "tuneplan"
    assert hardware_file_candidates()[0] == str(tmp_path / "xdg" / "tuneplan" / "hardware.toml")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_dir() == tmp_path / "home" / ".config" / "tuneplan"


def test_no_file_no_cards(folder):
    assert user_hardware_file() is None and config_folder_cards() == {}


def test_toml_is_looked_at_before_yaml(folder):
    (folder / "hardware.yaml").write_text("accelerators: {}\n")
    assert user_hardware_file() == folder / "hardware.yaml"
    (folder / "hardware.toml").write_text('[accelerators.lab]\nvendor = "amd"\nmemory_gib = 8\n')
    assert user_hardware_file() == folder / "hardware.toml"
    assert set(config_folder_cards()) == {"lab"}


def test_a_broken_file_is_a_warning_naming_its_problem(folder):
    (folder / "hardware.toml").write_text('[accelerators.lab]\nmemory_gib = 8\n')  # no vendor
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert config_folder_cards() == {}
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "ignored" in text and "vendor" in text
