"""A ``torch.cuda.memory._snapshot()``-compatible pickle of the emulated allocator.

Layout as PyTorch writes it (torch/cuda/memory.py ``_snapshot``, read by torch/cuda/_memory_viz.py and
https://pytorch.org/memory_viz): ``segments`` (each with its blocks, in address order, at the end of the
run) and ``device_traces`` (one list per device of alloc / free_requested / free_completed /
segment_alloc / segment_free events). Each event's stack frame names the module and the op that made the
storage, so the visualizer groups them. Addresses and the caching are the emulation's, not a GPU's.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from tuneplan.simulate.allocator import CachingAllocatorSim


def snapshot_dict(sim: CachingAllocatorSim, blocks: list[Any]) -> dict[str, Any]:
    def frames(bid: int) -> list[dict[str, Any]]:
        if bid < 0:
            return []
        b = blocks[bid]
        return [{"filename": b.module or "<no module>", "line": 0,
                 "name": f"{b.category}: {b.op.replace('aten.', '')} {list(b.shape)} {b.dtype} [{b.phase}]"}]

    segments = []
    for seg in sorted(sim.segments.values(), key=lambda s: s.address):
        out_blocks = []
        allocated = active = requested = 0
        for off, size, owner in seg.blocks:
            live = owner >= 0
            req = blocks[owner].requested if live else 0
            out_blocks.append({"address": seg.address + off, "size": size, "requested_size": req,
                               "state": "active_allocated" if live else "inactive", "frames": frames(owner)})
            if live:
                allocated += size
                active += size
                requested += req
        segments.append({"device": 0, "address": seg.address, "total_size": seg.size,
                         "allocated_size": allocated,
                         "active_size": active, "requested_size": requested, "stream": 0,
                         "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": [], "blocks": out_blocks})
    trace = [{"action": e.action, "addr": e.addr, "size": e.size, "stream": 0, "time_us": i,
              "frames": frames(e.bid)} for i, e in enumerate(sim.trace)]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {},
            "tuneplan": "simulated on fake tensors; allocator emulated (not measured on a GPU)"}


def write_snapshot(path: str | Path, sim: CachingAllocatorSim, blocks: list[Any]) -> Path:
    from tuneplan.safe_write import write_bytes

    # atomic; the command refused an existing file or a link before the run unless --force
    return write_bytes(path, pickle.dumps(snapshot_dict(sim, blocks)), force=True, field="snapshot")
