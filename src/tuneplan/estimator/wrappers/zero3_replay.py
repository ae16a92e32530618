r"""A replay of ZeRO-3's parameter coordinator over a step's module trace, on sizes only: which parameters
are gathered after each module fetch and release of a step with a complete trace (from the second step).

DeepSpeed 0.19.8 ``PartitionedParameterCoordinator`` (runtime/zero/partitioned_param_coordinator.py): the
parameter queue is every fetched module's parameters in fetch order, each with the step of that fetch
(``construct_parameter_trace_from_module_trace``). A fetch gathers the module's parameters, pops them off
the queue and then pops a round of NOT_AVAILABLE parameters while fewer than

.. math:: \min(M - A,\ B)

elements are taken (``M`` ``stage3_max_live_parameters``, ``A`` ``__n_available_params``, ``B``
``stage3_prefetch_bucket_size``): AVAILABLE ones it meets are popped uncounted, their later use recorded
(``__most_recent_step_id_param_fetched_for``). So once the queue ahead holds only parameters kept gathered,
the next one NOT_AVAILABLE is popped alone as soon as ``A < M``, however large. A release frees a
parameter unless the prefetcher recorded a later use, or it is used again within
``stage3_max_reuse_distance`` elements of modules (``__params_to_release``), or another module still has
it active; a checkpoint's recompute files its frozen weights under the backward module running
(``update_recompute_parameters``), released with it. Persistent parameters
(``stage3_param_persistence_threshold``) are whole for the run, never counted in ``A``."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate

from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
)


@dataclass
class Param:
    """One partitioned parameter: its ``ds_numel``, bytes an element gathered, whether it is trained."""

    numel: int
    nbytes: int
    trained: bool = False

    @property
    def persistent(self) -> bool:
        # ``mark_persistent_parameters``: kept whole for the run, never fetched nor released
        return self.numel <= DS_PARAM_PERSISTENCE_THRESHOLD


@dataclass
class Module:
    """A module running ZeRO-3's fetch hook, with its parameters (an external one included)."""

    params: list[Param] = field(default_factory=list)
    role: str = ""  # what the module is in a decoder layer, where a caller needs to find it
    # a ZeRO-3 leaf module (``z3_leaf_module``): ``params`` are its children's, none its own
    leaf: bool = False
    # every parameter under the module (``iter_params(recurse=True)``), where it has children
    tree: list[Param] | None = None

    def walked(self, leaf: bool) -> list[Param]:
        """The parameters ``__params_to_release`` meets in this module when it walks the trace for a
        module to release: ``iter_params(module, recurse=z3_leaf_module(released))``."""
        if leaf:
            return self.params if self.tree is None else self.tree
        return [] if self.leaf else self.params


@dataclass
class Round:
    """One coalesced all-gather (``AllGatherCoalescedHandle``): its flat buffer, held while the inflight
    registry still files a parameter under it."""

    params: list[Param]
    entries: int
    waited: bool = False

    @property
    def flat(self) -> int:
        return sum(p.numel * p.nbytes for p in self.params)


# an event of the step: (action, module, pass) with action "fetch" or "release", pass "F", "R" (a
# checkpoint's recompute) or "B"
Event = tuple[str, Module, str]


