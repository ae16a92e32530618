"""The limits of a setup on a card: largest micro-batch, longest sequence, largest LoRA rank.

Each limit moves one field and keeps every other field of the setup; the verdict is
``Estimate.fits``. Memory never falls when batch, sequence or rank grow (the activation, logit and
adapter terms are non-decreasing in each), so the boundary is found by :func:`largest_true` exactly:
the returned value fits and the next one does not, or the search stopped at a cap. One exception:
bitsandbytes' 8-bit AdamW keeps fp32 states for an adapter under 4,096 elements, so at small ranks a
larger rank can need up to 24 KiB less per adapter matrix; the rank found there fits, but may not be
the largest.

Caps (a limit that reaches its cap is reported with ``limited_by: "cap"``, not "memory"):
- micro-batch: 4096 sequences per GPU; beyond that the question is throughput, not memory;
- sequence: the model's ``max_position_embeddings`` (or the user's own longer ``seq``, for a
  context extended by RoPE scaling), 131072 when the config does not say;
- LoRA rank: the hidden size; a rank above a module's smaller side adds parameters and no
  expressiveness (the update of a d_out x d_in matrix has rank at most min(d_in, d_out)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneplan.plan.evaluate import Prober
from tuneplan.plan.search import largest_true
from tuneplan.specs.setup import TrainSetup

BATCH_CAP = 4096
SEQ_CAP_DEFAULT = 131072


def seq_cap(probe: Prober, setup: TrainSetup) -> int:
    return max(probe.model.max_position or SEQ_CAP_DEFAULT, setup.seq)


def rank_cap(probe: Prober, setup: TrainSetup) -> int:
    return max(probe.model.hidden, setup.rank)


@dataclass
class Limits:
    max_batch: int | None = None
    max_seq: int | None = None
    max_rank: int | None = None
    limited_by: dict[str, str] = field(default_factory=dict)  # "memory" | "cap"
    caps: dict[str, int] = field(default_factory=dict)


def _limit(probe: Prober, fields: Mapping[str, Any], name: str, start: int,
           cap: int) -> tuple[int | None, str]:
    if probe.fits({**fields, name: cap}):  # monotone: the cap fits, so does everything below it
        return cap, "cap"
    # the batch cap is not probed up front (few setups come near it): the search asks it when it gets there
    known = {start: True} if name == "batch" else {start: True, cap: False}
    best = largest_true(lambda x: probe.fits({**fields, name: x}), 1, cap, start=start, known=known)
    return best, "cap" if best == cap else "memory"


def limits_at(probe: Prober, fields: Mapping[str, Any], setup: TrainSetup, *,
              which: tuple[str, ...] = ("batch", "seq", "rank")) -> Limits:
    """Limits around a setup that fits (``setup`` is its resolved form, ``fields`` what produced it)."""
    out = Limits()
    if "batch" in which:
        out.caps["batch"] = BATCH_CAP
        out.max_batch, out.limited_by["batch"] = _limit(probe, fields, "batch", setup.batch,
                                                        max(BATCH_CAP, setup.batch))
    if "seq" in which:
        cap = out.caps["seq"] = seq_cap(probe, setup)
        out.max_seq, out.limited_by["seq"] = _limit(probe, fields, "seq", setup.seq, cap)
    if "rank" in which and setup.is_lora:
        cap = out.caps["rank"] = rank_cap(probe, setup)
        out.max_rank, out.limited_by["rank"] = _limit(probe, fields, "rank", setup.rank, cap)
    return out
