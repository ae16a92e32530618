"""DatasetSpec: how much text a fine-tune reads. Typed, validated, no rates.

Two ways to say it: ``samples`` x ``avg_tokens`` (tokens of one sample after the chat template), or a
``dataset_tokens`` count for one epoch. ``epochs`` may be fractional. ``packing`` decides what the GPU
computes: packed, samples are concatenated into rows of ``seq`` tokens (little padding); unpacked, every
sample is one row padded (or truncated) to ``seq`` tokens, as with ``padding="max_length"``. Padding to
the longest sample of each batch (the transformers default collator) lies between the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuneplan.errors import TuneplanError
from tuneplan.specs.limits import MAX_DATASET_TOKENS, MAX_EPOCHS, SETUP_INT_RANGES, check_int, check_number


@dataclass(frozen=True)
class DatasetSpec:
    samples: int | None = None
    avg_tokens: float | None = None
    epochs: float = 1.0
    dataset_tokens: int | None = None  # tokens of one epoch; wins over samples x avg_tokens
    packing: bool = False

    def validate(self) -> DatasetSpec:
        """Types, finiteness and ranges (bounds in :mod:`tuneplan.specs.limits`), then what must be given."""
        if self.samples is not None:
            check_int("samples", self.samples, 1, MAX_DATASET_TOKENS, "samples of one epoch")
        if self.avg_tokens is not None:
            check_number("avg_tokens", self.avg_tokens, 0.0, float(SETUP_INT_RANGES["seq"][1]), low_open=True,
                         accepted="tokens per sample after the template, e.g. 350 (> 0, at most 4194304)")
        check_number("epochs", self.epochs, 0.0, MAX_EPOCHS, low_open=True,
                     accepted=f"e.g. 1, 3, 0.5 (> 0, at most {MAX_EPOCHS:g})")
        if self.dataset_tokens is not None:
            check_int("dataset_tokens", self.dataset_tokens, 1, MAX_DATASET_TOKENS, "tokens in one epoch")
        if not isinstance(self.packing, bool):
            raise TuneplanError(f"got {self.packing!r}", field="packing", accepted="true, false")
        if self.samples is None and self.dataset_tokens is None:
            raise TuneplanError("say how much data: {samples} (with {avg_tokens}) or {dataset_tokens}",
                                field="samples",
                                accepted="{samples=N} [{avg_tokens=T}] or {dataset_tokens=N}")
        if not self.packing and self.samples is None and self.avg_tokens is None:
            raise TuneplanError("without packing every sample is padded to {seq}, so the sample count is "
                                "needed: give {samples}, or {avg_tokens} to derive it from {dataset_tokens}, "
                                "or {packing}",
                                field="samples", accepted="{samples=N}, {avg_tokens=T}, or {packing}")
        return self

    def sample_count(self) -> float | None:
        if self.samples is not None:
            return float(self.samples)
        if self.dataset_tokens is not None and self.avg_tokens:
            return self.dataset_tokens / self.avg_tokens
        return None

    def plan(self, seq: int) -> DatasetPlan:
        """Rows of ``seq`` tokens the GPUs compute per epoch, and the real (trained) tokens among them."""
        self.validate()
        n = self.sample_count()
        per_sample = min(self.avg_tokens, seq) if self.avg_tokens else float(seq)
        if self.dataset_tokens is not None:
            real = float(self.dataset_tokens)
            if n is not None and self.avg_tokens and self.avg_tokens > seq:
                real = n * seq  # samples longer than --seq are truncated
        else:
            real = (n or 0.0) * per_sample
        notes: list[str] = []
        if self.avg_tokens is None and self.dataset_tokens is None:
            notes.append(f"no {{avg_tokens}}: every sample assumed to fill {{seq}} ({seq} tokens)")
        if self.avg_tokens and self.avg_tokens > seq:
            notes.append(f"samples average {self.avg_tokens:g} tokens > {{seq={seq}}}: truncated to {seq}")
        if self.packing:
            rows = math.ceil(real / seq)
            notes.append(f"packing: {real:,.0f} tokens per epoch in rows of {seq}")
        else:
            rows = math.ceil(n or 0)
            if self.avg_tokens and self.avg_tokens < seq:
                notes.append(f"no packing: each sample padded to {{seq={seq}}}, "
                             f"{self.avg_tokens / seq:.0%} of the computed tokens are real "
                             "(padding to the longest of each batch costs less)")
        return DatasetPlan(rows_per_epoch=rows, real_tokens_per_epoch=real, epochs=float(self.epochs),
                           seq=seq, notes=tuple(notes))


@dataclass(frozen=True)
class DatasetPlan:
    rows_per_epoch: int  # sequences of ``seq`` tokens computed per epoch
    real_tokens_per_epoch: float
    epochs: float
    seq: int
    notes: tuple[str, ...] = ()

    @property
    def computed_tokens(self) -> float:
        return self.rows_per_epoch * self.seq * self.epochs

    @property
    def real_tokens(self) -> float:
        return self.real_tokens_per_epoch * self.epochs
