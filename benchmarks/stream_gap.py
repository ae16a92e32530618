"""Reserved vs allocated on one CUDA card when blocks move between streams (FSDP1's all-gather pattern),
measured and as the allocator emulation predicts it.

    python benchmarks/stream_gap.py [--layers 8] [--layer-mib 256] [--act-mib 64] [--sleep-ms 20]
                                    [--out FILE] [--emulate-only]

Each "layer", forward then backward (reverse order), as FSDP1 with ``limit_all_gathers`` runs it
(torch/distributed/fsdp/_runtime_utils.py ``_unshard`` / ``_reshard``, _limiter_utils.py):
- the rate limiter: with two free events queued, the CPU waits (``Event.synchronize``) for the oldest;
- an unsharded-parameter buffer allocated on a side stream (FSDP1's unshard stream), which the compute stream
  waits for (``wait_stream``);
- on the compute stream: an activation-sized block kept until the backward of that layer, a temporary twice
  that size, and ``--sleep-ms`` of GPU work (``torch.cuda._sleep``) so that the CPU runs ahead of the GPU as
  in a GPU-bound run;
- the buffer ``record_stream``-ed on the compute stream and freed, a free event recorded and queued.
The caching allocator keeps blocks per stream and holds a recorded block until the events recorded at its
free complete (c10/cuda/CUDACachingAllocator.cpp ``record_stream`` / ``process_events``). Each run appends
one JSON line to --out: the card's ``max_memory_allocated`` / ``max_memory_reserved`` with one stream and with
two (needs a CUDA GPU), and, always, the emulation's figures for the same pattern (tuneplan's
``simulate/allocator.py``: one stream; two streams with pending frees returned once the CPU has waited
past them, the GPU-bound case; and returned at the next allocation, a GPU that keeps up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MIB = 1024**2
INFLIGHT = 2  # FSDP1 _FreeEventQueue._max_num_inflight_all_gathers


def measure(streams: int, layers: int, layer_mib: int, act_mib: int, sleep_ms: int) -> dict:
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream() if streams > 1 else main
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 1_500_000)  # SM clock, kHz
    cycles = int(sleep_ms * khz)
    acts: list = []
    queue: list = []
    for backward in (False, True):
        for _ in range(layers):
            if len(queue) >= INFLIGHT:
                queue.pop(0).synchronize()
            with torch.cuda.stream(side):
                w = torch.empty(layer_mib * MIB, dtype=torch.uint8, device="cuda")
            main.wait_stream(side)
            if backward:
                acts.pop()
            else:
                acts.append(torch.empty(act_mib * MIB, dtype=torch.uint8, device="cuda"))
            tmp = torch.empty(2 * act_mib * MIB, dtype=torch.uint8, device="cuda")
            torch.cuda._sleep(cycles)
            del tmp
            if streams > 1:
                w.record_stream(main)
            del w
            ev = torch.cuda.Event()
            ev.record(main)
            queue.append(ev)
    torch.cuda.synchronize()
    return {"source": "gpu", "streams": streams, "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(), "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


def emulate(streams: int, layers: int, layer_mib: int, act_mib: int, complete: str = "sync") -> dict:
    """The same pattern through the allocator emulation; events are numbered as the tracker numbers them (the
    allocation / free count so far)."""
    from tuneplan.simulate.allocator import CachingAllocatorSim

    sim = CachingAllocatorSim(complete=complete)
    side = "side" if streams > 1 else "default"
    at, bid = 0, 0
    acts: list[int] = []
    queue: list[int] = []

    def alloc(size: int, stream: str = "default") -> int:
        nonlocal at, bid
        sim.malloc(bid, size, size, stream)
        bid, at = bid + 1, at + 1
        return bid - 1

    def free(b: int, size: int, uses: frozenset[str] = frozenset()) -> None:
        nonlocal at
        sim.free(b, size, uses, at)
        at += 1

    for backward in (False, True):
        for _ in range(layers):
            if len(queue) >= INFLIGHT:
                sim.clock.sync(queue.pop(0))
            w = alloc(layer_mib * MIB, side)
            if backward:
                free(acts.pop(), act_mib * MIB)
            else:
                acts.append(alloc(act_mib * MIB))
            free(alloc(2 * act_mib * MIB), 2 * act_mib * MIB)
            free(w, layer_mib * MIB, frozenset({"default"}) if streams > 1 else frozenset())
            queue.append(at)
    return {"source": f"emulation ({complete})" if streams > 1 else "emulation", "streams": streams,
            "max_allocated": sim.stats.max_allocated, "max_reserved": sim.stats.max_reserved,
            "reserved_by_stream_at_peak": sim.stats.reserved_by_stream_at_peak}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--layer-mib", type=int, default=256)
    ap.add_argument("--act-mib", type=int, default=64)
    ap.add_argument("--sleep-ms", type=int, default=20, help="GPU work per layer on the compute stream")
    ap.add_argument("--out", default="benchmarks/data/stream_gap.jsonl")
    ap.add_argument("--emulate-only", action="store_true",
                    help="print the emulation's figures; no GPU needed")
    a = ap.parse_args()
    shape = {"layers": a.layers, "layer_mib": a.layer_mib, "act_mib": a.act_mib}
    records = [emulate(1, **shape), emulate(2, **shape, complete="sync"),
               emulate(2, **shape, complete="eager")]
    if not a.emulate_only:
        import torch

        if not torch.cuda.is_available():
            print("stream_gap: no CUDA GPU visible to torch; nothing to measure (--emulate-only prints the "
                  "emulation)", file=sys.stderr)
            return 2
        records += [measure(s, **shape, sleep_ms=a.sleep_ms) for s in (1, 2)]
    now = time.time()
    lines = []
    for r in records:
        r.update(shape, gap_bytes=r["max_reserved"] - r["max_allocated"], time=now)
        lines.append(json.dumps(r))
        print(lines[-1])
    if not a.emulate_only:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
