"""cli/plan_layout.py: the planner tables' short strategy labels, their legend, and identifiers split at
hyphens for 80 columns."""

from __future__ import annotations

import pytest

from tuneplan.cli.plan_layout import short_strategy, split_id, strategy_legend


@pytest.mark.parametrize("name, short", [
    ("zero-3+offload-all", "Z3+cpu-all"), ("zero-2+offload-optimizer", "Z2+cpu-opt"), ("fsdp", "FSDP"),
    ("ddp", "DDP"), ("single", "single"), (None, "-"), ("", "-"),
])
def test_short_strategy(name, short):
    assert short_strategy(name) == short


def test_legend_names_only_the_abbreviations_shown():
    assert strategy_legend(["single", None]) == ""
    legend = strategy_legend(["zero-3+offload-all", "ddp"])
    assert "Z1-Z3" in legend and "DDP" in legend and "+cpu-all" in legend
    assert "FSDP" not in legend and "+cpu-opt" not in legend


@pytest.mark.parametrize("text", ["rtx-pro-6000-blackwell-server-edition", "a100-80gb-sxm4",
                                  "h100-sxm5-80gb", "averyveryverylongpartwithouthyphens-x"])
def test_split_id_keeps_the_text_and_breaks_only_after_hyphens(text):
    out = split_id(text, 16)
    assert out.replace("\n", "") == text  # nothing lost, nothing added
    lines = out.split("\n")
    assert all(line.endswith("-") for line in lines[:-1])
    # a line is over the width only when it is one hyphen-free part that cannot be broken
    for line in lines:
        assert len(line) <= 16 or "-" not in line.rstrip("-")


def test_split_id_by_hand():
    assert split_id("short-id", 16) == "short-id"
    # "rtx-pro-6000-" is 13; adding "blackwell" would pass 15 (+1 for the hyphen ending the line)
    expected = "rtx-pro-6000-\nblackwell-\nserver-edition"
    assert split_id("rtx-pro-6000-blackwell-server-edition", 16) == expected
