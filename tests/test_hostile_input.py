"""Regression tests for hostile and careless input: each case once crashed, hung or was accepted as sense.

Every case runs the CLI in process through ``tuneplan.cli.app.run`` (what the console script calls) and
checks the contract: exit 2 with a message naming the field for bad input, never a traceback, one strict
JSON object with ``--json``, and nothing written through a symbolic link or left half-written.
"""

from __future__ import annotations

import errno
import json
import os
import py_compile
import time

import pytest

from tests.conftest import TINY_LLAMA

MOE = {"model_type": "deepseek_v3", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
       "intermediate_size": 688, "vocab_size": 1000, "n_routed_experts": 8, "num_experts_per_tok": 2,
       "moe_intermediate_size": 128, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
       "v_head_dim": 32}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from tuneplan.cli.app import run

    code = run(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def write_config(tmp_path, cfg: dict, name: str = "config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


# ---- numbers and names on the command line ------------------------------------------------------
@pytest.mark.parametrize("args", [("fit", "qwen2.5-3b", "--gpu", "l20", "--bits", "7"),
                                  ("max-model", "--gpu", "l4", "--bits", "16")])
def test_bits_outside_4_8_is_bad_input(capsys, args):
    code, _, err = cli(capsys, *args)
    assert code == 2
    assert "bits" in err and "4, 8" in err


def test_model_name_longer_than_a_file_name(capsys):
    code, _, err = cli(capsys, "estimate", "a" * 300)
    assert code == 2 and "unknown model" in err


def test_home_of_a_user_that_does_not_exist(capsys):
    code, _, err = cli(capsys, "estimate", "~nosuchuser/x")
    assert code == 2 and "model" in err and "~nosuchuser" in err


@pytest.mark.parametrize("flag,field", [("--weights", "weights"), ("--record", "record")])
def test_measure_paths_in_the_home_of_a_user_that_does_not_exist(capsys, flag, field):
    # Path.expanduser raises RuntimeError for an unknown user: a bad path, not an internal error
    code, _, err = cli(capsys, "measure", "qwen2.5-0.5b", flag, "~nosuchuser/x")
    assert code == 2 and f"--{field}" in err and "~nosuchuser" in err


@pytest.mark.parametrize("flag", ["--card-price", "--kwh-price", "--epochs", "--price", "--own-years"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_non_finite_prices_and_epochs_are_refused_with_a_json_error(capsys, flag, value):
    code, out, _ = cli(capsys, "estimate", "qwen2.5-3b", "--gpu", "a100-80gb", "--samples", "1000", flag,
                       value, "--json")
    assert code == 2
    err = strict(out)["error"]
    assert err["kind"] == "bad_input" and err["message"] and err["field"]


def test_argument_with_a_nul_byte(capsys):
    code, _, err = cli(capsys, "estimate", "qwen\x00x")
    assert code == 2 and "NUL" in err


# ---- config.json --------------------------------------------------------------------------------
def test_negative_intermediate_size_is_refused_before_any_formula(capsys, tmp_path):
    path = write_config(tmp_path, {**TINY_LLAMA, "intermediate_size": -14336})
    code, out, _ = cli(capsys, "estimate", path, "--json")
    assert code == 2
    err = strict(out)["error"]
    assert err["field"].endswith("intermediate_size") and "1.." in err["accepted"]


def test_moe_layer_freq_zero(capsys, tmp_path):
    code, _, err = cli(capsys, "estimate", write_config(tmp_path, {**MOE, "moe_layer_freq": 0}))
    assert code == 2 and "moe_layer_freq" in err


def test_a_billion_layers_is_refused_at_once(capsys, tmp_path):
    start = time.perf_counter()
    code, _, err = cli(capsys, "estimate", write_config(tmp_path, {**TINY_LLAMA, "num_hidden_layers": 10**9}))
    assert code == 2 and "num_hidden_layers" in err
    assert time.perf_counter() - start < 5


def test_nan_in_config_json_is_not_json(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY_LLAMA)[:-1] + ', "rope_theta": NaN}')
    code, _, err = cli(capsys, "estimate", str(p))
    assert code == 2 and "NaN" in err


def test_config_too_deep(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = cli(capsys, "estimate", str(p))
    assert code == 2 and "nested deeper" in err


def test_binary_config(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\xff\xfe\x00\x81" * 64)
    code, _, err = cli(capsys, "estimate", str(p))
    assert code == 2 and "UTF-8" in err


def test_config_with_bom_is_read(capsys, tmp_path):
    p = tmp_path / "config.json"
    p.write_text("\ufeff" + json.dumps(TINY_LLAMA), encoding="utf-8")
    code, out, _ = cli(capsys, "estimate", str(p), "--json")
    assert code == 0 and strict(out)["model"]["layers"] == 4


# ---- --from training configs --------------------------------------------------------------------
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_cutoff_len_in_from_file(capsys, tmp_path, value):
    p = tmp_path / "train.yaml"
    p.write_text(f"model_name_or_path: qwen2.5-3b\nstage: sft\nfinetuning_type: lora\ncutoff_len: {value}\n")
    code, _, err = cli(capsys, "estimate", "--from", str(p))
    assert code == 2 and "cutoff_len" in err


def test_yaml_alias_bomb_is_refused_quickly(capsys, tmp_path):
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(rows) + "\nmodel_name_or_path: qwen2.5-3b\n")
    assert p.stat().st_size < 400  # the 10-line, 300-byte document of the report
    start = time.perf_counter()
    code, _, err = cli(capsys, "estimate", "--from", str(p))
    assert code == 2 and "alias" in err
    assert time.perf_counter() - start < 5


def test_yaml_key_lines_do_not_follow_aliases():
    import yaml

    from tuneplan.ingest.document import _yaml_lines

    text = "a: &a {x: 1, y: 2}\nb: *a\nc: *a\n"
    lines: dict = {}
    _yaml_lines(yaml.compose(text, Loader=yaml.SafeLoader), (), lines)
    # the aliased mapping is walked once, under its anchor; its aliases add only their own key
    assert lines == {("a",): 1, ("a", "x"): 1, ("a", "y"): 1, ("b",): 2, ("c",): 3}


def test_recursive_yaml_alias(capsys, tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("a: &a [*a]\nmodel_name_or_path: qwen2.5-3b\n")
    code, _, err = cli(capsys, "estimate", "--from", str(p))
    assert code == 2 and "recursive" in err


def test_deep_yaml(capsys, tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = cli(capsys, "estimate", "--from", str(p))
    assert code == 2 and "nested deeper" in err


def test_file_larger_than_any_config(capsys, tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("# " + "x" * (5 * 1024 * 1024))
    code, _, err = cli(capsys, "estimate", "--from", str(p))
    assert code == 2 and "MiB" in err


# ---- hardware files and doctor machine files ----------------------------------------------------
def test_nan_memory_in_hardware_file(capsys, tmp_path):
    p = tmp_path / "hw.toml"
    p.write_text("[accelerators.x]\nvendor = 'nvidia'\nmemory_gib = nan\n")
    code, _, err = cli(capsys, "estimate", "qwen2.5-3b", "--hardware-file", str(p), "--gpu", "x")
    assert code == 2 and "memory_gib" in err


def test_binary_hardware_file(capsys, tmp_path):
    p = tmp_path / "hw.yaml"
    p.write_bytes(b"\xff\xfe\x00binary\x80\x81")
    code, _, err = cli(capsys, "accelerators", "--hardware-file", str(p))
    assert code == 2 and "UTF-8" in err


@pytest.mark.parametrize("text", ["[1, 2]", '{"devices": [{"name": "x", "memory_total_bytes": NaN}]}',
                                  '{"devices": {"a": 1}}', '{"devices": [{"name": "x", "index": "zero"}]}',
                                  '{"versions": {"torch": {"a": 1}}}', '{"devices": [{"name": "x", '
                                  '"compute_capability": ["a", "b"]}]}'])
def test_malformed_machine_files(capsys, tmp_path, text):
    p = tmp_path / "m.json"
    p.write_text(text)
    code, out, _ = cli(capsys, "doctor", "--machine", str(p), "--json")
    assert code == 2 and strict(out)["error"]["field"] == "machine"


def test_binary_machine_file(capsys, tmp_path):
    p = tmp_path / "m.yaml"
    p.write_bytes(bytes(range(256)))
    code, _, err = cli(capsys, "doctor", "--machine", str(p))
    assert code == 2 and "machine" in err


# ---- exit codes ---------------------------------------------------------------------------------
def test_internal_error_is_exit_3_one_line_and_traceback_only_with_debug(capsys, monkeypatch):
    import tuneplan.api as api

    def boom(*a, **k):
        raise RuntimeError("simulated defect\nsecond line")

    monkeypatch.setattr(api, "estimate", boom)
    code, out, err = cli(capsys, "estimate", "qwen2.5-3b")
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "RuntimeError: simulated defect" in err and "report" in err
    code, out, _ = cli(capsys, "estimate", "qwen2.5-3b", "--json")
    assert code == 3 and strict(out)["error"]["kind"] == "internal"
    from tuneplan.cli.app import run

    assert run(["--debug", "estimate", "qwen2.5-3b"]) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_usage_error_with_json_is_an_error_object(capsys):
    code, out, _ = cli(capsys, "estimate", "qwen2.5-3b", "--batch", "x", "--json")
    assert code == 2 and strict(out)["error"]["kind"] == "bad_input"


def test_does_not_fit_is_exit_1(capsys):
    code, out, _ = cli(capsys, "estimate", "qwen2.5-7b", "--gpu", "t4", "--method", "full", "--json")
    assert code == 1 and strict(out)["fits"] is False


# ---- writes -------------------------------------------------------------------------------------
def test_export_refuses_a_dangling_symlink_and_force_replaces_the_link(capsys, tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    os.symlink(outside / "planted.py", out / "train.py")
    code, _, err = cli(capsys, "export", "qwen2.5-3b", "-o", str(out / "train.py"))
    assert code == 2 and "symbolic link" in err
    assert not (outside / "planted.py").exists()
    code, _, _ = cli(capsys, "export", "qwen2.5-3b", "-o", str(out / "train.py"), "--force")
    assert code == 0
    assert not (out / "train.py").is_symlink() and (out / "train.py").is_file()
    assert list(outside.iterdir()) == []


def test_force_through_a_symlink_never_changes_the_target(capsys, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    victim.chmod(0o600)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / "train.py")
    code, _, _ = cli(capsys, "export", "qwen2.5-3b", "-o", str(out / "train.py"), "--force")
    assert code == 0
    assert victim.read_text() == "mine\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert os.access(out / "train.py", os.X_OK) and not (out / "train.py").is_symlink()


def test_a_symlinked_companion_file_refuses_the_whole_export(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(tmp_path / "elsewhere.json", out / "ds_z3_config.json")
    code, _, err = cli(capsys, "export", "qwen2.5-3b", "-o", str(out / "train.py"), "--zero", "3",
                       "--gpus", "2")
    assert code == 2 and "ds_z3_config.json" in err
    assert not (out / "train.py").exists() and not (tmp_path / "elsewhere.json").exists()


def test_multi_file_write_is_all_or_nothing_on_a_full_disk(tmp_path, monkeypatch):
    from tuneplan import safe_write
    from tuneplan.errors import TuneplanError

    (tmp_path / "b.json").write_text("old\n")
    real = os.fsync
    calls = []

    def full_disk(fd):
        calls.append(fd)
        if len(calls) == 2:  # the second file does not fit
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(safe_write.os, "fsync", full_disk)
    files = [safe_write.OutFile(tmp_path / "a.py", b"print(1)\n", True),
             safe_write.OutFile(tmp_path / "b.json", b"{}")]
    with pytest.raises(TuneplanError, match="No space left"):
        safe_write.write_files(files, force=True, field="--output")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]  # no a.py, no temporary files
    assert (tmp_path / "b.json").read_text() == "old\n"


def test_sweep_plot_refuses_to_overwrite_without_force(capsys, tmp_path):
    plot = tmp_path / "sweep.html"
    plot.write_text("my own page")
    args = ("sweep", "qwen2.5-0.5b", "--vary", "seq=512..1024", "--plot", str(plot))
    code, _, err = cli(capsys, *args)
    assert code == 2 and "already exist" in err and plot.read_text() == "my own page"
    code, _, _ = cli(capsys, *args, "--force")
    assert code == 0 and plot.read_text().lstrip().startswith("<")


@pytest.mark.parametrize("folder", ["C:\\Users\\Nobody", "x\\N{y}"])
def test_train_script_compiles_with_backslash_escapes_in_paths(capsys, tmp_path, folder):
    model_dir = tmp_path / folder
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
    out = tmp_path / "train.py"
    code, _, _ = cli(capsys, "export", str(model_dir), "-o", str(out), "--dataset", "d:\\Users\\N")
    assert code == 0
    py_compile.compile(str(out), doraise=True)
    assert str(model_dir) in out.read_text().replace("\\\\", "\\")


# ---- found by benchmarks/fuzz.py ------------------------------------------------------------------
def test_deepspeed_file_under_an_unknown_home_is_a_file_not_found(capsys, tmp_path):
    p = tmp_path / "lf.yaml"
    p.write_text('model_name_or_path: qwen2.5-3b\nstage: sft\nfinetuning_type: lora\n'
                 'deepspeed: "~nosuchuser/x"\n')
    code, out, _ = cli(capsys, "estimate", "--from", str(p), "--json")
    assert code == 0 and strict(out)["model"]["name"] == "Qwen/Qwen2.5-3B"


@pytest.mark.parametrize("value", ["-1", ".nan", ".inf", "{a: 1}"])
def test_fsdp_of_the_wrong_type(capsys, tmp_path, value):
    p = tmp_path / "axolotl.yaml"
    p.write_text(f"base_model: qwen2.5-3b\nadapter: lora\nfsdp: {value}\n")
    code, _, err = cli(capsys, "estimate", "--from", str(p))
    assert code == 2 and "fsdp" in err


def test_a_card_named_thousands_of_times_is_searched_once(capsys):
    start = time.perf_counter()
    code, out, _ = cli(capsys, "gpus", "qwen2.5-3b", "--only", ",".join(["l4", "a100-80gb-sxm4"] * 1500),
                       "--json")
    assert code == 0
    assert len(strict(out)["ranking"]) == 2
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize("flag", ["--context", "--prefill-tokens", "--concurrency", "--tp"])
def test_deploy_numbers_beyond_float_range(capsys, flag):
    code, out, _ = cli(capsys, "deploy", "llama-3.1-8b", "--gpu", "mi300x", flag, "9" * 80, "--json")
    assert code == 2 and strict(out)["error"]["field"] == flag.lstrip("-").replace("-", "_")
