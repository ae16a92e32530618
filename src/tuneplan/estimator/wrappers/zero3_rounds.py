"""The ZeRO-3 prefetcher's rounds over a module trace, cut once per trace (zero3_coordinator.prefetch_rounds).

Every ZeRO-3 formula of a setup replays the same traces of its frozen model (the forward trace, the top
layer's linears, a trace with the embedding after it): the cut depends on the trace, the prefetch bucket,
the released elements and ``stage3_max_live_parameters`` alone, never on the batch shape, so it is kept
per those values (a tuple: hashable, and never changed by a caller).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=256)
def cut_rounds(trace: tuple[int, ...], prefetch_bucket: int, released: tuple[int, int],
               max_live: int) -> tuple[tuple[int, ...], ...]:
    """zero3_coordinator.prefetch_rounds with ``max_live`` for ``stage3_max_live_parameters``."""
    rounds: list[tuple[int, ...]] = []
    at = available = 0  # the queue is trace[at:]
    while at < len(trace):
        if len(rounds) == released[0]:
            available -= released[1]
        limit = min(max_live - available, prefetch_bucket)
        if limit <= 0:
            break
        start, popped = at, 0  # popped: sum(trace[start:at]), as the pops take them
        while at < len(trace) and popped < limit:
            popped, at = popped + trace[at], at + 1
        rounds.append(trace[start:at])
        available += popped
    return tuple(rounds)
