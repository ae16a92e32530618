"""Reserved vs allocated on one CUDA card when blocks move between streams (FSDP's all-gather pattern).

    python benchmarks/stream_gap.py [--layers 8] [--layer-mib 256] [--act-mib 64] [--out FILE]

Each "layer": an unsharded-parameter buffer allocated on a side stream (FSDP1 ``_unshard`` runs on its
unshard stream), used on the default stream, ``record_stream``-ed and freed there; activation-sized blocks
allocated on the default stream between them; then a backward-like pass in reverse order. The caching
allocator keeps blocks per stream and does not hand a block freed with a pending use on another stream to a
new request until that use is done (c10/cuda/CUDACachingAllocator.cpp ``record_stream`` / ``process_events``),
so the reserved peak exceeds the allocated peak by more than in a one-stream run. Prints and appends one JSON
line per run (one stream, two streams) to --out, for checking the allocator emulation. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run(streams: int, layers: int, layer_mib: int, act_mib: int) -> dict:
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    side = torch.cuda.Stream() if streams > 1 else torch.cuda.current_stream()
    main = torch.cuda.current_stream()
    mib = 1024**2
    acts = []
    for order in (range(layers), reversed(range(layers))):
        for _ in order:
            with torch.cuda.stream(side):
                w = torch.empty(layer_mib * mib, dtype=torch.uint8, device="cuda")
            main.wait_stream(side)
            w.record_stream(main)
            acts.append(torch.empty(act_mib * mib, dtype=torch.uint8, device="cuda"))
            tmp = torch.empty(2 * act_mib * mib, dtype=torch.uint8, device="cuda")
            del tmp, w
        acts = acts[: len(acts) // 2]
    torch.cuda.synchronize()
    return {"streams": streams, "layers": layers, "layer_mib": layer_mib, "act_mib": act_mib,
            "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "time": time.time()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--layer-mib", type=int, default=256)
    ap.add_argument("--act-mib", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/data/stream_gap.jsonl")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("stream_gap: no CUDA GPU visible to torch; nothing to measure", file=sys.stderr)
        return 2
    with open(a.out, "a", encoding="utf-8") as f:
        for streams in (1, 2):
            r = run(streams, a.layers, a.layer_mib, a.act_mib)
            r["gap_bytes"] = r["max_reserved"] - r["max_allocated"]
            print(json.dumps(r))
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
