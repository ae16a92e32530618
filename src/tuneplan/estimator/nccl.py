"""What a collective costs beyond its bytes: NCCL's per-call latency, and the ring or tree algorithm it picks.

NCCL predicts the time of every collective with its own model and runs the algorithm that model calls
fastest (``src/graph/tuning.cc``, ``ncclTopoTuneModel``, NCCL 2.19-2.23): ``time = latency + bytes /
algorithm bandwidth``. Large buffers use the Simple protocol, whose latencies (microseconds) are:

- a base latency per call, ``baseLat`` Simple: 8.4 for ring and tree (``BASE_LATENCY_US``);
- a hop latency per step of the algorithm, ``hwLat`` Simple by link: NVLink ring 3.4, tree 4.0; PCIe ring
  5.7, tree 4.0; network 14 for both (``HOP_LATENCY_US``). NCCL counts a link that is not NVLink as PCIe,
  host-memory (SHM) paths included.
- a ring takes ``2 (n - 1)`` steps for an all-reduce and ``n - 1`` for an all-gather or reduce-scatter;
  across nodes ``2 (nodes - 1)`` (or ``nodes - 1``) of them cross the network, the others stay inside a node
  (where NCCL raises the hop latency to at least its network post overhead, 1 us x 3 on Intel CPUs);
- a tree all-reduce: ``2 ((ranks per node - 1) x intra-node hop + log2(nodes) x network hop)``.

Bandwidth: a ring all-reduce moves ``2 (n - 1) / n`` of the buffer per GPU at the bus bandwidth (``links.py``
gives it per link); a tree all-reduce runs at ``0.92 x 0.5`` of the bus bandwidth (``busBw * .92``, then
the tree's ratio ``.5``), so inside one node the ring always carries bytes faster and the tree wins only on
latency: a small buffer over many ranks or nodes. All-gather and reduce-scatter run as rings.

How many calls: FSDP and ZeRO-3 gather every unit (one decoder layer, plus the root unit holding the
embeddings and head) in forward and again in backward, and reduce-scatter its gradients: three calls per
unit per micro-batch. DDP and ZeRO-1/2 reduce the gradients in buckets (the wrapper's bucket size): one call
per bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BASE_LATENCY_US = 8.4  # baseLat[ring|tree][Simple], tuning.cc
HOP_LATENCY_US = {("nvlink", "ring"): 3.4, ("nvlink", "tree"): 4.0, ("pcie", "ring"): 5.7,
                  ("pcie", "tree"): 4.0, ("net", "ring"): 14.0, ("net", "tree"): 14.0}
NET_POST_OVERHEAD_US = 3 * 1.0  # getNetOverhead(): 1 us on Intel x86, x 3 for the Simple protocol
TREE_ALLREDUCE_BW = 0.92 * 0.5  # busBw x .92 for a tree all-reduce, x .5 from bus to algorithm bandwidth
CALLS_PER_SHARDED_UNIT = 3  # all-gather in forward, all-gather in backward, reduce-scatter of gradients


@dataclass(frozen=True)
class CollectiveCall:
    """One NCCL call's time: ``latency_s`` before its bytes move, then ``bytes / bandwidth``."""

    algorithm: str  # ring | tree
    latency_s: float
    seconds: float  # the whole call


def link_kind(link_name: str) -> str:
    """NCCL's hardware class for a node's link: NVLink (and AMD's Infinity Fabric, the same role) or PCIe."""
    return "nvlink" if link_name.startswith(("NVLink", "Infinity Fabric")) else "pcie"


def ring_latency_us(kind: str, ranks: int, nodes: int, intra: str) -> float:
    """Latency of a ring ``kind`` call over ``ranks`` GPUs on ``nodes`` nodes (see the module doc)."""
    steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
    inter_steps = 0 if nodes <= 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
    hop = HOP_LATENCY_US[(intra, "ring")]
    if nodes > 1:
        hop = max(hop, NET_POST_OVERHEAD_US)
    return BASE_LATENCY_US + (steps - inter_steps) * hop + inter_steps * HOP_LATENCY_US[("net", "ring")]


def tree_latency_us(ranks: int, nodes: int, intra: str) -> float:
    """Latency of a tree all-reduce over ``ranks`` GPUs on ``nodes`` nodes."""
    per_node = ranks // max(nodes, 1)
    return BASE_LATENCY_US + 2 * ((per_node - 1) * HOP_LATENCY_US[(intra, "tree")]
                                  + math.log2(max(nodes, 1)) * HOP_LATENCY_US[("net", "tree")])


def collective_call(kind: str, nbytes: float, ranks: int, nodes: int, link_name: str,
                    bus_gbs: float) -> CollectiveCall:
    """The time NCCL's model gives one call of ``kind`` (all_reduce | all_gather | reduce_scatter) on a
    buffer of ``nbytes`` (the whole tensor) at ``bus_gbs`` GB/s of bus bandwidth, with the algorithm it
    picks."""
    intra = link_kind(link_name)
    bw = bus_gbs * 1e9
    share = 2.0 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks
    ring_lat = ring_latency_us(kind, ranks, nodes, intra) * 1e-6
    ring = CollectiveCall("ring", ring_lat, ring_lat + nbytes * share / bw)
    if kind != "all_reduce":
        return ring
    tree_lat = tree_latency_us(ranks, nodes, intra) * 1e-6
    tree = CollectiveCall("tree", tree_lat, tree_lat + nbytes / (bw * TREE_ALLREDUCE_BW))
    return tree if tree.seconds < ring.seconds else ring


def call_overhead(kind: str, nbytes: float, ranks: int, nodes: int, link_name: str, bus_gbs: float) -> float:
    """Seconds one call costs beyond a ring's bandwidth term (what the wrappers' volumes already time):
    the latency, and for an all-reduce NCCL would run as a tree, the tree's time less the ring's bytes."""
    if ranks <= 1:
        return 0.0
    share = 2.0 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks
    return collective_call(kind, nbytes, ranks, nodes, link_name, bus_gbs).seconds - nbytes * share / (
        bus_gbs * 1e9)
