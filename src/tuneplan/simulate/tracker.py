"""Every storage the simulated step allocates, in order, with the CUDA allocator's rounding.

``StorageTracker`` is a ``TorchDispatchMode`` stacked inside ``FakeTensorMode``: each op's outputs are
fake tensors whose storages it registers (once per storage: views share it) with a weakref finalizer
that fires when the C++ storage dies, i.e. exactly when a real run would hand the block back to the
caching allocator. Sizes are rounded up to 512 bytes (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp),
so the running sum is what ``torch.cuda.memory_allocated`` would show.

A block gets a category when it is allocated (phase, module and op decide) and may be relabelled later:
a backward output that ``AccumulateGrad`` keeps as ``p.grad`` becomes a gradient, a step temporary kept in
``optimizer.state`` becomes an optimizer state. The live set at the peak is rebuilt by replaying the
event log afterwards, so relabelling applies to it.

Streams: the wrappers' stream work (which stream a block belongs to, ``record_stream``, the CPU
waiting for the GPU) is read by ``streams.stream_hooks`` while the tracker is entered.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tuneplan.simulate.streams import stream_hooks

ROUND = 512  # kMinBlockSize: every CUDA caching-allocator block is a multiple of 512 bytes


def rounded(nbytes: int) -> int:
    return 0 if nbytes <= 0 else -(-nbytes // ROUND) * ROUND


@dataclass
class Block:
    bid: int
    size: int  # rounded bytes
    requested: int
    category: str
    phase: str
    op: str
    module: str
    shape: tuple[int, ...]
    dtype: str
    freed_at: int = -1
    stream: str = "default"  # the stream current when it was allocated (its pool in the caching allocator)
    uses: set[str] = field(default_factory=set)  # other streams it was record_stream-ed on


@dataclass
class Event:
    index: int
    block: Block
    alloc: bool


@dataclass
class Workspace:
    """A kernel-internal buffer the fake kernel does not allocate: added around one op."""

    name: str
    size: int
    category: str
    persistent: bool = False  # cuBLAS workspace: allocated once, kept for the process


@dataclass
class TrackResult:
    events: list[Event]
    blocks: list[Block]
    workspaces: list[tuple[str, str, int]] = field(default_factory=list)  # (name, op, bytes) first seen
    stream_ops: list[tuple[Any, ...]] = field(default_factory=list)  # allocator.replay's stream log


class StorageTracker(TorchDispatchMode):
    """Counts live storages; ``context`` (phase, module stack) is maintained by the step driver."""

    def __init__(self, workspace_rule: Any = None) -> None:
        super().__init__()
        self._live: dict[int, Block] = {}
        self.events: list[Event] = []
        self.blocks: list[Block] = []
        self.phase = "setup"
        self.module_stack: list[str] = []
        self.top_module = ""
        self.lm_head_names: tuple[str, ...] = ("lm_head",)
        self.vocab = 0
        self.workspace_rule = workspace_rule
        self.workspaces_seen: dict[str, tuple[str, str, int]] = {}
        self.param_storages: set[int] = set()
        self._persistent: list[Block] = []
        self.host_scalars_in_optimizer = False
        self.micro = 0
        self.stream_ops: list[tuple[Any, ...]] = []
        self._stream_names: dict[int, str] = {}
        self._unhook: Any = None
        self._depth = 0

    # ---- streams -----------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        if getattr(self, "_phase", "").endswith(".backward") and not value.endswith(".backward"):
            # the Trainer's isnan(tr_loss_step) after the micro-batch's backward: the CPU waits for the
            # compute stream
            at = len(self.events)
            self.stream_ops.append((at, "sync", "default", at))
        self._phase = value

    def stream_name(self, stream: Any = None) -> str:
        """The name of ``stream`` (the current stream when None): ``default`` for the compute stream."""
        import torch

        if stream is None:
            stream = torch.cpu.current_stream()
        if stream is None or stream is torch.cpu._default_cpu_stream:
            return "default"
        name = self._stream_names.get(id(stream))
        if name is None:
            name = self._stream_names[id(stream)] = f"side stream {len(self._stream_names) + 1}"
        return name

    def name_streams(self, holder: Any, attrs: dict[str, str]) -> None:
        import torch

        for attr, name in attrs.items():
            s = getattr(holder, attr, None)
            if isinstance(s, torch.cpu.Stream) and s is not torch.cpu._default_cpu_stream:
                self._stream_names.setdefault(id(s), name)

    def record_use(self, t: torch.Tensor, stream: Any) -> None:
        """``tensor.record_stream(stream)`` as the caching allocator files it on the tensor's block."""
        b = self.block_of(t)
        if b is not None:
            name = self.stream_name(stream)
            if name != b.stream:
                b.uses.add(name)

    def __enter__(self) -> StorageTracker:
        out = super().__enter__()
        self._depth += 1
        if self._depth == 1:  # a re-entered mode (a checkpoint's recomputation) keeps the outer hooks
            self._unhook = stream_hooks(self)
            self._unhook.__enter__()
        return out

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._unhook is not None:
            self._unhook.__exit__(None, None, None)
            self._unhook = None
        super().__exit__(*exc)

    # ---- registration ----------------------------------------------------------------------
    def _new_block(self, size: int, requested: int, category: str, op: str, shape: tuple[int, ...],
                   dtype: str) -> Block:
        b = Block(len(self.blocks), size, requested, category, self.phase, op,
                  self.module_stack[-1] if self.module_stack else "", shape, dtype, stream=self.stream_name())
        self.blocks.append(b)
        self.events.append(Event(len(self.events), b, True))
        return b

    def _release(self, b: Block) -> None:
        if b.freed_at < 0:
            b.freed_at = len(self.events)
            self.events.append(Event(len(self.events), b, False))

    def register(self, t: torch.Tensor, category: str, op: str = "") -> Block | None:
        """Track ``t``'s storage (if new) under ``category``; returns its block."""
        st = t.untyped_storage()
        key = st._cdata
        if key in self._live:
            return self._live[key]
        n = st.nbytes()
        if n == 0 or t.device.type == "meta":
            return None
        b = self._new_block(rounded(n), n, category, op, tuple(t.shape), str(t.dtype).replace("torch.", ""))
        self._live[key] = b

        def _gone(k: int = key, blk: Block = b) -> None:
            if self._live.get(k) is blk:
                del self._live[k]
            self._release(blk)

        weakref.finalize(st, _gone)
        return b

    def resized(self, t: torch.Tensor, category: str, op: str = "") -> None:
        """A storage resized in place (FSDP1's ``_alloc_storage`` / ``_free_storage``): to 0 bytes it is a
        free of its block, back to full size a new allocation, as the caching allocator sees it."""
        key = t.untyped_storage()._cdata
        old = self._live.pop(key, None)
        if old is not None:
            self._release(old)
        if t.untyped_storage().nbytes():
            self.register(t, category, op=op)

    def block_of(self, t: torch.Tensor) -> Block | None:
        t = getattr(t, "_local_tensor", t)  # a DTensor (fully_shard's params, gradients, states): the shard
        return self._live.get(t.untyped_storage()._cdata)

    def relabel(self, t: torch.Tensor | None, category: str) -> None:
        if t is None:
            return
        b = self.block_of(t)
        if b is not None and b.category != "host":  # an offloaded storage stays on the host
            b.category = category

    def untrack(self, t: torch.Tensor) -> None:
        """A storage that lives on the host in a real run (CPU step counters of non-fused AdamW)."""
        b = self.block_of(t)
        if b is not None and b.freed_at < 0:
            b.category = "host"

    def workspace(self, w: Workspace, op: str) -> Block | None:
        """Allocate a kernel-internal buffer; the caller releases non-persistent ones."""
        if w.size <= 0:
            return None
        prev = self.workspaces_seen.get(w.name)
        if prev is None or prev[2] < w.size:
            self.workspaces_seen[w.name] = (w.name, op, w.size)
        b = self._new_block(rounded(w.size), w.size, w.category, op, (w.size,), "uint8")
        if w.persistent:
            self._persistent.append(b)
        return b

    # ---- classification ----------------------------------------------------------------------
    def _category(self, func: Any, args: Any, out: torch.Tensor) -> str:
        phase = self.phase.split(".")[-1]
        if phase in ("optimizer", "zero_grad"):
            # Non-fused, non-capturable optimizers keep step counters and bias corrections on the host.
            if self.host_scalars_in_optimizer and out.dim() == 0:
                return "host"
            return "optimizer_temp"
        in_module = bool(self.module_stack)
        if phase == "backward" and not in_module and torch.is_grad_enabled():
            # a checkpoint's recomputation runs the layer's forward under enable_grad() inside backward;
            # transformers 5 checkpoints a layer's `forward`, not `__call__`, so its own ops (the residual
            # adds) run outside any module: they are the recomputed activations, not backward scratch
            return "activations"
        if phase == "backward" and not in_module:
            # Loss-chain gradients are dense over the vocabulary (nll_loss / log_softmax backward).
            if self.vocab and out.dim() >= 1 and out.shape[-1] == self.vocab and out.numel() > self.vocab:
                return "logits_loss"
            return "backward_temp"
        if not in_module:
            return "activations"
        if "_to_copy" in str(func):
            src = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if src is not None and src.untyped_storage()._cdata in self.param_storages:
                return "autocast_copies"
        top = self.module_stack[-1]
        if top == self.top_module or any(top.endswith(n) for n in self.lm_head_names):
            return "logits_loss"
        return "activations"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        ws = self.workspace_rule(func, args, self) if self.workspace_rule else None
        for w in ws or ():
            if w.persistent and w.name not in self.workspaces_seen:
                self.workspace(w, str(func))  # kept for the process: allocated before the op's outputs
        out = func(*args, **kwargs)
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                # a DTensor's op runs on its local shard below this mode: the shard is what is allocated
                t = getattr(t, "_local_tensor", t)
                key = t.untyped_storage()._cdata
                if key not in self._live:
                    self.register(t, self._category(func, args, t), op=str(func))
        # Scratch of the kernel: live together with its inputs and outputs, freed when it returns.
        scratch = [w for w in ws or () if not w.persistent]
        blocks = [self.workspace(w, str(func)) for w in scratch]
        for b in blocks:
            if b is not None:
                self._release(b)
        return out

    def result(self) -> TrackResult:
        return TrackResult(self.events, self.blocks, list(self.workspaces_seen.values()),
                           list(self.stream_ops))


@dataclass
class Peak:
    bytes: int
    index: int
    live: list[Block]
    phase: str
    op: str
    module: str
    phase_peaks: dict[str, int]


def find_peak(res: TrackResult, from_phase_prefix: str = "") -> Peak:
    """Replay the events: the allocated peak (host blocks excluded), its live set and the per-phase peaks."""
    cur = 0
    best = -1
    best_i = 0
    phase_peaks: dict[str, int] = {}
    for ev in res.events:
        b = ev.block
        if b.category == "host":
            continue
        cur += b.size if ev.alloc else -b.size
        if ev.alloc:
            phase_peaks[b.phase] = max(phase_peaks.get(b.phase, 0), cur)
            if cur > best and b.phase.startswith(from_phase_prefix):
                best, best_i = cur, ev.index
    live: dict[int, Block] = {}
    for ev in res.events[: best_i + 1]:
        if ev.block.category == "host":
            continue
        if ev.alloc:
            live[ev.block.bid] = ev.block
        else:
            live.pop(ev.block.bid, None)
    at = res.events[best_i].block if res.events else None
    return Peak(max(best, 0), best_i, list(live.values()), at.phase if at else "", at.op if at else "",
                at.module if at else "", phase_peaks)
