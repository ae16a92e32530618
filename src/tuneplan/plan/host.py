"""Host memory (RAM per node) the planner assumes for CPU offload, and where the figure comes from.

In order:
1. ``given``: the user's own figure (``host_memory_gib``);
2. ``this machine``: the card asked about is one of this machine's (the devices ``tuneplan doctor``
   detects): its RAM (``os.sysconf``: physical pages x page size). Inside :func:`elsewhere` (the web
   page, which answers for a remote user) no machine is detected and this step never applies;
3. ``cloud instance``: the typical cloud instance with that card (``catalog/cloud_hosts.csv``, each row
   with its source): the instance's RAM per GPU x the GPUs per node;
4. ``default``: :data:`DEFAULT_TEXT`, the one default every face states.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from tuneplan.catalog.accelerators import HOST_DEFAULT_MIN_GIB, HOST_DEFAULT_TEXT, cloud_host
from tuneplan.specs.hardware import Accelerator

GIB = 2**30
DEFAULT_MIN_BYTES = HOST_DEFAULT_MIN_GIB * GIB  # catalog/accelerators.py says why
DEFAULT_TEXT = HOST_DEFAULT_TEXT


@dataclass(frozen=True)
class Machine:
    """This machine, as far as the host memory goes: the catalog ids of its cards and its RAM."""

    cards: tuple[str, ...] = ()
    ram_bytes: int | None = None


@dataclass(frozen=True)
class HostMemory:
    bytes: int
    source: str  # "given" | "this machine" | "cloud instance" | "default"
    instance: str | None = None  # the cloud instance the figure is read from
    reference: str | None = None  # where that instance's RAM is published

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_bytes(gpu: Accelerator, gpus_per_node: int) -> int:
    return max(DEFAULT_MIN_BYTES, 2 * gpu.memory_bytes * gpus_per_node)


def assumed(gpu: Accelerator, gpus_per_node: int, given: int | None = None,
            machine: Machine | None = None) -> HostMemory:
    """The host memory per node for ``gpu`` x ``gpus_per_node`` (module docstring); ``machine`` None:
    this machine, detected once per process."""
    if given is not None:
        return HostMemory(given, "given")
    here = machine if machine is not None else _ASKED_FROM.get() or this_machine()
    if gpu.id in here.cards and here.ram_bytes:
        return HostMemory(here.ram_bytes, "this machine")
    inst = cloud_host(gpu.id)
    if inst is not None:
        per_gpu = inst["host_bytes"] // inst["gpus"]
        return HostMemory(per_gpu * gpus_per_node, "cloud instance",
                          f"{inst['instance']} ({inst['gpus']} GPUs, {inst['host_bytes'] // GIB:,} GiB)",
                          inst["source"])
    return HostMemory(default_bytes(gpu, gpus_per_node), "default")


# The machine the question comes from, when it is not this process's (None: detect this one).
_ASKED_FROM: ContextVar[Machine | None] = ContextVar("tuneplan_asked_from", default=None)


@contextmanager
def elsewhere() -> Iterator[None]:
    """Answer as for a machine with no catalog card and unknown RAM while the block runs: a server's own
    cards and RAM say nothing about the user asking (the web page wraps every request in this), and
    detecting them would run ``nvidia-smi`` on the server."""
    token = _ASKED_FROM.set(Machine())
    try:
        yield
    finally:
        _ASKED_FROM.reset(token)


def ram_bytes() -> int | None:
    """Physical memory of this machine, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


@lru_cache(maxsize=1)
def this_machine() -> Machine:
    """The catalog cards among this machine's devices (NVML / nvidia-smi / npu-smi, as ``doctor``
    reads them) and its RAM."""
    from tuneplan.catalog.accelerators import resolve_accelerator
    from tuneplan.doctor.system import SystemDetector
    from tuneplan.errors import TuneplanError

    ids = []
    for dev in SystemDetector(check_bnb_import=False).devices():
        try:
            ids.append(resolve_accelerator(dev.name).id)
        except TuneplanError:
            continue
    return Machine(tuple(dict.fromkeys(ids)), ram_bytes() if ids else None)
