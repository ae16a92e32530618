"""An emulation of PyTorch's CUDA caching allocator, replayed over the simulated allocation stream.

EMULATION, not yet confirmed by GPU measurements. Rules of c10/cuda/CUDACachingAllocator.cpp in its
default configuration (no ``PYTORCH_CUDA_ALLOC_CONF``):
- requests are rounded up to 512 B (``kMinBlockSize``);
- requests <= 1 MiB (``kSmallSize``) come from the small pool, whose segments are 2 MiB (``kSmallBuffer``);
  larger ones from the large pool: a 20 MiB segment (``kLargeBuffer``) below 10 MiB (``kMinLargeAlloc``),
  else the request rounded up to 2 MiB (``kRoundLarge``);
- best fit among the pool's free blocks (smallest that fits, then lowest address); a block is split when
  the remainder is >= 512 B (small pool) or > 1 MiB (large pool), otherwise the whole block is handed out
  and counted as allocated;
- a freed block merges with free neighbours of its segment; segments are returned to CUDA only when a
  new segment would exceed ``capacity`` (``release_cached_blocks``: pending frees completed, whole free
  segments released, then retry).

Streams (same source):
- every block, and the segment it was carved from, belongs to the stream that was current when the
  segment was allocated; the free pools are ordered by (stream, size, address) (``BlockComparatorSize``)
  and ``get_free_block`` only hands out a block of the requesting stream: a block cached by one stream is
  never reused by another;
- ``record_stream(s)`` on a block of another stream adds ``s`` to its ``stream_uses``; when such a block is
  freed, ``allocated`` drops at once but the block stays out of the pool (``insert_events``: one event per
  use stream, recorded at the free) until those events complete (``process_events``, run at the start of
  every ``malloc``);
- when an event completes is the GPU's business. ``complete="sync"`` (the default) is a GPU-bound run, where
  the CPU runs ahead of the GPU until it blocks: a pending block returns once the CPU has waited for work
  queued after its free (an ``Event.synchronize`` on an event recorded after it, e.g. FSDP1's all-gather
  rate limiter; a ``Stream.synchronize``; a device value read on the host), on the assumption that the
  communication streams keep pace with the compute stream (the overlap FSDP is built for: a reduce-scatter
  queued before that point has finished when the compute queued before it has). ``complete="eager"``
  returns it at the next ``malloc`` (a GPU that keeps up with the CPU): the low end.
Not modelled: ``expandable_segments:True`` (reserved ~ allocated rounded to 2 MiB pages),
``garbage_collection_threshold``, ``max_split_size_mb``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20
DEFAULT_STREAM = "default"


@dataclass
class _Seg:
    sid: int
    address: int
    size: int
    small: bool
    stream: str = DEFAULT_STREAM
    blocks: list[list[int]] = field(default_factory=list)  # [offset, size, owner bid or -1]


@dataclass
class AllocatorStats:
    max_allocated: int = 0
    max_reserved: int = 0
    max_requested: int = 0
    segments_at_peak: int = 0
    cuda_mallocs: int = 0
    cuda_frees: int = 0
    oom: bool = False
    reserved_by_stream_at_peak: dict[str, int] = field(default_factory=dict)
    pending_at_peak: int = 0  # bytes freed but held for another stream's use when reserved peaked
    deferred_frees: int = 0  # frees that waited for another stream (record_stream)


@dataclass
class TraceEntry:
    action: str  # alloc | free_requested | free_completed | segment_alloc | segment_free
    addr: int
    size: int
    bid: int
    stream: str = DEFAULT_STREAM


class StreamClock:
    """What the CPU knows to be complete: ``done`` = the event index through which the GPU's work has finished
    (every stream alike: the communication streams keep pace with the compute stream)."""

    def __init__(self) -> None:
        self.done = -1

    def sync(self, at: int) -> None:
        self.done = max(self.done, at)

    def complete(self, at: int) -> bool:
        return self.done >= at


class CachingAllocatorSim:
    def __init__(self, capacity: int | None = None, complete: str = "sync") -> None:
        self.capacity = capacity
        self.complete_mode = complete
        self.segments: dict[int, _Seg] = {}
        # (stream, small pool) -> free blocks as (size, addr, sid)
        self._free: dict[tuple[str, bool], list[tuple[int, int, int]]] = {}
        self._where: dict[int, tuple[int, int]] = {}  # bid -> (sid, offset)
        # (bid, its use streams, the event index at its free)
        self._pending: list[tuple[int, frozenset[str], int]] = []
        self.clock = StreamClock()
        self._next_addr = 0x7F0000000000
        self._next_sid = 0
        self.allocated = 0
        self.reserved = 0
        self.requested = 0
        self.pending_bytes = 0
        self.stats = AllocatorStats()
        self.trace: list[TraceEntry] = []

    def _pool(self, stream: str, small: bool) -> list[tuple[int, int, int]]:
        return self._free.setdefault((stream, small), [])

    @staticmethod
    def _segment_size(size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    def _new_segment(self, size: int, small: bool, stream: str) -> _Seg | None:
        seg_size = self._segment_size(size)
        if self.capacity is not None and self.reserved + seg_size > self.capacity:
            self._release_cached()
            if self.reserved + seg_size > self.capacity:
                self.stats.oom = True
        seg = _Seg(self._next_sid, self._next_addr, seg_size, small, stream, [[0, seg_size, -1]])
        self._next_sid += 1
        self._next_addr += seg_size + ROUND_LARGE
        self.segments[seg.sid] = seg
        self.reserved += seg_size
        self.stats.cuda_mallocs += 1
        self.trace.append(TraceEntry("segment_alloc", seg.address, seg_size, -1, stream))
        bisect.insort(self._pool(stream, small), (seg_size, seg.address, seg.sid))
        return seg

    def _release_cached(self) -> None:
        """``release_cached_blocks``: complete every pending free (``synchronize_and_free_events``), then hand
        every wholly free segment back to CUDA."""
        for bid, _, _ in self._pending:
            self._return_block(bid)
        self._pending.clear()
        for sid in [s.sid for s in self.segments.values() if len(s.blocks) == 1 and s.blocks[0][2] < 0]:
            seg = self.segments.pop(sid)
            self._pool(seg.stream, seg.small).remove((seg.size, seg.address, sid))
            self.reserved -= seg.size
            self.stats.cuda_frees += 1
            self.trace.append(TraceEntry("segment_free", seg.address, seg.size, -1, seg.stream))

    def process_events(self) -> None:
        """Return the pending blocks whose use streams are done (all of them with ``complete="eager"``)."""
        if not self._pending:
            return
        keep = []
        for bid, uses, at in self._pending:
            if self.complete_mode == "eager" or self.clock.complete(at):
                self._return_block(bid)
            else:
                keep.append((bid, uses, at))
        self._pending = keep

    def malloc(self, bid: int, size: int, requested: int, stream: str = DEFAULT_STREAM) -> None:
        self.process_events()
        size = max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self._pool(stream, small)
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i == len(pool):
            self._new_segment(size, small, stream)
            i = bisect.bisect_left(pool, (size, -1, -1))
        bsize, addr, sid = pool.pop(i)
        seg = self.segments[sid]
        off = addr - seg.address
        k = next(j for j, b in enumerate(seg.blocks) if b[0] == off)
        remaining = bsize - size
        split = remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE
        if split:
            seg.blocks[k] = [off, size, bid]
            seg.blocks.insert(k + 1, [off + size, remaining, -1])
            bisect.insort(pool, (remaining, addr + size, sid))
        else:
            seg.blocks[k] = [off, bsize, bid]
        got = seg.blocks[k][1]
        self._where[bid] = (sid, off)
        self.allocated += got
        self.requested += requested
        self.trace.append(TraceEntry("alloc", addr, got, bid, stream))
        if self.allocated > self.stats.max_allocated:
            self.stats.max_allocated = self.allocated
        if self.reserved > self.stats.max_reserved:
            self.stats.max_reserved = self.reserved
            self.stats.segments_at_peak = len(self.segments)
            self.stats.pending_at_peak = self.pending_bytes
            by: dict[str, int] = {}
            for s in self.segments.values():
                by[s.stream] = by.get(s.stream, 0) + s.size
            self.stats.reserved_by_stream_at_peak = by
        self.stats.max_requested = max(self.stats.max_requested, self.requested)

    def free(self, bid: int, requested: int, uses: frozenset[str] = frozenset(), at: int = 0) -> None:
        """``free``: ``allocated`` drops now; a block with uses on other streams waits for their events."""
        where = self._where.get(bid)
        if where is None:
            return
        sid, off = where
        seg = self.segments[sid]
        k = next(j for j, b in enumerate(seg.blocks) if b[0] == off)
        size = seg.blocks[k][1]
        self.allocated -= size
        self.requested -= requested
        self.trace.append(TraceEntry("free_requested", seg.address + off, size, bid, seg.stream))
        uses = frozenset(u for u in uses if u != seg.stream)  # recordStream: no-op on the block's own stream
        if uses:
            self._pending.append((bid, uses, at))
            self.pending_bytes += size
            self.stats.deferred_frees += 1
            return
        self._return_block(bid, pending=False)

    def _return_block(self, bid: int, pending: bool = True) -> None:
        """``free_block``: back into its stream's pool, merged with free neighbours of its segment."""
        sid, off = self._where.pop(bid)
        seg = self.segments[sid]
        k = next(j for j, b in enumerate(seg.blocks) if b[0] == off)
        size = seg.blocks[k][1]
        if pending:
            self.pending_bytes -= size
        self.trace.append(TraceEntry("free_completed", seg.address + off, size, bid, seg.stream))
        pool = self._pool(seg.stream, seg.small)
        seg.blocks[k][2] = -1
        if k + 1 < len(seg.blocks) and seg.blocks[k + 1][2] < 0:
            nxt = seg.blocks.pop(k + 1)
            pool.remove((nxt[1], seg.address + nxt[0], sid))
            seg.blocks[k][1] += nxt[1]
        if k > 0 and seg.blocks[k - 1][2] < 0:
            prv = seg.blocks[k - 1]
            pool.remove((prv[1], seg.address + prv[0], sid))
            prv[1] += seg.blocks[k][1]
            seg.blocks.pop(k)
            k -= 1
        b = seg.blocks[k]
        bisect.insort(pool, (b[1], seg.address + b[0], sid))


