"""Behaviours of older PyTorch / framework stacks that only published measurements still show.

Calibration rows were measured on stacks a run planned today does not have: a V100 under torch 1.x, a
lit-gpt loop of 2023. Reproducing them needs three switches that no user sets, so they are not setup
fields (no flag, no widget, nothing in a recipe): the calibration mapper (``benchmarks/calibration_rows.py``)
sets them on a :class:`TorchEraSetup`, and the formulas read them from any setup (a ``TrainSetup`` answers
False for all three).

- ``keep_grads``: ``zero_grad(set_to_none=False)``: the gradient buffers are zeroed in place, not freed,
  so they stay allocated through the next forward even without accumulation. torch < 2.0's default for
  ``Module.zero_grad`` / ``Optimizer.zero_grad`` (pytorch/pytorch#92731 made ``set_to_none=True`` the
  default), which the transformers Trainer of that time called as ``model.zero_grad()`` after every step.
- ``softmax_keeps_input``: softmax and log_softmax keep their *input* for backward beside their output:
  torch < 1.11, whose derivatives.yaml passed ``self`` to ``_softmax_backward_data`` (pytorch/pytorch#64000,
  fixed by #65242 / #66018 in October 2021, first released in torch 1.11 on 2022-03-10).
- ``longest_batch_first``: the longest batch runs first (lit-gpt 2023 forced its longest sample into
  iteration 1): nothing a previous micro-batch left behind (a framework loop's held logits and graph) adds
  to its peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.setup import TrainSetup

SWITCHES = ("keep_grads", "softmax_keeps_input", "longest_batch_first")


@dataclass(frozen=True)
class TorchEraSetup(TrainSetup):
    """A TrainSetup of an older stack (module docstring)."""

    keep_grads: bool = False
    softmax_keeps_input: bool = False
    longest_batch_first: bool = False

    def validate(self) -> TorchEraSetup:
        for name in SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise TuneplanError(f"got {getattr(self, name)!r}", field=name, accepted="true, false")
        if self.softmax_keeps_input and self.attn in ("sdpa", "flash"):
            raise TuneplanError("softmax_keeps_input models torch < 1.11, which has neither SDPA (torch 2.0) "
                                "nor FlashAttention-2 (torch >= 1.12)", field="attn",
                                accepted="eager with {softmax_keeps_input}")
        if self.keep_grads and (self.zero or self.fsdp):
            raise TuneplanError("DeepSpeed ZeRO and FSDP manage their own gradient buffers; keeping zeroed "
                                "gradients is a single-GPU / DDP behaviour", field="keep_grads",
                                accepted="{keep_grads=false} with {zero} / {fsdp}")
        super().validate()
        return self


def with_switches(base: TrainSetup, kwargs: Mapping[str, Any]) -> tuple[TrainSetup, dict[str, Any]]:
    """(the base as a TorchEraSetup carrying the switches among ``kwargs``, the other kwargs); the base and
    kwargs unchanged when none is given."""
    if isinstance(base, TorchEraSetup) or kwargs.keys().isdisjoint(SWITCHES):
        return base, dict(kwargs)
    switches = {k: v for k, v in kwargs.items() if k in SWITCHES}
    rest = {k: v for k, v in kwargs.items() if k not in SWITCHES}
    own = {f.name: getattr(base, f.name) for f in fields(base)}
    return TorchEraSetup(**own, **switches), rest
