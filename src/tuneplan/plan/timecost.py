"""The planner's side of the time/cost contract, in one place.

The time and cost model lives in the estimator; ``tuneplan.api.estimate(..., dataset=DatasetSpec(...))``
puts ``to_dict()["time"]["total_hours"]``, ``["time"]["tokens_per_second"]`` and
``["cost"]["cloud_usd"]`` in its result; without a dataset size those figures are None and the faces
show "-".
"""

from __future__ import annotations

from typing import Any

from tuneplan.errors import TuneplanError


def make_dataset(**fields: Any) -> Any | None:
    """A DatasetSpec from the fields given (None values dropped), or None when none was given."""
    from tuneplan.specs.dataset import DatasetSpec

    kw = {k: v for k, v in fields.items() if v is not None}
    if not kw:
        return None
    try:
        ds = DatasetSpec(**kw)
    except TypeError as exc:
        raise TuneplanError(f"bad dataset fields: {exc}", field="dataset") from None
    validate = getattr(ds, "validate", None)
    return validate() or ds if callable(validate) else ds


def dataset_kw(dataset: Any | None) -> dict[str, Any]:
    """Keyword arguments that pass ``dataset`` to ``estimate`` only when there is one to pass."""
    return {"dataset": dataset} if dataset is not None else {}


def time_cost(d: dict[str, Any]) -> dict[str, Any]:
    """The contract's three figures out of ``Estimate.to_dict()`` (None when absent)."""
    t, c = d.get("time") or {}, d.get("cost") or {}
    return {"total_hours": t.get("total_hours"), "tokens_per_second": t.get("tokens_per_second"),
            "cloud_usd": c.get("cloud_usd")}
