"""Writes without ``force`` on a file system without hard links, and the clean-up after a refusal.

``os.link`` is replaced by one that fails as such a file system answers (link(2): EPERM, EMLINK;
ENOTSUP / EOPNOTSUPP / ENOSYS from FUSE and network mounts). The guarantees are those of the link path:
nothing that exists is overwritten, nothing is written through a symbolic link, the file appears whole,
and on a refusal nothing of this call is left (no temporary file, no reservation, no half export).
Racing real processes: tests/test_export_race.py.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from tuneplan.errors import TuneplanError
from tuneplan.safe_write import OutFile, write_files

NO_LINK_ERRNOS = ["EPERM", "EMLINK", "ENOTSUP", "EOPNOTSUPP", "ENOSYS"]  # two share a number on Linux
FIELD = "--output"


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def without_links(monkeypatch, code: int = errno.EPERM, before=None) -> list[str]:
    """``os.link`` fails with ``code``; ``before(target)`` runs first (another process acting meanwhile).
    Returns the list of targets link was asked for."""
    asked: list[str] = []

    def no_link(src, dst, *a, **k):
        asked.append(str(dst))
        if before is not None:
            before(Path(dst))
        raise OSError(code, os.strerror(code), src, None, dst)

    monkeypatch.setattr(os, "link", no_link)
    return asked


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def two_files(folder: Path) -> list[OutFile]:
    return [OutFile(folder / "train.py", b"print('train')\n", executable=True),
            OutFile(folder / "ds.json", b'{"zero_optimization": {"stage": 2}}\n')]


@pytest.mark.parametrize("code", NO_LINK_ERRNOS)
def test_without_hard_links_every_file_is_written_whole_with_its_mode(tmp_path, monkeypatch, code):
    asked = without_links(monkeypatch, getattr(errno, code))
    out = tmp_path / "out"
    write_files(two_files(out), force=False, field=FIELD)
    assert asked == [str(out / "train.py"), str(out / "ds.json")]  # the link was tried and refused
    assert names(out) == ["ds.json", "train.py"]  # no temporary file left
    assert (out / "train.py").read_bytes() == b"print('train')\n"
    assert (out / "ds.json").read_bytes() == b'{"zero_optimization": {"stage": 2}}\n'
    # the temporary files' modes, not the reservation's 0600
    assert stat.S_IMODE((out / "train.py").stat().st_mode) == 0o777 & ~umask()
    assert stat.S_IMODE((out / "ds.json").stat().st_mode) == 0o666 & ~umask()


def test_a_file_made_after_the_check_is_left_alone_and_the_writer_refused(tmp_path, monkeypatch):
    target = tmp_path / "train.py"
    without_links(monkeypatch, before=lambda t: t.write_bytes(b"the user's own\n"))
    with pytest.raises(TuneplanError, match="created by another process meanwhile; nothing written") as e:
        write_files([OutFile(target, b"ours\n")], force=False, field=FIELD)
    assert e.value.field == FIELD
    assert target.read_bytes() == b"the user's own\n"
    assert names(tmp_path) == ["train.py"]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_planted_after_the_check_is_never_written_through(tmp_path, monkeypatch, dangling):
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.parent.mkdir()
    if not dangling:
        victim.write_bytes(b"precious\n")
    out = tmp_path / "out"
    out.mkdir()
    without_links(monkeypatch, before=lambda t: t.symlink_to(victim))
    with pytest.raises(TuneplanError, match="created by another process meanwhile"):
        write_files([OutFile(out / "train.py", b"ours\n")], force=False, field=FIELD)
    assert os.readlink(out / "train.py") == str(victim)  # the planted link is still a link, left in place
    assert names(out) == ["train.py"]
    if dangling:
        assert not victim.exists()  # an exclusive create does not make the file a dangling link names
    else:
        assert victim.read_bytes() == b"precious\n"


def test_a_later_file_taken_removes_the_ones_already_written(tmp_path, monkeypatch):
    out = tmp_path / "out"

    def take_the_json(target: Path) -> None:
        if target.name == "ds.json":
            target.write_bytes(b"theirs\n")

    without_links(monkeypatch, before=take_the_json)
    with pytest.raises(TuneplanError, match="ds.json was created by another process"):
        write_files(two_files(out), force=False, field=FIELD)
    assert names(out) == ["ds.json"]  # train.py, written first, is removed again; no temporary file
    assert (out / "ds.json").read_bytes() == b"theirs\n"


def test_the_window_holds_an_empty_private_file_that_other_writers_see_as_taken(tmp_path, monkeypatch):
    target = tmp_path / "train.py"
    without_links(monkeypatch)
    real_replace = os.replace
    seen: dict[str, object] = {}

    def replace(src, dst, *a, **k):
        st = os.lstat(dst)
        seen["reserved"] = (stat.S_ISREG(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode))
        with pytest.raises(TuneplanError, match="already exist") as e:
            write_files([OutFile(target, b"second writer\n")], force=False, field=FIELD)
        seen["second"] = str(e.value)
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    write_files([OutFile(target, b"first writer\n")], force=False, field=FIELD)
    assert seen["reserved"] == (True, 0, 0o600)
    assert "second" in seen
    assert target.read_bytes() == b"first writer\n"
    assert names(tmp_path) == ["train.py"]


@pytest.mark.parametrize("failure", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_a_failed_rename_removes_the_reservation(tmp_path, monkeypatch, failure):
    target = tmp_path / "train.py"
    without_links(monkeypatch)

    def replace(*a, **k):
        assert os.path.exists(target)  # the reservation is there when the rename fails
        raise failure

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(TuneplanError if isinstance(failure, OSError) else KeyboardInterrupt) as e:
        write_files([OutFile(target, b"ours\n")], force=False, field=FIELD)
    if isinstance(failure, OSError):
        assert "Input/output error; nothing written" in str(e.value)
    assert names(tmp_path) == []


@pytest.mark.parametrize("planted", ["file", "link"])
def test_a_reservation_swapped_before_the_rename_is_not_replaced(tmp_path, monkeypatch, planted):
    """Someone removes the empty reservation and puts their own entry there: it is theirs, kept."""
    target = tmp_path / "train.py"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    without_links(monkeypatch)
    real_open = os.open

    def open_then_swap(path, flags, *a, **k):
        fd = real_open(path, flags, *a, **k)
        if str(path) == str(target) and flags & os.O_EXCL:
            os.unlink(target)
            if planted == "file":
                target.write_bytes(b"theirs\n")
            else:
                target.symlink_to(victim)
        return fd

    monkeypatch.setattr(os, "open", open_then_swap)
    with pytest.raises(TuneplanError, match="created by another process meanwhile"):
        write_files([OutFile(target, b"ours\n")], force=False, field=FIELD)
    assert victim.read_bytes() == b"precious\n"
    if planted == "file":
        assert target.read_bytes() == b"theirs\n"
    else:
        assert os.readlink(target) == str(victim)
    assert names(tmp_path) == ["train.py", "victim.txt"]


def test_another_link_error_is_reported_without_trying_the_reservation(tmp_path, monkeypatch):
    target = tmp_path / "train.py"
    without_links(monkeypatch, errno.EIO)
    opened: list[str] = []
    real_open = os.open

    def spy_open(path, *a, **k):
        opened.append(str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", spy_open)
    with pytest.raises(TuneplanError, match="Input/output error; nothing written"):
        write_files([OutFile(target, b"ours\n")], force=False, field=FIELD)
    assert str(target) not in opened
    assert names(tmp_path) == []


def test_with_hard_links_a_file_replaced_meanwhile_is_not_removed_in_the_clean_up(tmp_path, monkeypatch):
    """The first file is linked, then a writer with --force replaces it, then the second is refused: the
    clean-up removes only what this call put there."""
    out = tmp_path / "out"
    real_link = os.link

    def link(src, dst, *a, **k):
        if Path(dst).name == "ds.json":
            (out / "train.py").unlink()
            (out / "train.py").write_bytes(b"the other writer's\n")
            Path(dst).write_bytes(b"theirs\n")
        return real_link(src, dst, *a, **k)

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(TuneplanError, match="ds.json was created by another process"):
        write_files(two_files(out), force=False, field=FIELD)
    assert (out / "train.py").read_bytes() == b"the other writer's\n"
    assert (out / "ds.json").read_bytes() == b"theirs\n"
    assert names(out) == ["ds.json", "train.py"]