def replay(events: list, capacity: int | None = None, stream_ops: list | None = None, streams: bool = True,
           complete: str = "sync") -> CachingAllocatorSim:
    """Feed the tracker's events (host-side blocks excluded) through the emulated allocator.

    ``stream_ops`` (the tracker's log, in event order: ``(at, "sync", stream, upto)`` the CPU waited at event
    ``at`` for ``stream``'s work through event ``upto``); ``streams=False`` replays
    every block on one stream with no pending frees (the one-stream emulation, for the cross-stream part of
    the gap)."""
    sim = CachingAllocatorSim(capacity, complete=complete)
    ops = sorted(stream_ops or (), key=lambda o: o[0]) if streams else []
    j = 0
    for ev in events:
        while j < len(ops) and ops[j][0] <= ev.index:
            _apply(sim.clock, ops[j])
            j += 1
        b = ev.block
        if b.category == "host":
            continue
        stream = getattr(b, "stream", DEFAULT_STREAM) if streams else DEFAULT_STREAM
        if ev.alloc:
            sim.malloc(b.bid, b.size, b.requested, stream)
        else:
            uses = frozenset(getattr(b, "uses", ())) if streams else frozenset()
            sim.free(b.bid, b.requested, uses, ev.index)
    return sim


def _apply(clock: StreamClock, op: tuple[Any, ...]) -> None:
    if op[1] == "sync":
        clock.sync(op[3])
