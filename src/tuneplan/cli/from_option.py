"""``--from FILE``: plan from the training configs the user already has, in any command.

A command adds ``from_files: FromFiles = None`` to its signature and one call::

    frm = resolve_from(from_files, model, setup_kw)      # model may be None when a file names it
    est = estimate(frm.model, setup=frm.base, gpu=gpu, **frm.setup_kw)
    d = frm.annotate(est.to_dict())                       # adds "from": files, warnings, deepspeed
    frm.render(d)                                         # resolved setup with origins + warnings

Flags override the files; each field's origin ends up in ``TrainSetup.sources``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from tuneplan.cli.flags import Flag, typer_option
from tuneplan.errors import TuneplanError
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:  # the readers and rich load only when --from files are given / a table is printed
    from tuneplan.ingest import Resolved

FROM_FLAG = Flag(
    "from_files",
    str,
    ("--from",),
    "training config to plan from (LLaMA-Factory/axolotl/accelerate YAML, "
    "TrainingArguments/PEFT/bitsandbytes/DeepSpeed JSON); repeatable; flags override",
    repeat=True,
    panel="Setup",
)


def __getattr__(name: str) -> Any:  # ``FromFiles``, the typer annotation, built (with typer) on first use
    if name == "FromFiles":
        return Annotated[FROM_FLAG.annotation(), typer_option(FROM_FLAG)]
    raise AttributeError(name)


@dataclass
class FromResult:
    model: str
    setup_kw: dict[str, Any]
    base: TrainSetup | None
    resolved: Resolved | None

    def annotate(self, d: dict[str, Any]) -> dict[str, Any]:
        if self.resolved is not None:
            r = self.resolved
            d["from"] = {
                "files": [{"path": i.path, "kind": i.kind} for i in r.files],
                "model_source": r.model_source,
                "warnings": self.warnings(),
                "deepspeed": r.deepspeed,
                "run": r.run,
            }
        return d

    def warnings(self) -> list[str]:
        """The readers' warnings, the fields they name worded as flags (tuneplan.errors)."""
        from tuneplan.cli.render import flag_words
        from tuneplan.errors import word

        return [word(w, flag_words) for w in (self.resolved.warnings if self.resolved else [])]

    def time_kw(self, time_kw: dict[str, Any] | None) -> dict[str, Any]:
        """The time/cost keywords: the flags' dataset when given, else the run length the files state."""
        out = dict(time_kw or {})
        if self.resolved is None or "dataset" in out:
            return out
        hint = self.resolved.dataset_fields()
        if hint is not None:
            from tuneplan.specs.dataset import DatasetSpec

            fields_, why = hint
            out["dataset"] = DatasetSpec(**fields_).validate()
            self.resolved.warnings.append(
                f"dataset size for the time estimate from the files: {why}; "
                "give {samples} / {dataset_tokens} to override"
            )
        return out

    def render(self, d: dict[str, Any]) -> None:
        if self.resolved is None:
            return
        from tuneplan.cli.render import console

        files = self.resolved.files
        for i in files:
            console.print(f"[dim]read {i.label}: {i.path}[/]")
        short = {i.path: Path(i.path).name for i in files}

        def shorten(src: str) -> str:
            for i in files:  # "llamafactory yaml dir/x.yaml:7" -> "x.yaml:7"
                if src.startswith(f"{i.label} {i.path}"):
                    return short[i.path] + src[len(i.label) + 1 + len(i.path) :]
            return src

        from rich.table import Table

        t = Table(title="Resolved setup (flags > files > profile defaults)")
        t.add_column("field")
        t.add_column("value")
        t.add_column("from", overflow="fold")
        t.add_row(
            "model",
            str(d.get("model", {}).get("name", self.model)),
            shorten(self.resolved.model_source or ""),
        )
        sources = d.get("setup_sources", {})
        setup = d.get("setup", {})
        method = setup.get("method")
        from tuneplan.specs.fields import BY_NAME

        for f in fields(TrainSetup):
            # rows that mean nothing for this method (the field table's methods) are left out
            if f.name not in BY_NAME or f.name not in setup or not BY_NAME[f.name].applies_to(method):
                continue
            value = d["setup"][f.name]
            src = shorten(sources.get(f.name, "tuneplan default"))
            style = "" if src.startswith(("flag", "tuneplan default")) or "profile default" in src else "cyan"
            t.add_row(f.name, str(value), f"[{style}]{src}[/]" if style else src)
        console.print(t)
        for w in self.warnings():
            console.print(f"[yellow]warning:[/] {w}")


def resolve_from(files: list[str] | None, model: str | None, setup_kw: dict[str, Any] | None) -> FromResult:
    """Files + flags -> the model and setup fields; exit 2 (TuneplanError) when no model is named."""
    if not files:
        if not model:
            raise TuneplanError(
                "no model given",
                field="model",
                accepted="a catalog name, HF id or config.json path, or --from a config that "
                "names one (model_name_or_path / base_model)",
            )
        return FromResult(model, dict(setup_kw or {}), None, None)
    from tuneplan.ingest import read_configs

    r = read_configs(list(files), setup_kw, model)
    if not r.model:
        raise TuneplanError(
            f"none of {', '.join(files)} names a model",
            field="model",
            accepted="give MODEL (catalog name, HF id or config.json path)",
        )
    return FromResult(r.model, dict(r.setup_kw), r.base_setup(), r)
