"""The environment read on every estimate: a change between two calls is seen (env_read.env_stamp, the
calibration store's path kept per stamp)."""

from __future__ import annotations

import json
import os

from tuneplan.env_read import env_stamp
from tuneplan.estimator.step_calibration import (
    PATH_VARIABLES,
    STORE_NAME,
    calibration_for,
    forget,
    store_path,
)

NAMES = ("TUNEPLAN_TEST_STAMP_A", "TUNEPLAN_TEST_STAMP_B")


def test_the_stamp_follows_each_value(monkeypatch) -> None:
    monkeypatch.delenv(NAMES[0], raising=False)
    monkeypatch.setenv(NAMES[1], "x")
    unset = env_stamp(NAMES)
    assert unset[0] is None
    monkeypatch.setenv(NAMES[0], "one")
    one = env_stamp(NAMES)
    assert one != unset
    monkeypatch.setenv(NAMES[0], "two")
    assert env_stamp(NAMES) != one
    monkeypatch.setenv(NAMES[0], "one")
    assert env_stamp(NAMES) == one  # equal values, equal stamps: what is kept per stamp is found again


def test_a_mapping_in_place_of_environ_is_read_through_its_get(monkeypatch) -> None:
    monkeypatch.setattr(os, "environ", {NAMES[0]: "patched"})
    assert env_stamp(NAMES) == ("patched", None)


def test_the_store_follows_the_config_folder_between_two_estimates(tmp_path, monkeypatch) -> None:
    # two folders, one with a stored factor for the card: switching between them at once (well within the
    # store's one-second recheck) switches the calibration, both ways
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    entry = {"factors": {"compute": 1.25}, "measurements": [{"shape": [1, 512]}]}
    (second / STORE_NAME).write_text(json.dumps({"version": 1, "entries": {"rtx4090|hf-trainer": entry}}))
    forget()
    try:
        monkeypatch.setenv(PATH_VARIABLES[0], str(first))
        assert store_path() == str(first / STORE_NAME)
        assert calibration_for("rtx4090", "hf-trainer") is None
        monkeypatch.setenv(PATH_VARIABLES[0], str(second))
        assert store_path() == str(second / STORE_NAME)
        cal = calibration_for("rtx4090", "hf-trainer")
        assert cal is not None and cal["factors"] == {"compute": 1.25}
        monkeypatch.setenv(PATH_VARIABLES[0], str(first))
        assert calibration_for("rtx4090", "hf-trainer") is None
    finally:
        forget()


def test_an_unchanged_environment_within_the_recheck_interval_reads_nothing(tmp_path, monkeypatch) -> None:
    # the store stat'ed once: the next estimates in the same environment, within RECHECK_SECONDS, compare the
    # environment's stamp only; a changed variable is a new path, stat'ed at once
    from tuneplan.estimator import step_calibration

    stats: list[str] = []
    real_stat = os.stat

    def counting_stat(p, *a, **k):  # type: ignore[no-untyped-def]
        if str(p).endswith(STORE_NAME):  # the store's own stat (the config folder's look-ups aside)
            stats.append(str(p))
        return real_stat(p, *a, **k)

    forget()
    try:
        monkeypatch.setenv(PATH_VARIABLES[0], str(tmp_path / "a"))
        monkeypatch.setattr(step_calibration.os, "stat", counting_stat)
        assert calibration_for("rtx4090", "hf-trainer") is None
        assert calibration_for("rtx4090", "hf-trainer") is None
        assert stats == [str(tmp_path / "a" / STORE_NAME)]
        monkeypatch.setenv(PATH_VARIABLES[0], str(tmp_path / "b"))
        assert calibration_for("rtx4090", "hf-trainer") is None
        assert stats[1:] == [str(tmp_path / "b" / STORE_NAME)]
    finally:
        forget()
