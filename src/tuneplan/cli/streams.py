"""The command's standard streams: what a script can trust about them.

- **An encoding that cannot show a character** (``PYTHONIOENCODING=ascii``, a latin-1 terminal) gets an
  ASCII spelling of it (``·`` -> ``|``, ``×`` -> ``x``, an accented letter without its accent, else
  ``?``), through a codec error handler: the output stays readable and the command never fails on it.
  A UTF-8 stream (Python's own choice in the C locale, PEP 538 / PEP 540) is left as it is.
- **A write that fails** for another reason than a closed pipe (a full disk, ``/dev/full``, EIO) raises
  :class:`OutputError` naming the stream, so that the command line reports "cannot write the output"
  instead of an internal error; a closed pipe stays ``BrokenPipeError`` (``tuneplan ... | head``).
- :func:`quiet_closed_stdout` points the stdout descriptor at ``/dev/null`` once the reader has gone, so
  that the interpreter's last flush at exit neither fails nor prints "Exception ignored".

Only the console entry point (``cli/app.main``) installs these; in-process callers keep their streams.
"""

from __future__ import annotations

import codecs
import os
import sys
import unicodedata
from typing import Any

ASCII_HANDLER = "tuneplan-ascii"
# The non-ASCII characters tuneplan's own output uses (separators, quotes, dashes, rich's ellipsis and
# table rules), each with the ASCII that reads the same.
ASCII_SPELLINGS = {
    "·": "|", "×": "x", "–": "-", "—": "-", "“": '"', "”": '"', "‘": "'", "’": "'", "…": "...",
    "≈": "~", "±": "+/-", "≤": "<=", "≥": ">=", "→": "->", "←": "<-", "µ": "u", "°": " deg",
    "─": "-", "━": "-", "│": "|", "┃": "|", "•": "*", "✓": "ok", "✗": "x", "\u00a0": " ",
}


def ascii_spelling(char: str) -> str:
    """The ASCII that stands for ``char``: the table above, else its compatibility decomposition without
    combining marks (``é`` -> ``e``, ``ﬁ`` -> ``fi``), else ``?``."""
    if char in ASCII_SPELLINGS:
        return ASCII_SPELLINGS[char]
    base = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
    return base if base and base.isascii() else "?"


def _ascii_fallback(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return "".join(ascii_spelling(c) for c in exc.object[exc.start:exc.end]), exc.end


codecs.register_error(ASCII_HANDLER, _ascii_fallback)


class OutputError(Exception):
    """Writing a standard stream failed (not a closed pipe): the stream's name and the system's reason."""

    def __init__(self, stream: str, exc: OSError) -> None:
        self.stream = stream
        self.reason = exc.strerror or str(exc)
        super().__init__(f"cannot write the output ({stream}): {self.reason}")


class _Guarded:
    """A stream whose write and flush failures other than a closed pipe raise :class:`OutputError`;
    everything else (encoding, isatty, fileno, the binary ``buffer``, guarded too) is the stream's own."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream = stream
        self._name = name

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self._stream, method)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(self._name, exc) from None

    def write(self, data: Any) -> Any:
        return self._call("write", data)

    def writelines(self, lines: Any) -> Any:
        return self._call("writelines", lines)

    def flush(self) -> Any:
        return self._call("flush")

    @property
    def buffer(self) -> Any:  # click.echo writes bytes to the binary buffer of an ASCII stream
        return _Guarded(self._stream.buffer, self._name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_streams() -> None:
    """Install the ASCII fallback and the write guard on ``sys.stdout`` and ``sys.stderr``."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, _Guarded):  # a closed descriptor: Python gave None
            continue
        try:
            stream.reconfigure(errors=ASCII_HANDLER)
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper; a stream already written to
            pass
        setattr(sys, name, _Guarded(stream, name))


def quiet_closed_stdout() -> None:
    """The reader of stdout has gone: drop what is buffered and send the rest to /dev/null (the
    interpreter flushes stdout at exit, which would fail again)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
        os.close(devnull)
    except (OSError, ValueError):
        pass


def flush_streams() -> None:
    """Flush both streams (what a full disk refuses shows here, not at interpreter exit)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
