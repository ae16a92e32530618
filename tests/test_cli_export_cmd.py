"""cli/export_cmd.py: where `tuneplan export` writes (a file, a folder with the format's own names, or
stdout), never over an existing file without --force, and its text is build_export's."""

from __future__ import annotations

import json
import os

from tuneplan.cli.app import run
from tuneplan.cli.export_cmd import _main_file

MODEL = "Qwen/Qwen2.5-0.5B"


def test_main_file(tmp_path):
    assert _main_file(None, "train.py") == "train.py"
    assert _main_file("out/", "train.py") == os.path.join("out/", "train.py")
    # an existing folder, even without the slash
    assert _main_file(str(tmp_path), "train.py") == os.path.join(str(tmp_path), "train.py")
    assert _main_file(str(tmp_path / "mine.py"), "train.py") == str(tmp_path / "mine.py")


def test_stdout_json_carries_the_text(capsys):
    code = run(["export", MODEL, "--format", "llamafactory", "--method", "lora", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["format"] == "llamafactory" and out["files"] == []
    assert "finetuning_type: lora" in out["text"]


def test_writes_into_a_folder_and_refuses_to_overwrite(capsys, tmp_path):
    folder = str(tmp_path) + "/"
    ds = ["export", MODEL, "--format", "deepspeed", "--gpus", "2", "-o", folder, "--json"]
    code = run([*ds, "--zero", "2"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and len(out["files"]) == 1
    written = out["files"][0]
    assert os.path.dirname(written) == str(tmp_path)
    first = open(written).read()
    assert json.loads(first)["zero_optimization"]["stage"] == 2
    code = run([*ds, "--zero", "3"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and err["field"] == "output"
    assert open(written).read() == first  # untouched
    code = run([*ds, "--zero", "3", "--force"])
    capsys.readouterr()
    assert code == 0 and json.loads(open(written).read())["zero_optimization"]["stage"] == 3


def test_a_plan_with_companion_files_needs_an_output_path(capsys):
    # an accelerate YAML for a ZeRO plan points at a DeepSpeed JSON written beside it: two files
    code = run(["export", MODEL, "--format", "accelerate", "--zero", "2", "--gpus", "2", "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert code == 2 and err["field"] == "output"
