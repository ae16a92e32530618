"""The field table (specs/fields.py) covers every TrainSetup field and every key the ingest readers and the
exporters use today, and the faces generated from it show what it says."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import tuneplan
from tuneplan.specs import fields
from tuneplan.specs.setup import TrainSetup

SRC = Path(tuneplan.__file__).parent
SETUP = {f.name: f for f in dataclasses.fields(TrainSetup) if f.name != "sources"}
# module -> the file format whose keys it reads or writes
READERS = {
    "llamafactory": "llamafactory",
    "axolotl": "axolotl",
    "hf_args": "transformers",
    "common": "transformers",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
}
WRITERS = {
    "llamafactory_yaml": "llamafactory",
    "deepspeed_json": "deepspeed",
    "accelerate_yaml": "accelerate",
    "hf_script": "transformers",
}


def _reader_keys(module: str) -> set[tuple[str, str]]:
    """(field, key) of every ``Collector.set("field", value, "key")`` call in an ingest reader."""
    tree = ast.parse((SRC / "ingest" / f"{module}.py").read_text(encoding="utf-8"))
    out = set()
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "set"
            and len(n.args) >= 3
        ):
            name, key = n.args[0], n.args[2]
            if (
                isinstance(name, ast.Constant)
                and isinstance(key, ast.Constant)
                and isinstance(key.value, str)
            ):
                out.add((name.value, key.value))
    return out


def _writer_keys(module: str) -> set[tuple[str, str]]:
    """(field, key) of every ``{"key": setup.field}`` entry an exporter writes (its own names excluded)."""
    tree = ast.parse((SRC / "export" / f"{module}.py").read_text(encoding="utf-8"))
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values, strict=True):
                if (
                    isinstance(k, ast.Constant)
                    and isinstance(k.value, str)
                    and isinstance(v, ast.Attribute)
                    and v.attr in SETUP
                    and k.value != v.attr
                ):
                    out.add((v.attr, k.value))
    return out


def test_one_row_per_setup_field_with_its_default() -> None:
    assert [f.name for f in fields.FIELDS] == list(dict.fromkeys(f.name for f in fields.FIELDS))
    assert set(fields.BY_NAME) == set(SETUP)
    for name, f in SETUP.items():
        row = fields.get(name)
        assert row.default == f.default, name
        assert row.help and row.widget in fields.WIDGETS and set(row.keys) <= set(fields.FORMATS), name
        assert row.plain <= set(row.keys), name


@pytest.mark.parametrize("module", sorted(READERS))
def test_every_key_an_ingest_reader_uses_is_in_the_table(module: str) -> None:
    fmt = READERS[module]
    found = _reader_keys(module)
    assert found or module == "common"
    missing = {(name, key) for name, key in found if key not in fields.get(name).keys.get(fmt, ())}
    assert not missing, f"{module}.py reads keys the field table does not list under {fmt}: {sorted(missing)}"


@pytest.mark.parametrize("module", sorted(WRITERS))
def test_every_key_an_exporter_writes_is_in_the_table(module: str) -> None:
    fmt = WRITERS[module]
    found = _writer_keys(module)
    assert found
    missing = {(name, key) for name, key in found if key not in fields.get(name).keys.get(fmt, ())}
    assert not missing, (
        f"{module}.py writes keys the field table does not list under {fmt}: {sorted(missing)}"
    )


def test_lookups_by_file_key() -> None:
    # LLaMA-Factory's hparams (finetuning_args.py / data_args.py): lora_rank, lora_alpha, cutoff_len
    lf = fields.by_llamafactory_key()
    assert lf["lora_rank"] == "rank" and lf["lora_alpha"] == "alpha" and lf["cutoff_len"] == "seq"
    # axolotl's config: lora_r, micro_batch_size, sequence_len
    ax = fields.by_axolotl_key()
    assert ax["lora_r"] == "rank" and ax["micro_batch_size"] == "batch" and ax["sequence_len"] == "seq"
    # TrainingArguments / LoraConfig / BitsAndBytesConfig
    hf = fields.by_transformers_key()
    assert hf["per_device_train_batch_size"] == "batch" and hf["r"] == "rank"
    assert hf["bnb_4bit_quant_type"] == "quant_type"
    assert fields.by_deepspeed_key()["train_micro_batch_size_per_gpu"] == "batch"
    assert fields.by_accelerate_key() == {
        "num_machines": "nodes"
    }  # num_processes is gpus x nodes: translated
    # a translated key is listed but never offered as plain: quantization_bit sets the method too
    assert "quantization_bit" in fields.get("method").keys["llamafactory"]
    with pytest.raises(KeyError):
        fields.by_key("yaml")


def test_cli_flags_and_web_labels_come_from_the_table() -> None:
    from tuneplan.cli.options import SETUP_OPTIONS
    from tuneplan.web.wording import LABELS

    assert [n for n, _, _ in SETUP_OPTIONS] == [f.name for f in fields.cli_fields()]
    for name, _, opt in SETUP_OPTIONS:
        row = fields.get(name)
        assert (opt.default, *opt.param_decls) == row.flag and opt.help == row.cli_help()
    for name, label in fields.web_labels().items():
        assert LABELS[name] == label
    # the calibration switches and DeepSpeed details are not user-facing flags
    assert not {"longest_batch_first", "ds_reduce_bucket", "ds_overlap_comm"} & {
        n for n, _, _ in SETUP_OPTIONS
    }


def test_a_value_outside_accepted_is_refused_naming_the_field() -> None:
    from tuneplan.errors import TuneplanError

    for name in ("method", "precision", "optimizer", "attn", "offload", "framework", "loss", "quant_type"):
        row = fields.get(name)
        assert isinstance(row.accepted, tuple) and "no-such-value" not in row.accepted
        with pytest.raises(TuneplanError) as err:
            TrainSetup(**{name: "no-such-value"}).validate()
        assert err.value.field == name
