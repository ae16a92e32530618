"""The dataset, price and machine flags of the time/cost model, declared once for every command that
shows or records time.

``with_time_options`` appends the flags to a command's signature (typer reads ``__signature__``) and
hands the command one dict, ``time_kw``, ready for ``tuneplan.api.estimate(**time_kw)``: ``dataset`` (a
validated DatasetSpec, or absent when no size was given), the price overrides the user gave and
``time_options``. ``with_machine_options`` appends only the flags that describe the machine a step runs
on (``MACHINE_FLAGS``: the link between its cards, the network between nodes) and hands the command
``time_options`` (``RuntimeOptions``, or None when neither was given): the commands that record a measured
step store them with it, so the step is predicted on the machine it ran on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

from tuneplan.cli.flags import Flag, typer_option

_P = "Time and cost"  # rich help panel


def _opt(*names: str, help: str) -> tuple[tuple[str, ...], str]:
    return names, help


# (name, type | None, (flag names, help)): the rows of TIME_FLAGS below
TIME_OPTIONS: list[tuple[str, Any, Any]] = [
    ("samples", int | None, _opt("--samples", help="training samples in the dataset")),
    ("avg_tokens", float | None, _opt("--avg-tokens", help="average tokens per sample after the template "
                                                           "(default: --seq)")),
    ("epochs", float | None, _opt("--epochs", help="passes over the data, fractions allowed (default 1)")),
    ("dataset_tokens", int | None, _opt("--dataset-tokens",
                                        help="tokens in one epoch (instead of --samples)")),
    ("packing", bool | None, _opt("--packing/--no-packing",
                                  help="pack samples into --seq rows (default: pad each to --seq)")),
    ("price", float | None, _opt("--price",
                                 help="cloud USD per GPU-hour (default: the catalog's dated reading)")),
    ("card_price", float | None, _opt("--card-price",
                                      help="purchase USD per card (default: catalog launch price)")),
    ("kwh_price", float | None, _opt("--kwh-price", help="electricity USD per kWh (default 0.15)")),
    ("own_years", float | None, _opt("--own-years", help="years an owned card is used (default 3)")),
    ("inter_node_gbs", float | None, _opt("--inter-node-gbs", help="network GB/s per GPU between nodes "
                                                                   "(default 25, InfiniBand HDR)")),
    ("link", str | None, _opt("--link", help="link between this machine's GPUs, e.g. pcie3x8, "
                                             "pcie4x16-nop2p, nvlink3 (default: the card's catalog "
                                             "interconnect)")),
]
# the rows as flags: typer options for ``with_time_options``, click options for the commands built with click
TIME_FLAGS: list[Flag] = [Flag(name, next(t for t in ann.__args__ if t is not type(None)), names, help,
                               panel=_P)
                          for name, ann, (names, help) in TIME_OPTIONS]
_DATASET = ("samples", "avg_tokens", "epochs", "dataset_tokens", "packing")
# the flags that change a step's seconds (the rest size the dataset or price the hours)
MACHINE_FLAGS: list[Flag] = [f for f in TIME_FLAGS if f.name in ("inter_node_gbs", "link")]


def time_kw_from(values: dict[str, Any]) -> dict[str, Any]:
    """Flags given -> keyword arguments of ``estimate`` (a DatasetSpec when any size was given)."""
    from tuneplan.specs.dataset import DatasetSpec

    given = {k: v for k, v in values.items() if v is not None}
    kw: dict[str, Any] = {k: given[k] for k in ("price", "card_price", "kwh_price", "own_years")
                          if k in given}
    options = machine_options_from(given)
    if options is not None:
        kw["time_options"] = options
    ds = {k: given[k] for k in _DATASET if k in given}
    if ds:
        kw["dataset"] = DatasetSpec(**ds).validate()
    return kw


def machine_options_from(values: dict[str, Any]) -> Any:
    """``--link`` / ``--inter-node-gbs`` given -> ``RuntimeOptions`` (None when neither was given); a value
    outside the accepted forms raises ``TuneplanError`` naming the flag."""
    given = {k: values[k] for k in ("inter_node_gbs", "link") if values.get(k) is not None}
    if not given:
        return None
    from tuneplan.errors import TuneplanError
    from tuneplan.estimator.links import STATED_LINK_FORMS, valid_stated_link
    from tuneplan.estimator.throughput import RuntimeOptions

    if given.get("inter_node_gbs", 1.0) <= 0:
        raise TuneplanError(f"{given['inter_node_gbs']:g} is not a bandwidth", field="inter_node_gbs",
                            accepted="GB/s per GPU > 0, e.g. 25 (InfiniBand HDR) or 50 (NDR)")
    if "link" in given and not valid_stated_link(given["link"]):
        raise TuneplanError(f"{given['link']!r} is not a link", field="link", accepted=STATED_LINK_FORMS)
    return RuntimeOptions(inter_node_gbs=given.get("inter_node_gbs"), peer_link=given.get("link"))


def _with_flags(func: Callable[..., Any], flags: list[Flag], param: str,
                build: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """``func`` with ``flags`` appended to its signature; the values given reach it as one argument,
    ``param`` = ``build(values)`` (checked before the command's own work starts)."""
    sig = inspect.signature(func)
    names = {f.name for f in flags}
    params = [p for p in sig.parameters.values() if p.name != param]
    for f in flags:
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[f.annotation(), typer_option(f)]))

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        values = {n: kwargs.pop(n, None) for n in names}
        return func(**{param: build(values)}, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


def with_time_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Every time and cost flag, handed over as ``time_kw``."""
    return _with_flags(func, TIME_FLAGS, "time_kw", time_kw_from)


def with_machine_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of ``MACHINE_FLAGS``, handed over as ``time_options`` (``RuntimeOptions`` or None)."""
    return _with_flags(func, MACHINE_FLAGS, "time_options", machine_options_from)
