"""The host (CPU) memory beside a card: the typical cloud instance that carries it, and the default
where the catalog names none."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

# Host RAM per node without a figure for the card (no typical cloud instance, not this machine's): twice
# the node's GPU memory, at least 64 GiB. A desktop board with one consumer card commonly holds 2 x 32 GB;
# a server node holds more RAM than GPU memory (a DGX A100 node: 640 GB of GPU memory, 2 TB of RAM, NVIDIA
# DGX A100 user guide). The one sentence every face states:
HOST_DEFAULT_MIN_GIB = 64
HOST_DEFAULT_TEXT = f"twice the node's GPU memory, at least {HOST_DEFAULT_MIN_GIB} GiB"


@lru_cache(maxsize=1)
def _cloud_hosts() -> dict[str, dict[str, Any]]:
    import csv
    import io

    text = resources.files("tuneplan.catalog").joinpath("cloud_hosts.csv").read_text(encoding="utf-8")
    return {r["accelerator"]: {"instance": r["instance"], "gpus": int(r["gpus"]),
                               "host_bytes": int(float(r["host_gib"]) * 2**30), "source": r["source"]}
            for r in csv.DictReader(io.StringIO(text))}


def cloud_host(acc_id: str) -> dict[str, Any] | None:
    """The typical cloud instance with this card (``catalog/cloud_hosts.csv``: instance, GPUs, host RAM in
    bytes, source), or None where the catalog names none."""
    got = _cloud_hosts().get(acc_id)
    return dict(got) if got is not None else None
