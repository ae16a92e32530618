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
   and the targets it had already put in place are removed again); with ``force`` by ``os.replace`` (a
   rename replaces the directory entry, so a symbolic link at the target is replaced by the file, never
   followed); then fsync the folder. A full disk or any error in step 2 removes the temporary files and
   leaves every target as it was: no truncated ``train.py``, no half of a multi-file export.

The check in step 1 gives the message a person reads; the exclusive link in step 3 is what holds when
another process writes the same path in between.

A file system without hard links (FAT, exFAT, some FUSE and SMB/CIFS mounts) answers ``link(2)`` with
EPERM, EMLINK, ENOTSUP/EOPNOTSUPP or ENOSYS. There the name is reserved instead: ``os.open`` with
``O_CREAT | O_EXCL | O_NOFOLLOW`` creates an empty file of mode 0600 only if no entry of that name exists
(a symbolic link, dangling or not, counts as an entry and is never followed), again checked and created
in one kernel step, so of racing writers exactly one gets the name. The complete temporary file is then
renamed onto the reserved name. Between the two steps (one ``fstat``, one ``lstat`` and one rename) the
name holds an empty file owned by the writer:

- another writer sees the name taken and is refused, at its check or at its own exclusive create;
- a reader sees an empty file, never part of one;
- if the name no longer holds the reservation just before the rename (someone removed it and put their
  own file or link there), nothing is renamed and the write is refused, leaving their entry alone; the
  comparison and the rename are two steps, so a swap in the instant between them goes unseen, a gap
  ``link(2)`` does not have, which is why it is tried first;
- any error or interrupt removes the reservation (only while it is still the writer's own file); a crash
  in the window (power cut, ``kill -9``) leaves the empty file, which a later write refuses like any
  existing file until it is removed or ``force`` is given.
"""

from __future__ import annotations

import errno
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
        else:  # ``temps`` keeps the names still to remove in ``finally``
            _place_all_new(temps, targets, field)
        for folder in {t.parent for t in targets}:
            _fsync_dir(folder)
    except OSError as exc:
        raise TuneplanError(f"cannot write {exc.filename or targets[0]}: {exc.strerror or exc}; "
                            "nothing written", field=field) from None
    finally:
        for tmp in temps:
            _unlink(tmp)
    return targets


# link(2)'s answers where a file system makes no hard links: EPERM "The filesystem containing oldpath and
# newpath does not support the creation of hard links" and EMLINK where a file may have one link only
# (Linux man-pages, link(2)); ENOSYS from a FUSE file system that does not implement link, ENOTSUP /
# EOPNOTSUPP from others that refuse it (one number on Linux, two on some other systems).
_NO_HARD_LINKS = frozenset(getattr(errno, name) for name in ("EPERM", "EMLINK", "ENOTSUP", "EOPNOTSUPP",
                                                             "ENOSYS") if hasattr(errno, name))
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # not on Windows, where O_EXCL alone refuses an existing name


def _taken(target: Path, field: str) -> TuneplanError:
    return TuneplanError(f"{target} was created by another process meanwhile; nothing written", field=field,
                         accepted="another path, or {force} to overwrite")


def _place_all_new(temps: list[str], targets: Sequence[Path], field: str) -> None:
    """Each complete temporary file put at its target, which must not exist (see the module docstring).

    On a refusal or an error the targets placed so far are removed (only while each still holds the file
    this call put there) and nothing is left. A temporary file renamed into place is dropped from
    ``temps``, the list of names the caller removes afterwards.
    """
    placed: list[tuple[Path, os.stat_result]] = []
    try:
        for tmp, target in zip(list(temps), targets, strict=True):
            if _link_new(tmp, target, field):
                temps.remove(tmp)
            placed.append((target, os.lstat(target)))
    except BaseException:
        for target, mine in placed:
            _unlink_if_same(target, mine)
        raise


def _link_new(tmp: str, target: Path, field: str) -> bool:
    """``tmp`` linked at ``target``, or renamed onto a reservation of that name where the file system has
    no hard links; True when ``tmp`` was renamed (its own name is gone)."""
    try:
        os.link(tmp, target, follow_symlinks=False)
        return False
    except FileExistsError:
        raise _taken(target, field) from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
    _rename_onto_reservation(tmp, target, field)
    return True


def _rename_onto_reservation(tmp: str, target: Path, field: str) -> None:
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o600)
    except OSError as exc:  # EEXIST for any entry; ELOOP where a system reports a link that way
        if exc.errno in (errno.EEXIST, errno.ELOOP):
            raise _taken(target, field) from None
        raise
    try:
        mine = os.fstat(fd)  # the descriptor stays open, so the inode number cannot be reused meanwhile
    except BaseException:
        os.close(fd)
        _unlink(target)  # created by the call above and not yet released
        raise
    try:
        if not _holds(target, mine):
            raise _taken(target, field)
        os.replace(tmp, target)
    except BaseException:
        _unlink_if_same(target, mine)
        raise
    finally:
        os.close(fd)


def _holds(path: Path, mine: os.stat_result) -> bool:
    """Whether ``path`` is, without following a link, the file ``mine`` describes."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _unlink_if_same(path: Path, mine: os.stat_result) -> None:
    if _holds(path, mine):
        _unlink(path)


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
