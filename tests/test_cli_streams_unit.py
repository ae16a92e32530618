"""cli/streams.py in-process: the ASCII spellings, the codec fallback, and the write guard
(tests/test_cli_streams.py runs the command line itself in subprocesses)."""

from __future__ import annotations

import errno
import io

import pytest

from tuneplan.cli.streams import ASCII_HANDLER, OutputError, _Guarded, ascii_spelling


@pytest.mark.parametrize("char, ascii_", [("·", "|"), ("×", "x"), ("é", "e"), ("ﬁ", "fi"), ("Å", "A"),
                                          ("≥", ">="), ("中", "?"), ("\u00a0", " ")])
def test_ascii_spelling(char, ascii_):
    assert ascii_spelling(char) == ascii_


def test_the_codec_fallback_keeps_ascii_and_spells_the_rest():
    text = "FITS on GeForce RTX 4090 · 13.33 GiB headroom × 2 — café"
    expected = b"FITS on GeForce RTX 4090 | 13.33 GiB headroom x 2 - cafe"
    assert text.encode("ascii", errors=ASCII_HANDLER) == expected
    assert "µs".encode("latin-1", errors=ASCII_HANDLER) == "µs".encode("latin-1")  # latin-1 has µ itself


class FailingStream:
    def __init__(self, exc: OSError):
        self.exc = exc
        self.encoding = "utf-8"

    def write(self, *data):
        raise self.exc

    flush = write


def test_a_full_disk_is_an_output_error_naming_the_stream():
    guarded = _Guarded(FailingStream(OSError(errno.ENOSPC, "No space left on device")), "stdout")
    with pytest.raises(OutputError) as err:
        guarded.write("x")
    assert str(err.value) == "cannot write the output (stdout): No space left on device"
    assert guarded.encoding == "utf-8"  # everything else is the stream's own


def test_a_closed_pipe_stays_a_broken_pipe():
    guarded = _Guarded(FailingStream(BrokenPipeError(errno.EPIPE, "Broken pipe")), "stdout")
    with pytest.raises(BrokenPipeError):
        guarded.flush()


def test_a_working_stream_passes_through():
    buf = io.StringIO()
    g = _Guarded(buf, "stdout")
    g.write("a")
    g.writelines(["b", "c"])
    g.flush()
    assert buf.getvalue() == "abc"
