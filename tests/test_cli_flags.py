"""cli/flags.py: a flag declared once as data, built as a click option (and typed for typer)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from tuneplan.cli.flags import Flag, click_command, click_option

BATCH = Flag("batch", int, ("--batch",), "Sequences per GPU")
FROM = Flag("from_", str, ("--from",), "A config file", repeat=True)
GC = Flag("gc", bool, ("--gc/--no-gc",), "Checkpointing", default=None)
SWITCH = Flag("quiet", bool, ("--quiet",), "Less output", default=False)


def test_annotations():
    assert BATCH.annotation() == int | None
    assert FROM.annotation() == list[str] | None
    assert GC.annotation() == bool | None  # no default: unset stays None
    assert SWITCH.annotation() is bool


def test_shown_metavar_follows_typers_plain_help():
    assert BATCH.shown_metavar() == "<int>"
    assert FROM.shown_metavar() == "<list[str]>"
    assert GC.shown_metavar() is None
    assert Flag("x", float, ("--x",), "h", metavar="X").shown_metavar() == "X"


def test_click_options_parse_their_values():
    seen = {}

    def run(**kw):
        seen.update(kw)

    cmd = click_command("estimate", run, doc="Estimate.", argument=("model", "The model"),
                        flags=[BATCH, FROM, GC, SWITCH])
    args = ["m/x", "--batch", "4", "--from", "a.yaml", "--from", "b.json", "--no-gc"]
    result = CliRunner().invoke(cmd, args)
    assert result.exit_code == 0, result.output
    assert seen == {"model": "m/x", "batch": 4, "from_": ("a.yaml", "b.json"), "gc": False, "quiet": False}


def test_a_bad_value_is_a_usage_error():
    cmd = click_command("estimate", lambda **kw: None, doc="d", argument=("model", "m"), flags=[BATCH])
    result = CliRunner().invoke(cmd, ["--batch", "four"])
    assert result.exit_code == 2 and "--batch" in result.output


def test_help_lists_the_argument_first():
    cmd = click_command("estimate", lambda **kw: None, doc="Estimate it.", argument=("model", "The model"),
                        flags=[BATCH])
    text = CliRunner().invoke(cmd, ["--help"]).output
    assert text.index("Arguments") < text.index("--batch")
    assert "model <str>" in text and "<int>" in text


def test_click_option_of_a_switch():
    opt = click_option(SWITCH)
    assert isinstance(opt, click.Option) and opt.is_flag and opt.default is False
