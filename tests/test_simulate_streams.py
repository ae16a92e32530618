"""simulate/streams.py: while the tracker is entered, the CPU stand-ins for CUDA streams and events report
to it (record, synchronize, record_stream); on exit every patch is undone."""

from __future__ import annotations

import torch

from tuneplan.simulate.streams import stream_hooks


class Tracker:
    """What stream_hooks reads and writes on the storage tracker."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.stream_ops: list[tuple] = []
        self.uses: list[tuple] = []

    def stream_name(self, stream) -> str:
        return "default" if stream is None else getattr(stream, "_name", "other")

    def record_use(self, tensor, stream) -> None:
        self.uses.append((tensor, stream))

    def name_streams(self, owner, names) -> None:
        pass


def patched_attrs():
    return (torch.cpu.Stream.__dict__.get("synchronize"), torch.cpu.Event.__dict__.get("record"),
            torch.cpu.Event.__dict__.get("synchronize"))


def test_every_patch_is_undone():
    before = patched_attrs()
    with stream_hooks(Tracker()):
        assert patched_attrs() != before
    assert patched_attrs() == before


def test_patches_are_undone_after_an_error():
    before = patched_attrs()
    try:
        with stream_hooks(Tracker()):
            raise KeyError("inside")
    except KeyError:
        pass
    assert patched_attrs() == before


def test_an_event_synchronize_reports_where_it_was_recorded():
    tracker = Tracker()
    with stream_hooks(tracker):
        tracker.events.extend([1, 2, 3])
        ev = torch.cpu.Event()
        ev.record()  # at event index 3, on the current (default) stream
        tracker.events.extend([4, 5])
        ev.synchronize()  # the CPU waits at index 5 for work queued by index 3
        torch.cpu.Stream().synchronize()
    assert tracker.stream_ops[0] == (5, "sync", "default", 3)
    assert tracker.stream_ops[1][1] == "sync" and len(tracker.stream_ops) == 2


def test_an_unrecorded_event_reports_nothing():
    tracker = Tracker()
    with stream_hooks(tracker):
        torch.cpu.Event().synchronize()
    assert tracker.stream_ops == []
