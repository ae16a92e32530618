"""Layout helpers for the planner's tables (fit, gpus, max-model, sweep, compare) at 80 columns.

Formatting only: short labels, compact tables, identifiers split at their hyphens. No number is computed here.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table

from tuneplan.cli.render import console

# Short strategy labels for the tables; the JSON keeps the names of plan.space (SINGLE, MULTI).
_STRATEGY_WORDS = (("zero-", "Z"), ("+offload-optimizer", "+cpu-opt"), ("+offload-all", "+cpu-all"),
                   ("fsdp", "FSDP"), ("ddp", "DDP"))
# (what a strategy name contains, what its short label means), for the legend under a table
_LEGEND = (("zero-", "Z1-Z3: DeepSpeed ZeRO stage"), ("fsdp", "FSDP: PyTorch's sharded data parallel"),
           ("ddp", "DDP: data parallel, the whole model on each GPU"),
           ("offload-optimizer", "+cpu-opt: optimizer states in host memory"),
           ("offload-all", "+cpu-all: parameters and optimizer states in host memory"))


def short_strategy(name: str | None) -> str:
    """``zero-3+offload-all`` -> ``Z3+cpu-all``; ``single``, ``-`` for none."""
    if not name:
        return "-"
    for long, short in _STRATEGY_WORDS:
        name = name.replace(long, short)
    return name


def strategy_legend(names: list[str | None]) -> str:
    """What the short labels of these strategies mean; "" when none is abbreviated."""
    return "; ".join(text for part, text in _LEGEND if any(n and part in n for n in names))


def compact_table() -> Table:
    """A table without vertical rules: one rule under the header, two spaces between columns."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)


def show(table: Table, title: str | None = None) -> None:
    """The title as a line of its own (a table title would wrap to the table's width), then the table."""
    if title:
        console.print(f"[bold]{title}[/]", highlight=False)
    console.print(table)


def split_id(text: str, width: int = 16) -> str:
    """An identifier over ``width`` characters on several lines, broken after its hyphens, never in a part."""
    if len(text) <= width:
        return text
    lines, cur = [], ""
    for part in text.split("-"):
        piece = part if not cur else "-" + part
        if cur and len(cur) + len(piece) > width - 1:  # room for the hyphen that ends the line
            lines.append(cur + "-")
            cur = part
        else:
            cur += piece
    return "\n".join([*lines, cur])


def num(v: Any, fmt: str = "{:,.3g}") -> str:
    """A figure in ``fmt``; ``-`` for none."""
    return "-" if v is None else fmt.format(v)


def hours(v: float | None) -> str:
    """Hours: whole from 100 up, two decimals below; ``-`` for none."""
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def extras(requires: list[str]) -> list[str]:
    """The switches of a setup besides its strategy (checkpointing, optimizer): the strategy has its
    own column."""
    return [r for r in requires if not r.startswith(("zero-", "fsdp", "no-fsdp", "offload-"))]


def legend(names: list[str | None]) -> None:
    """The legend of the short strategy labels shown, as a dim line; nothing when none is short."""
    text = strategy_legend(names)
    if text:
        console.print(f"[dim]{text}[/]")
