"""Recipes from a plan: a runnable HF training script, a LLaMA-Factory YAML, a DeepSpeed JSON, an
accelerate YAML. A face estimates the plan once and hands the ``Estimate`` over: the writers are pure
functions of it (the config builders of its model, setup and card) returning text, the header quoting its
figures; :func:`build_export` adds the companion files a format needs (the DeepSpeed JSON a ZeRO plan
points at, the accelerate YAML an FSDP LLaMA-Factory run is launched with). The faces write them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuneplan.errors import TuneplanError
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.api import Estimate

FORMATS = ("hf-script", "llamafactory", "deepspeed", "accelerate", "fsdp-qlora")
DEFAULT_NAMES = {"hf-script": "train.py", "llamafactory": "train_lora.yaml", "deepspeed": "ds_config.json",
                 "accelerate": "accelerate_config.yaml", "fsdp-qlora": "run_fsdp_qlora.sh"}
# whose code runs the recipe
FRAMEWORK_OF = {"hf-script": "hf", "llamafactory": "llamafactory", "fsdp-qlora": "fsdp-qlora"}


@dataclass
class ExportBundle:
    files: list[tuple[Path, str]]  # (path, text), the main file first
    setup: TrainSetup  # the resolved setup the files encode
    notes: list[str] = field(default_factory=list)


def build_export(fmt: str, est: Estimate, path: str | Path, *, dataset: str | None = None) -> ExportBundle:
    """Texts of the files ``fmt`` needs for the plan ``est`` estimated (``tuneplan.api.estimate`` of the
    model, setup and card), the main one at ``path`` and companions beside it. The recipe quotes that
    estimate; only a recipe that runs another framework's code than the plan's profile is estimated again,
    with that framework's profile."""
    from tuneplan.export.accelerate_yaml import render_accelerate
    from tuneplan.export.common import refuse_if_cannot_run
    from tuneplan.export.deepspeed_json import render_deepspeed
    from tuneplan.export.hf_script import render_hf_script
    from tuneplan.export.llamafactory_yaml import render_llamafactory

    if fmt not in FORMATS:
        raise TuneplanError(f"unknown format {fmt!r}", field="format", accepted=FORMATS)
    notes: list[str] = []
    runner = FRAMEWORK_OF.get(fmt)
    if runner and est.setup.framework != runner:
        from tuneplan.api import estimate

        notes.append(f"the plan used the {est.setup.framework} profile; this recipe runs {runner}'s code, "
                     f"so it is estimated with the {runner} profile (settings kept)")
        est = estimate(est.model, est.setup.replace(framework=runner), gpu=est.gpu, timing=False)
    model, s, acc = est.model, est.setup, est.gpu
    if s.device_map != "none" and fmt == "deepspeed":
        raise TuneplanError("DeepSpeed runs one process per card; a device_map plan splits one process's "
                            "layers over the cards and has no DeepSpeed config", field="device_map",
                            accepted="the hf-script or accelerate format for {device_map}, "
                                     "or {device_map=none}")
    refuse_if_cannot_run(est)
    if acc is not None and est.fits is False:
        # Written anyway (the user may mean another card), but never silently.
        notes.append(f"this plan does NOT fit on {acc.name}: estimated "
                     f"{est.breakdown.device_peak_bytes / 2**30:.2f} GiB per GPU against "
                     f"{acc.memory_bytes / 2**30:.2f} GiB; the planner (fit) finds one that does")
    main = Path(path)
    ds_path = main.with_name(f"ds_z{s.zero}_config.json") if s.zero else None
    files: list[tuple[Path, str]] = []
    if fmt == "hf-script":
        files.append((main, render_hf_script(est, deepspeed_file=ds_path.name if ds_path else None,
                                             dataset=dataset or "data.jsonl")))
    elif fmt == "llamafactory":
        acc_path = main.with_name(main.stem + "_accelerate.yaml") if s.fsdp else None
        files.append((main, render_llamafactory(est, deepspeed_file=ds_path.name if ds_path else None,
                                                accelerate_file=acc_path.name if acc_path else None,
                                                dataset=dataset or "alpaca_en_demo")))
        if acc_path:
            files.append((acc_path, render_accelerate(est)))
    elif fmt == "deepspeed":
        files.append((main, render_deepspeed(model, s, acc)))
        ds_path = None
    elif fmt == "fsdp-qlora":
        from tuneplan.export.fsdp_qlora import render_fsdp_qlora

        files.append((main, render_fsdp_qlora(est, dataset=dataset)))
    else:  # accelerate
        files.append((main, render_accelerate(est, deepspeed_file=ds_path.name if ds_path else "")))
    if ds_path is not None:
        files.append((ds_path, render_deepspeed(model, s, acc)))
    return ExportBundle(files=files, setup=s, notes=notes)


__all__ = ["DEFAULT_NAMES", "FORMATS", "ExportBundle", "build_export"]
