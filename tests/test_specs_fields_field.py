"""specs/fields/field.py: one setup field's row (names per format, methods, metavar, help text)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from tuneplan.specs.fields.field import FORMATS, LORA, WIDGETS, Field, row


def test_row_freezes_its_name_tables():
    keys = {"llamafactory": ("lora_rank",)}
    f = row("rank", int, 16, "LoRA rank", keys=keys, via={"axolotl": ("lora_r",)})
    assert isinstance(f.keys, MappingProxyType) and isinstance(f.via, MappingProxyType)
    keys["llamafactory"] = ("changed",)  # the row keeps its own copy
    assert f.keys["llamafactory"] == ("lora_rank",)
    with pytest.raises(TypeError):
        f.keys["axolotl"] = ("x",)  # type: ignore[index]


def test_names_lists_plain_keys_then_translated_ones():
    f = row("precision", str, "bf16-mixed", "precision",
            keys={"transformers": ("bf16_plain",)}, via={"transformers": ("bf16", "fp16")})
    assert f.names("transformers") == ("bf16_plain", "bf16", "fp16")
    assert f.names("deepspeed") == ()


def test_applies_to_follows_methods():
    universal = row("batch", int, 1, "micro-batch")
    assert universal.applies_to(None) and universal.applies_to("full")
    lora_only = row("rank", int, 16, "LoRA rank", methods=LORA)
    assert lora_only.applies_to("lora") and lora_only.applies_to("qlora")
    assert not lora_only.applies_to("full")
    assert not lora_only.applies_to(None)  # method unknown yet: only the universal fields apply


@pytest.mark.parametrize("type_, expected",
                         [(int, "N"), (float, "X"), (str, "OPTIMIZER"), (bool, "OPTIMIZER")])
def test_metavar_by_type(type_, expected):
    assert row("optimizer", type_, None, "h").metavar == expected


def test_cli_help_joins_help_accepted_and_unit():
    f = row("attn", str, None, "Attention kernel", accepted=("eager", "sdpa", "flash"), unit="kernel")
    assert f.cli_help() == "Attention kernel [eager | sdpa | flash] (kernel)"
    ranged = row("seq", int, 512, "Tokens per sequence", accepted="1..4194304", unit="tokens")
    assert ranged.cli_help() == "Tokens per sequence [1..4194304] (tokens)"


def test_cli_help_of_a_switch_leaves_out_the_accepted_values():
    f = row("fsdp", bool, False, "Shard with FSDP", accepted=(True, False))
    assert f.is_switch
    assert f.cli_help() == "Shard with FSDP"


def test_defaults_of_a_bare_field():
    f = Field("x", int, 0, "help")
    assert f.widget == "none" and f.widget in WIDGETS
    assert f.flag == () and f.methods == () and f.names(FORMATS[0]) == ()
