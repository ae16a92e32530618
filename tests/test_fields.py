"""The field table (specs/fields/) covers every TrainSetup field and every key the ingest readers and the
exporters use today, and the faces generated from it show what it says."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

import tuneplan
from tuneplan.specs import fields
from tuneplan.specs.setup import METHODS, TrainSetup

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
        assert row.help and row.widget in fields.WIDGETS, name
        assert set(row.keys) | set(row.via) <= set(fields.FORMATS), name
        assert set(row.methods) <= set(METHODS), name
        for fmt in row.keys:  # a name is either plain or translated, never both
            assert not set(row.keys[fmt]) & set(row.via.get(fmt, ())), (name, fmt)


@pytest.mark.parametrize("module", sorted(READERS))
def test_every_key_an_ingest_reader_uses_is_in_the_table(module: str) -> None:
    fmt = READERS[module]
    found = _reader_keys(module)
    assert found or module == "common"
    missing = {(name, key) for name, key in found if key not in fields.get(name).names(fmt)}
    assert not missing, f"{module}.py reads keys the field table does not list under {fmt}: {sorted(missing)}"


@pytest.mark.parametrize("module", sorted(WRITERS))
def test_every_key_an_exporter_writes_is_in_the_table(module: str) -> None:
    fmt = WRITERS[module]
    found = _writer_keys(module)
    missing = {(name, key) for name, key in found if key not in fields.get(name).names(fmt)}
    assert not missing, (
        f"{module}.py writes keys the field table does not list under {fmt}: {sorted(missing)}"
    )


def test_lookups_by_file_key() -> None:
    # LLaMA-Factory's hparams (finetuning_args.py / data_args.py): lora_rank, lora_alpha, cutoff_len
    lf = fields.by_key("llamafactory")
    assert lf["lora_rank"] == "rank" and lf["lora_alpha"] == "alpha" and lf["cutoff_len"] == "seq"
    # axolotl's config: lora_r, micro_batch_size, sequence_len
    ax = fields.by_key("axolotl")
    assert ax["lora_r"] == "rank" and ax["micro_batch_size"] == "batch" and ax["sequence_len"] == "seq"
    # TrainingArguments / LoraConfig / BitsAndBytesConfig / TRL (max_length, and max_seq_length before 0.20)
    hf = fields.by_key("transformers")
    assert hf["per_device_train_batch_size"] == "batch" and hf["r"] == "rank" and hf["lora_r"] == "rank"
    assert hf["bnb_4bit_quant_type"] == "quant_type" and hf["max_length"] == hf["max_seq_length"] == "seq"
    assert fields.by_key("deepspeed") == {"train_micro_batch_size_per_gpu": "batch",
                                          "gradient_accumulation_steps": "grad_accum"}
    # num_processes is gpus x nodes: translated, never plain
    assert fields.by_key("accelerate") == {"num_machines": "nodes"}
    # a translated key is listed but never offered as plain: quantization_bit sets the method too
    assert "quantization_bit" in fields.get("method").via["llamafactory"] and "quantization_bit" not in lf
    with pytest.raises(KeyError):
        fields.by_key("yaml")


REC = Path(__file__).parent / "fixtures" / "recorded"
# axolotl is not installed here: its names as axolotl writes them into the configs it saves with a model
# (the "Built with Axolotl" cards of axolotl 0.3-0.4: sequence_len, micro_batch_size, lora_r...)
AXOLOTL_NAMES = {"sequence_len", "micro_batch_size", "gradient_accumulation_steps", "lora_r", "lora_alpha",
                 "lora_dropout"}
# TRL is not installed here: trl/trainer/sft_config.py SFTConfig.max_length (max_seq_length before TRL
# 0.20), trl/trainer/model_config.py ModelConfig.lora_r / lora_alpha / lora_dropout / use_bnb_nested_quant
TRL_NAMES = {"max_length", "max_seq_length", "lora_r", "lora_alpha", "lora_dropout", "use_bnb_nested_quant",
             "bnb_4bit_quant_type"}


def _framework_names(fmt: str) -> set[str]:
    """Every argument name the framework itself defines, read from the framework (or its record)."""
    if fmt == "llamafactory":
        rec = json.loads((REC / "llamafactory_args.json").read_text())
        return {n for names in rec["llamafactory_fields"].values() for n in names} | set(
            rec["transformers_training_args"])
    if fmt == "deepspeed":
        return set(json.loads((REC / "deepspeed_schema.json").read_text())["top_level"])
    if fmt == "accelerate":
        from accelerate.commands.config.config_args import ClusterConfig

        return {f.name for f in dataclasses.fields(ClusterConfig)}
    if fmt == "transformers":
        import inspect

        import peft
        import transformers

        return ({f.name for f in dataclasses.fields(transformers.TrainingArguments)}
                | {f.name for f in dataclasses.fields(peft.LoraConfig)}
                | set(inspect.signature(transformers.BitsAndBytesConfig.__init__).parameters) | TRL_NAMES)
    return AXOLOTL_NAMES


@pytest.mark.parametrize("fmt", fields.FORMATS)
def test_plain_keys_are_the_frameworks_own_names(fmt: str) -> None:
    names = _framework_names(fmt)
    plain = set(fields.by_key(fmt))
    assert plain and plain <= names, sorted(plain - names)
    # one plain key, one field: no key is claimed by two rows
    assert sum(len(f.keys.get(fmt, ())) for f in fields.FIELDS) == len(plain)


def test_a_reader_takes_every_plain_key_of_the_table() -> None:
    """A LLaMA-Factory YAML and a TRL config written with LLaMA-Factory's / TRL's own names (lora_rank 32,
    cutoff_len 1024, max_length 1024...) read back as those values, each sourced to its key."""
    from tuneplan.ingest.document import Document
    from tuneplan.ingest.hf_args import read_hf_args
    from tuneplan.ingest.llamafactory import read_llamafactory

    lf = {"model_name_or_path": "m", "finetuning_type": "lora", "quantization_bit": 4,
          "quantization_type": "fp4", "double_quantization": False, "lora_rank": 32, "lora_alpha": 64,
          "lora_dropout": 0.1,
          "cutoff_len": 1024, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 5}
    got = read_llamafactory(Document("x.yaml", lf, "yaml"))
    want = {"method": "qlora", "bits": 4, "quant_type": "fp4", "double_quant": False, "rank": 32, "alpha": 64,
            "dropout": 0.1, "seq": 1024, "batch": 3, "grad_accum": 5}
    assert {k: got.fields[k] for k in want} == want
    assert got.sources["rank"].endswith("x.yaml:lora_rank")
    trl = {"use_peft": True, "lora_r": 8, "max_length": 2048, "max_seq_length": 512,
           "per_device_train_batch_size": 2, "gradient_checkpointing": True}
    got = read_hf_args(Document("sft.yaml", trl, "yaml"))
    # max_length, TRL's current name, wins over max_seq_length
    assert (got.fields["rank"], got.fields["seq"], got.fields["batch"]) == (8, 2048, 2)
    assert got.fields["gradient_checkpointing"] is True


def test_cli_flags_and_web_labels_come_from_the_table() -> None:
    from tuneplan.cli.options import SETUP_OPTIONS
    from tuneplan.web.wording import LABELS

    assert [n for n, _, _ in SETUP_OPTIONS] == [f.name for f in fields.cli_fields()]
    for name, _, opt in SETUP_OPTIONS:
        row = fields.get(name)
        assert (opt.default, *opt.param_decls) == row.flag and opt.help == row.cli_help()
    for name, label in fields.web_labels().items():
        assert LABELS[name] == label
    # the DeepSpeed details a config carries are not flags
    assert not {"ds_reduce_bucket", "ds_overlap_comm"} & {n for n, _, _ in SETUP_OPTIONS}


def test_the_torch_era_switches_are_not_setup_fields() -> None:
    """keep_grads, softmax_keeps_input and longest_batch_first only reproduce calibration rows of older
    stacks: no TrainSetup field, no row, no flag, no widget, nothing in --json; a TorchEraSetup carries them
    and the formulas see them."""
    from tuneplan.cli.options import SETUP_OPTIONS
    from tuneplan.specs.torch_era import SWITCHES, TorchEraSetup
    from tuneplan.web.form import DEFAULTS

    assert not set(SWITCHES) & (set(SETUP) | set(fields.BY_NAME) | {n for n, _, _ in SETUP_OPTIONS}
                                | set(DEFAULTS) | set(TrainSetup().to_dict()))
    assert all(getattr(TrainSetup(), n) is False for n in SWITCHES)
    era = TorchEraSetup(method="full", keep_grads=True).replace(batch=2)  # replace keeps the kind
    assert isinstance(era, TorchEraSetup) and era.keep_grads and era.to_dict()["keep_grads"] is True
    from tuneplan.api import build_setup
    from tuneplan.catalog.models import resolve_model

    spec = resolve_model("Qwen/Qwen2.5-0.5B", allow_network=False)
    s = build_setup(spec, method="full", softmax_keeps_input=True)
    assert isinstance(s, TorchEraSetup) and s.softmax_keeps_input and s.attn == "eager"  # torch < 1.11
    from tuneplan.cli.measure_cmd import _torch_era

    assert _torch_era("keep_grads, longest_batch_first") == {"keep_grads": True, "longest_batch_first": True}


def test_a_value_outside_accepted_is_refused_naming_the_field() -> None:
    from tuneplan.errors import TuneplanError

    for name in ("method", "precision", "optimizer", "attn", "offload", "framework", "loss", "quant_type"):
        row = fields.get(name)
        assert isinstance(row.accepted, tuple) and "no-such-value" not in row.accepted
        with pytest.raises(TuneplanError) as err:
            TrainSetup(**{name: "no-such-value"}).validate()
        assert err.value.field == name


def test_each_face_words_an_error_its_own_way(capsys: pytest.CaptureFixture[str]) -> None:
    """The core's error refers to fields; the CLI words them as flags (exit 2), ``--json`` keeps the field
    name beside the worded message, the API as field names, and no core message names a flag."""
    from tuneplan.cli.app import run
    from tuneplan.errors import TuneplanError

    args = ("estimate", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--bits", "8")
    assert run(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --bits: ") and "only applies to --method qlora" in err
    assert "accepted: use --method qlora, or leave out --bits" in err and "{" not in err
    assert run([*args, "--json"]) == 2
    d = json.loads(capsys.readouterr().out)["error"]
    assert d["field"] == "bits" and "--method qlora" in d["message"] and "--method qlora" in d["accepted"]
    # a switch: --no-flag when the value is false; a field without a flag keeps its name
    e = TuneplanError("x", field="fsdp",
                      accepted="{zero=0} with {fsdp}, {compile=false}, {ds_overlap_comm=true}")
    from tuneplan.cli.render import error_text

    assert error_text(e) == "--fsdp: x; accepted: --zero 0 with --fsdp, --no-compile, ds_overlap_comm=true"
    assert str(e) == "fsdp: x; accepted: zero=0 with fsdp, compile=false, ds_overlap_comm=true"


def test_core_error_messages_name_no_flag() -> None:
    """Every TuneplanError the setup, ingest, export and measure modules raise refers to fields as
    ``{field}``: no literal ``--flag`` in their messages or accepted values."""
    import re

    flag = re.compile(r"(?<![\w-])--[a-z]")
    found = []
    for folder in ("specs", "ingest", "export", "measure", "deploy", "doctor"):
        for path in sorted((SRC / folder).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for n in ast.walk(tree):
                if not (isinstance(n, ast.Call) and getattr(n.func, "id", "").endswith("Error")):
                    continue
                parts = [*n.args, *(k.value for k in n.keywords if k.arg in ("accepted", "field"))]
                for c in (c for part in parts for c in ast.walk(part)):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and flag.search(c.value):
                        found.append(f"{path.name}:{c.lineno}: {c.value[:60]}")
    assert not found, found


def test_a_row_with_a_widget_gets_one_on_the_page() -> None:
    """Rows the page does not lay out by hand get a generated widget; its value reaches the setup as the
    CLI's flag would pass it, and the default (an unticked box, the profile's choice, an empty box) passes
    nothing."""
    from tuneplan.errors import TuneplanError
    from tuneplan.web import form

    assert {f.name for f in fields.FIELDS if f.widget != "none"} <= set(form.DEFAULTS)  # every one is on it
    switch = fields.row("x_switch", bool, False, "a switch", label="X", widget="checkbox")
    assert form.widget_default(switch) is False
    assert form.widget_value(switch, False) == {} and form.widget_value(switch, True) == {"x_switch": True}
    count = fields.row("x_count", int, None, "a count", accepted=">= 0", label="N", widget="number")
    assert form.widget_value(count, "") == {} and form.widget_value(count, 3.0) == {"x_count": 3}
    with pytest.raises(TuneplanError) as e:
        form.widget_value(count, "three")
    assert e.value.field == "x_count"
    vocab = fields.row("x_kind", str, None, "a kind", accepted=("a", "b"), label="K", widget="dropdown")
    assert form.widget_default(vocab) == form.AUTO and form.widget_value(vocab, form.AUTO) == {}
    assert form.widget_value(vocab, "b") == {"x_kind": "b"}
    ranged = fields.row("x_range", int, 4, "a range", accepted="1..8", label="R", widget="dropdown")
    assert form.widget_kind(ranged) == "textbox"  # no vocabulary to drop down


def test_the_readers_warnings_are_worded_by_the_cli(tmp_path: Path) -> None:
    """A reader's warning refers to fields as {field} too; the CLI shows it with the flag."""
    from tuneplan.cli.from_option import resolve_from

    p = tmp_path / "training_args.json"
    p.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True}))
    r = resolve_from([str(p)], "Qwen/Qwen2.5-0.5B", {})
    assert any("{seq}" in w for w in r.resolved.warnings)  # the reader's own text names the field
    assert any("give --seq, or a TRL max_length" in w for w in r.warnings())