class Coordinator:
    """``PartitionedParameterCoordinator`` (DeepSpeed 0.19.8, partitioned_param_coordinator.py) with a
    complete trace, on sizes: ``_fetch_sub_module_impl``, ``release_sub_module``, ``__params_to_release``,
    ``__all_gather_params_`` and ``__release_param``'s count ``__n_available_params``."""

    def __init__(self, order: list[Module], prefetch_bucket: int) -> None:
        self.order, self.bucket = order, prefetch_bucket
        # construct_parameter_trace_from_module_trace: every fetched module's parameters, in fetch order
        self.trace = [(p, step) for step, m in enumerate(order) for p in m.params]
        self.queue = deque(self.trace)
        # the reuse window of __params_to_release: elements of the modules before each step, and the steps
        # each parameter is met at, the walk recursing into every module for a leaf module's release
        self.before: dict[bool, list[int]] = {}
        self.uses: dict[bool, dict[int, list[int]]] = {}
        for leaf in (False, True):
            self.before[leaf] = list(accumulate((sum(p.numel for p in m.walked(leaf)) for m in order),
                                                initial=0))
            self.uses[leaf] = {}
            for step, m in enumerate(order):
                for p in {id(q): q for q in m.walked(leaf)}.values():
                    self.uses[leaf].setdefault(id(p), []).append(step)
        self.bytes = 0
        self.recent: dict[int, int] = {}
        self.available = {id(p) for m in order for p in m.params if p.persistent}
        self.active: dict[int, set[int]] = {}
        self.backward: list[Module] = []  # __active_backward_submodules
        self.recompute: dict[int, list[Param]] = {}  # ds_recompute_parameters
        self.step = 0
        self.n_available = 0
        self.gathered: dict[int, Param] = {}
        self.inflight: dict[int, Round] = {}  # __inflight_param_registry

    def gather(self, params: list[Param]) -> None:
        """``__all_gather_params_``: the NOT_AVAILABLE ones gathered, counted in ``A``. One parameter is
        gathered into its own buffer (``_all_gather_sequential``); more into one flat buffer
        (``_all_gather_coalesced``), each parameter's copy made at the round's first wait."""
        new = [p for p in params if id(p) not in self.available]
        for p in new:
            self.available.add(id(p))
            self.gathered[id(p)] = p
            self.n_available += p.numel
            self.file(p, None)
        if len(new) == 1:
            self.bytes += new[0].numel * new[0].nbytes
        elif new:
            r = Round(new, len(new))
            self.bytes += r.flat
            for p in new:
                self.inflight[id(p)] = r

    def file(self, p: Param, r: Round | None) -> None:
        """Take ``p``'s entry off the inflight registry (``r`` None) or wait on it: the round's copies made
        at its first wait (``AllGatherCoalescedHandle.wait``), its flat buffer freed with its last entry."""
        old = self.inflight.pop(id(p), None)
        if old is None:
            return
        if r is not None and not old.waited:
            old.waited = True
            self.bytes += sum(q.numel * q.nbytes for q in old.params if id(q) in self.gathered)
        old.entries -= 1
        if old.entries == 0:
            self.bytes -= old.flat

    def ready(self, p: Param) -> bool:
        """AVAILABLE (not INFLIGHT in a round not yet waited)."""
        r = self.inflight.get(id(p))
        return r is None or r.waited

    def fetch(self, module: Module, kind: str) -> None:
        """``_fetch_sub_module_impl``: gather the module's parameters, pop them off the queue, prefetch."""
        if kind == "B":
            self.backward.append(module)
        own = list({id(p): p for p in module.params}.values())
        self.gather(own)
        for p in own:
            if id(p) in self.inflight:
                self.file(p, self.inflight[id(p)])
        for p in own:
            self.active.setdefault(id(p), set()).add(id(module))
            if kind == "R" and not p.trained and self.backward:
                # update_recompute_parameters: a frozen weight a recompute fetches goes with the backward
                # module running, active under it until it is released
                owner = self.backward[-1]
                self.recompute.setdefault(id(owner), []).append(p)
                self.active[id(p)].add(id(owner))
        fresh = {id(p) for p in own if self.recent.get(id(p), -1) < self.step}
        popped: set[int] = set()
        while self.queue and len(popped) < len(fresh):
            p, used = self.queue.popleft()
            self.recent[id(p)] = used
            popped.add(id(p))
        limit = min(DS_MAX_LIVE_PARAMETERS - self.n_available, self.bucket)
        taken: list[Param] = []
        numel = 0
        while self.queue and numel < limit:
            p, used = self.queue.popleft()
            self.recent[id(p)] = max(self.recent.get(id(p), -1), used)
            if id(p) not in self.available and all(q is not p for q in taken):
                taken.append(p)
                numel += p.numel
        self.gather(taken)
        self.step += 1

    def release(self, module: Module, kind: str) -> None:
        """``release_sub_module`` with ``__params_to_release`` at the current step."""
        params = list({id(p): p for p in module.params}.values())
        keep = {id(p) for p in params if p.persistent or self.recent.get(id(p), -1) > self.step}
        # the modules from this step on are scanned while fewer than D elements were before them
        before = self.before[module.leaf]
        last = bisect_left(before, before[self.step] + DS_MAX_REUSE_DISTANCE) - 1
        for p in params:
            uses = self.uses[module.leaf].get(id(p), [])
            i = bisect_left(uses, self.step)
            if i < len(uses) and uses[i] <= last:
                keep.add(id(p))
        drop = [p for p in params if id(p) not in keep]
        if kind == "B":
            extra = self.recompute.pop(id(module), [])
            drop += [p for p in extra if not p.persistent]
            params += extra
            self.backward = [m for m in self.backward if m is not module]
        for p in params:
            self.active.get(id(p), set()).discard(id(module))
        for p in drop:
            if id(p) in self.gathered and not self.active.get(id(p)) and self.ready(p):
                self.available.discard(id(p))
                del self.gathered[id(p)]
                self.n_available -= p.numel
                self.bytes -= p.numel * p.nbytes

    def gathered_bytes(self) -> int:
        """Bytes of the gathered non-persistent parameters and the flat buffers still held."""
        return self.bytes


def replay(events: list[Event], prefetch_bucket: int) -> list[tuple[int, int]]:
    """(``__n_available_params``, gathered bytes) after each event of a step with a complete trace, the
    trace being the events' fetches."""
    order = [m for action, m, _ in events if action == "fetch"]
    c = Coordinator(order, prefetch_bucket)
    out = []
    for e in events:
        (c.fetch if e[0] == "fetch" else c.release)(e[1], e[2])
        out.append((c.n_available, c.gathered_bytes()))
    return out

