"""Links between GPUs and to the host: achievable bandwidth per GPU, per direction, from the catalog text.

The accelerator catalog describes each card's interconnect in words ("NVLink3 600 GB/s (12 links); PCIe
4.0 host", "PCIe 4.0 x16; NVLink bridge 112.5 GB/s bidir (2 GPUs)"). NVIDIA quotes NVLink as the total of
both directions over all links of one GPU; a ring collective moves data one way around the ring, so the
usable figure is half of that, times what NCCL achieves.

Sources:
- PCIe per direction, x16: gen3 15.75, gen4 31.5, gen5 63 GB/s (PCI-SIG: 8/16/32 GT/s per lane, 128b/130b).
- NVLink per GPU, both directions: V100 300, A100 600, H100 900, B200 1800 GB/s (NVIDIA datasheets).
- NCCL all-reduce bus bandwidth on DGX A100 is ~230-240 GB/s of the 300 GB/s one-way NVLink figure
  (nccl-tests results published by NVIDIA / cloud providers): ``NVLINK_EFFICIENCY`` 0.78.
- Over PCIe, NCCL reaches ~20-24 GB/s of 31.5 on gen4 x16 with peer-to-peer (``PCIE_EFFICIENCY`` 0.7).
  Without peer-to-peer NCCL stages every byte through host memory (its SHM transport): the sender writes
  it to pinned host memory, the receiver reads it back. ``GEFORCE_P2P_OFF`` halves the link for that:
  two PCIe crossings per byte; CUDA's p2pBandwidthLatencyTest with P2P disabled shows ~19-20 GB/s in both
  directions together between two gen4 x16 A40s (nccl-tests issue #74), about 10 GB/s each way. Two causes:
  - GeForce cards: peer-to-peer is disabled by the driver (NVIDIA forum statements for the RTX 4090);
  - NCCL's own rule (src/graph/paths.cc, ``ncclTopoCheckP2p``): P2P only between GPUs behind a common PCIe
    switch (path PXB or closer), not across the CPU's host bridge, except on AMD CPUs with at most two
    GPUs. Where every GPU hangs off its own CPU root port, as in AWS g5 (aws-ofi-nccl
    topology/g5.48xl-topo.xml: each A10G on its own root port, no switch; g5 comes with 4 or 8 GPUs),
    NCCL goes through host memory (``NO_P2P_PLATFORMS``).
- Between nodes: InfiniBand HDR 200 Gb/s = 25 GB/s per NIC, one NIC per GPU as in a DGX A100
  (practitioners quote IB/RoCE at 25-50 GB/s); ``NETWORK_EFFICIENCY`` 0.9 of line rate for large
  messages. Override per call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from tuneplan.specs.hardware import Accelerator

PCIE_X16_GBS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
NVLINK_BIDIR_GBS = {1: 160.0, 2: 300.0, 3: 600.0, 4: 900.0, 5: 1800.0}
NVLINK_EFFICIENCY = 0.78
PCIE_EFFICIENCY = 0.70
GEFORCE_P2P_OFF = 0.5
DEFAULT_NETWORK_GBS = 25.0  # InfiniBand HDR 200 Gb/s per GPU
NETWORK_EFFICIENCY = 0.9
DEFAULT_PCIE_GEN = 4
# Cards sold only in one platform whose GPUs NCCL connects through host memory (see the module doc).
NO_P2P_PLATFORMS = {"a10g": "AWS g5: each GPU on its own CPU root port, NCCL does not use peer-to-peer"}


@dataclass(frozen=True)
class Link:
    name: str
    gbs: float  # achievable GB/s per GPU, one direction
    source: str


def ring_factor(kind: str, n: int) -> float:
    """Bytes each GPU sends per byte of the full tensor in a ring collective (NCCL's bus-bandwidth
    factors)."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def _pcie(text: str, prefer_host: bool = False) -> tuple[int, int] | None:
    found = re.findall(r"PCIe\s*(?:Gen)?\s*(\d)(?:\.0)?(?:\s*x(\d+))?([^;,]*)", text, flags=re.I)
    if not found:
        return None
    pick = found[0]
    if prefer_host:
        for f in found:
            if "host" in f[2].lower():
                pick = f
    return int(pick[0]), int(pick[1] or 16)


def _pcie_link(acc: Accelerator, what: str) -> Link:
    text = acc.interconnect or ""
    got = _pcie(text, prefer_host=what == "host")
    gen, lanes = got or (DEFAULT_PCIE_GEN, 16)
    raw = PCIE_X16_GBS.get(gen, PCIE_X16_GBS[DEFAULT_PCIE_GEN]) * lanes / 16
    eff = PCIE_EFFICIENCY
    src = f"PCIe {gen}.0 x{lanes}: {raw:g} GB/s per direction x {PCIE_EFFICIENCY:g}"
    if what == "peer" and "consumer" in (acc.form_factor or "").lower():
        eff *= GEFORCE_P2P_OFF
        src += f" x {GEFORCE_P2P_OFF:g} (GeForce: no peer-to-peer, staged through host memory)"
    elif what == "peer" and acc.id in NO_P2P_PLATFORMS:
        eff *= GEFORCE_P2P_OFF
        src += f" x {GEFORCE_P2P_OFF:g} ({NO_P2P_PLATFORMS[acc.id]}: staged through host memory)"
    if not got:
        src += " (no PCIe generation in the catalog's interconnect text: PCIe 4.0 x16 assumed)"
    return Link(f"PCIe {gen}.0 x{lanes}", raw * eff, src)


