"""An emulation of PyTorch's CUDA caching allocator, replayed over the simulated allocation stream.

EMULATION, not yet confirmed by GPU measurements. Rules of c10/cuda/CUDACachingAllocator.cpp in its
default configuration (no ``PYTORCH_CUDA_ALLOC_CONF``, one stream):
- requests are rounded up to 512 B (``kMinBlockSize``);
- requests <= 1 MiB (``kSmallSize``) come from the small pool, whose segments are 2 MiB (``kSmallBuffer``);
  larger ones from the large pool: a 20 MiB segment (``kLargeBuffer``) below 10 MiB (``kMinLargeAlloc``),
  else the request rounded up to 2 MiB (``kRoundLarge``);
- best fit among the pool's free blocks (smallest that fits, then lowest address); a block is split when
  the remainder is >= 512 B (small pool) or > 1 MiB (large pool), otherwise the whole block is handed out
  and counted as allocated;
- a freed block merges with free neighbours of its segment; segments are returned to CUDA only when a
  new segment would exceed ``capacity`` (``release_cached_blocks``: whole free segments, then retry).
Not modelled: ``expandable_segments:True`` (reserved ~ allocated rounded to 2 MiB pages), several
streams, ``garbage_collection_threshold``, ``max_split_size_mb``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20


@dataclass
class _Seg:
    sid: int
    address: int
    size: int
    small: bool
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


@dataclass
class TraceEntry:
    action: str  # alloc | free_requested | free_completed | segment_alloc | segment_free
    addr: int
    size: int
    bid: int


class CachingAllocatorSim:
    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.segments: dict[int, _Seg] = {}
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # (size, addr, sid)
        self._where: dict[int, tuple[int, int]] = {}  # bid -> (sid, offset)
        self._next_addr = 0x7F0000000000
        self._next_sid = 0
        self.allocated = 0
        self.reserved = 0
        self.requested = 0
        self.stats = AllocatorStats()
        self.trace: list[TraceEntry] = []

    @staticmethod
    def _segment_size(size: int) -> int:
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    def _new_segment(self, size: int, small: bool) -> _Seg | None:
        seg_size = self._segment_size(size)
        if self.capacity is not None and self.reserved + seg_size > self.capacity:
            self._release_cached()
            if self.reserved + seg_size > self.capacity:
                self.stats.oom = True
        seg = _Seg(self._next_sid, self._next_addr, seg_size, small, [[0, seg_size, -1]])
        self._next_sid += 1
        self._next_addr += seg_size + ROUND_LARGE
        self.segments[seg.sid] = seg
        self.reserved += seg_size
        self.stats.cuda_mallocs += 1
        self.trace.append(TraceEntry("segment_alloc", seg.address, seg_size, -1))
        bisect.insort(self._free[small], (seg_size, seg.address, seg.sid))
        return seg

    def _release_cached(self) -> None:
        for sid in [s.sid for s in self.segments.values() if len(s.blocks) == 1 and s.blocks[0][2] < 0]:
            seg = self.segments.pop(sid)
            self._free[seg.small].remove((seg.size, seg.address, sid))
            self.reserved -= seg.size
            self.stats.cuda_frees += 1
            self.trace.append(TraceEntry("segment_free", seg.address, seg.size, -1))

    def malloc(self, bid: int, size: int, requested: int) -> None:
        size = max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i == len(pool):
            self._new_segment(size, small)
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
        self.trace.append(TraceEntry("alloc", addr, got, bid))
        if self.allocated > self.stats.max_allocated:
            self.stats.max_allocated = self.allocated
        if self.reserved > self.stats.max_reserved:
            self.stats.max_reserved = self.reserved
            self.stats.segments_at_peak = len(self.segments)
        self.stats.max_requested = max(self.stats.max_requested, self.requested)

    def free(self, bid: int, requested: int) -> None:
        where = self._where.pop(bid, None)
        if where is None:
            return
        sid, off = where
        seg = self.segments[sid]
        k = next(j for j, b in enumerate(seg.blocks) if b[0] == off)
        size = seg.blocks[k][1]
        self.allocated -= size
        self.requested -= requested
        self.trace.append(TraceEntry("free_requested", seg.address + off, size, bid))
        self.trace.append(TraceEntry("free_completed", seg.address + off, size, bid))
        pool = self._free[seg.small]
        seg.blocks[k][2] = -1
        # merge with the free neighbours
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


def replay(events: list, capacity: int | None = None) -> CachingAllocatorSim:
    """Feed the tracker's events (host-side blocks excluded) through the emulated allocator."""
    sim = CachingAllocatorSim(capacity)
    for ev in events:
        b = ev.block
        if b.category == "host":
            continue
        if ev.alloc:
            sim.malloc(b.bid, b.size, b.requested)
        else:
            sim.free(b.bid, b.requested)
    return sim
