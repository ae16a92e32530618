"""tuneplan: plan an LLM fine-tune before spending a GPU-hour.

The public API mirrors the CLI; heavy optional engines (simulate, measure, web) import lazily.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["estimate", "estimate_grid", "Estimate", "Grid", "TrainSetup", "ModelSpec", "resolve_model",
           "resolve_accelerator", "TuneplanError", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: `import tuneplan` stays fast
    if name in ("estimate", "Estimate", "build_setup"):
        from tuneplan import api

        return getattr(api, name)
    if name in ("estimate_grid", "Grid"):  # numpy: imported only here
        from tuneplan import grid

        return getattr(grid, name)
    if name == "TrainSetup":
        from tuneplan.specs.setup import TrainSetup

        return TrainSetup
    if name == "ModelSpec":
        from tuneplan.specs.model import ModelSpec

        return ModelSpec
    if name == "resolve_model":
        from tuneplan.catalog.models import resolve_model

        return resolve_model
    if name == "resolve_accelerator":
        from tuneplan.catalog.accelerators import resolve_accelerator

        return resolve_accelerator
    if name == "TuneplanError":
        from tuneplan.errors import TuneplanError

        return TuneplanError
    if name in ("fit", "rank_gpus", "max_model", "sweep"):  # the planner (search over estimates)
        from tuneplan import plan

        return getattr(plan, name)
    raise AttributeError(name)