@lru_cache(maxsize=512)
def intra_node_link(acc: Accelerator, gpus: int) -> Link:
    """The link a ring over ``gpus`` GPUs of one node runs on."""
    text = acc.interconnect or ""
    for part in re.split(r";", text):
        p = part.strip()
        if "C2C" in p or "variant" in p:
            continue  # CPU<->GPU links, and figures of another form factor of the same chip
        m = re.search(r"([\d.]+)\s*(TB/s|GB/s)", p)
        gen = re.search(r"NVLink(\d)\b", p)
        if "NVLink" in p and "bridge" in p.lower():
            if gpus != 2 or not m:
                continue  # a bridge joins two cards; larger rings fall back to PCIe
        if "NVLink" in p:
            if m:
                bidir = float(m.group(1)) * (1000 if m.group(2) == "TB/s" else 1)
                src = f"catalog: '{p}'"
            elif gen and int(gen.group(1)) in NVLINK_BIDIR_GBS:
                bidir = NVLINK_BIDIR_GBS[int(gen.group(1))]
                src = f"NVLink{gen.group(1)} per-GPU total {bidir:g} GB/s (NVIDIA datasheet)"
            else:
                continue
            return Link("NVLink" + (" bridge" if "bridge" in p.lower() else ""),
                        bidir / 2 * NVLINK_EFFICIENCY, f"{src}; half per direction x {NVLINK_EFFICIENCY:g}")
        m = re.search(r"(\d+)\s*x\s*Infinity Fabric links?\s*\(([\d.]+)\s*GB/s", p, flags=re.I)
        if m:
            bidir = int(m.group(1)) * float(m.group(2))
            return Link("Infinity Fabric", bidir / 2 * NVLINK_EFFICIENCY,
                        f"catalog: '{p}'; half per direction x {NVLINK_EFFICIENCY:g} "
                        "(NVLink efficiency assumed)")
    return _pcie_link(acc, "peer")


@lru_cache(maxsize=512)
def host_link(acc: Accelerator) -> Link:
    text = acc.interconnect or ""
    m = re.search(r"NVLink-C2C\s*([\d.]+)\s*GB/s", text)
    if m:
        return Link("NVLink-C2C", float(m.group(1)) / 2 * NVLINK_EFFICIENCY, f"catalog: '{m.group(0)}'")
    return _pcie_link(acc, "host")


STATED_LINK_FORMS = "pcie<gen>x<lanes> (e.g. pcie3x8, pcie4x16), optionally with -nop2p; or nvlink<gen>"


def valid_stated_link(text: str) -> bool:
    """Whether ``text`` is one of ``STATED_LINK_FORMS``."""
    t = text.strip().lower().replace(" ", "").replace(".0", "")
    m = re.fullmatch(r"pcie(?:gen)?(\d)x(\d+)(-nop2p)?", t)
    if m:
        return int(m.group(1)) in PCIE_X16_GBS and int(m.group(2)) in (1, 2, 4, 8, 16)
    nv = re.fullmatch(r"nvlink(\d)", t)
    return nv is not None and int(nv.group(1)) in NVLINK_BIDIR_GBS


def stated_link(text: str, acc: Accelerator, gpus: int) -> Link:
    """The link between the GPUs of one node as the user states it (``--link pcie3x8``): boards that split
    one x16 slot into x8/x8, older PCIe generations, or a card's peer-to-peer state differ from the
    catalog's card figures, and the link sets every collective's time. PCIe rates and the peer-to-peer rule
    are those of ``_pcie_link`` (a GeForce card stays without peer-to-peer); ``-nop2p`` says NCCL stages
    through host memory on this machine. Raises ValueError on a form outside ``STATED_LINK_FORMS``."""
    t = text.strip().lower().replace(" ", "").replace(".0", "")
    m = re.fullmatch(r"nvlink(\d)", t)
    if m and int(m.group(1)) in NVLINK_BIDIR_GBS:
        bidir = NVLINK_BIDIR_GBS[int(m.group(1))]
        return Link(f"NVLink{m.group(1)} (stated)", bidir / 2 * NVLINK_EFFICIENCY,
                    f"stated {text}: {bidir:g} GB/s per GPU both directions, half per direction x "
                    f"{NVLINK_EFFICIENCY:g}")
    m = re.fullmatch(r"pcie(?:gen)?(\d)x(\d+)(-nop2p)?", t)
    if not m or int(m.group(1)) not in PCIE_X16_GBS or int(m.group(2)) not in (1, 2, 4, 8, 16):
        raise ValueError(text)
    gen, lanes = int(m.group(1)), int(m.group(2))
    raw = PCIE_X16_GBS[gen] * lanes / 16
    no_p2p = bool(m.group(3)) or "consumer" in (acc.form_factor or "").lower() or acc.id in NO_P2P_PLATFORMS
    eff = PCIE_EFFICIENCY * (GEFORCE_P2P_OFF if no_p2p and gpus > 1 else 1.0)
    src = f"stated {text}: PCIe {gen}.0 x{lanes} {raw:g} GB/s per direction x {PCIE_EFFICIENCY:g}"
    if no_p2p:
        src += f" x {GEFORCE_P2P_OFF:g} (no peer-to-peer: staged through host memory)"
    return Link(f"PCIe {gen}.0 x{lanes} (stated)", raw * eff, src)


def network_link(gbs: float | None = None) -> Link:
    if gbs:
        return Link("network", gbs * NETWORK_EFFICIENCY, f"given {gbs:g} GB/s x {NETWORK_EFFICIENCY:g}")
    return Link("InfiniBand HDR 200 Gb/s", DEFAULT_NETWORK_GBS * NETWORK_EFFICIENCY,
                f"default: {DEFAULT_NETWORK_GBS:g} GB/s per GPU x {NETWORK_EFFICIENCY:g}; "
                "{inter_node_gbs} sets yours")
