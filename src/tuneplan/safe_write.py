"""Writing the files the CLI produces: atomic, all or nothing, never through a symbolic link.

Every file tuneplan writes (``export``, ``sweep --plot``, ``simulate --snapshot``, ``measure --record``)
goes through :func:`write_files`:

1. check every target first: a folder is refused; an existing file or a symbolic link (dangling or not)
   is refused unless ``force``, so nothing the user wrote is overwritten by surprise and nothing is
   written outside the folder the user named by following a link someone planted;
2. write each file to a temporary file in its target's folder (``mkstemp``: a new inode, mode 0600 until
   chmod), ``fsync`` it, and set its mode on the temporary file (never on a link's target);
3. only when every temporary file is complete, put each at its target: without ``force`` by
   ``os.link`` (the target is created only if no entry of that name exists, checked and created in one
   step by the kernel, so of two writers racing for one path exactly one wins and the other is refused,
   and the targets it had already linked are removed again); with ``force`` by ``os.replace`` (a rename
   replaces the directory entry, so a symbolic link at the target is replaced by the file, never
   followed); then fsync the folder. A full disk or any error in step 2 removes the temporary files and
   leaves every target as it was: no truncated ``train.py``, no half of a multi-file export.

The check in step 1 gives the message a person reads; the exclusive link in step 3 is what holds when
another process writes the same path in between.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuneplan.errors import TuneplanError


@dataclass(frozen=True)
class OutFile:
    path: Path
    data: bytes
    executable: bool = False  # a script: rwx for whom the umask allows


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_targets(paths: Sequence[str | Path], *, force: bool, field: str) -> list[Path]:
    """The targets as paths, refused when one is a folder, or exists / is a link and ``force`` is off."""
    out: list[Path] = []
    existing: list[str] = []
    for raw in paths:
        p = Path(raw)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            out.append(p)
            continue
        except OSError as exc:  # a name too long, a path through a file
            raise TuneplanError(f"cannot write {p}: {exc.strerror or exc}", field=field) from None
        if stat.S_ISLNK(st.st_mode):
            if not force:
                raise TuneplanError(f"{p} is a symbolic link; nothing written (a link is never written "
                                    "through)", field=field, accepted="another path, or {force} to replace "
                                    "the link itself by the file")
        elif stat.S_ISDIR(st.st_mode):
            raise TuneplanError(f"{p} is a folder", field=field, accepted="a file path")
        elif not stat.S_ISREG(st.st_mode):
            raise TuneplanError(f"{p} is not a regular file", field=field, accepted="a file path")
        else:
            existing.append(str(p))
        out.append(p)
    if existing and not force:
        raise TuneplanError(f"{', '.join(existing)} already exist(s); nothing written", field=field,
                            accepted="another path, or {force} to overwrite")
    return out


def write_files(files: Sequence[OutFile], *, force: bool, field: str) -> list[Path]:
    """Write every file or none (see the module docstring); returns the paths written."""
    targets = check_targets([f.path for f in files], force=force, field=field)
    mask = _umask()
    temps: list[str] = []
    try:
        for f, target in zip(files, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:100]}.", suffix=".tmp")
            temps.append(tmp)
            with os.fdopen(fd, "wb") as out:
                out.write(f.data)
                out.flush()
                os.fsync(out.fileno())
                os.fchmod(out.fileno(), (0o777 if f.executable else 0o666) & ~mask)
        if force:
            for tmp, target in zip(temps, targets, strict=True):
                os.replace(tmp, target)
            temps = []
        else:  # the temporary names go in ``finally``: the targets are their second links
            _link_all(temps, targets, field)
        for folder in {t.parent for t in targets}:
            _fsync_dir(folder)
    except OSError as exc:
        raise TuneplanError(f"cannot write {exc.filename or targets[0]}: {exc.strerror or exc}; "
                            "nothing written", field=field) from None
    finally:
        for tmp in temps:
            _unlink(tmp)
    return targets


def _link_all(temps: Sequence[str], targets: Sequence[Path], field: str) -> None:
    """Each complete temporary file linked at its target, which must not exist (``link(2)`` fails with
    EEXIST otherwise, atomically); on a refusal the targets linked so far are removed (they are this
    call's own files) and nothing is left. The temporary names are removed by the caller."""
    linked: list[Path] = []
    try:
        for tmp, target in zip(temps, targets, strict=True):
            try:
                os.link(tmp, target, follow_symlinks=False)
            except FileExistsError:
                raise TuneplanError(f"{target} was created by another process meanwhile; nothing written",
                                    field=field, accepted="another path, or {force} to overwrite") from None
            linked.append(target)
    except BaseException:
        for target in linked:
            _unlink(target)
        raise


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_text(path: str | Path, text: str, *, force: bool, field: str, executable: bool = False) -> Path:
    """One UTF-8 text file, atomically (see :func:`write_files`)."""
    return write_files([OutFile(Path(path), text.encode("utf-8"), executable)], force=force, field=field)[0]


def write_bytes(path: str | Path, data: bytes, *, force: bool, field: str) -> Path:
    return write_files([OutFile(Path(path), data)], force=force, field=field)[0]


def append_text(path: str | Path, text: str, *, field: str, force_link: bool = False) -> Path:
    """Append ``text`` by writing old + new to a new file and renaming it over the old one.

    A crash or a full disk leaves the old file whole. A symbolic link is refused unless ``force_link``;
    even then the link is replaced by the file, never appended to through.
    """
    p = Path(path)
    if os.path.islink(p) and not force_link:
        check_targets([p], force=False, field=field)
    try:
        old = p.read_bytes() if p.exists() else b""
    except OSError as exc:
        raise TuneplanError(f"cannot read {p}: {exc.strerror or exc}", field=field) from None
    return write_bytes(p, old + text.encode("utf-8"), force=True, field=field)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a folder; the rename is still atomic
    finally:
        os.close(fd)
