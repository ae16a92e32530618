"""Two `tuneplan export` processes writing one path without --force: exactly one wins, the other exits 2.

The processes are real and race for real; a barrier holds each one after it has checked the target
(which does not exist yet) and before it puts its file there, so that every pair overlaps at the one
step where the check and the write could be apart. The same race runs with ``os.link`` failing as it does
on a file system without hard links, where the name is reserved by an exclusive create instead. ``-o out/``
writes into the folder.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

# Run as a process: every temporary file is made only once both processes have passed their target check
# (each touches its own mark, then waits for the other's), then the command runs as the console script.
# A link errno other than 0 makes every os.link fail with it, as on a file system without hard links.
RACER = """
import os, sys, tempfile, time
barrier, me, other, link_errno = sys.argv[1:5]
if int(link_errno):
    def no_link(src, dst, *a, **k):
        raise OSError(int(link_errno), os.strerror(int(link_errno)), src, None, dst)
    os.link = no_link
real_mkstemp = tempfile.mkstemp
def mkstemp(*a, **k):
    open(os.path.join(barrier, me), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(barrier, other)) and time.monotonic() < deadline:
        time.sleep(0.005)
    return real_mkstemp(*a, **k)
tempfile.mkstemp = mkstemp
sys.argv = ["tuneplan", *sys.argv[5:]]
from tuneplan.cli.app import main
main()
"""


def race(tmp_path, n: int, *args: str, link_errno: int = 0) -> list[tuple[int, int, bytes, bytes]]:
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    results = []
    for i in range(n):
        barrier = tmp_path / f"barrier{i}"
        barrier.mkdir()
        target = tmp_path / f"race{i}" / "train.py"
        command = ["export", "qwen2.5-0.5b", "-o", str(target), *args]
        procs = [subprocess.Popen([sys.executable, str(script), str(barrier), me, other, str(link_errno),
                                   *command],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
                 for me, other in (("a", "b"), ("b", "a"))]
        (oa, ea), (ob, eb) = (p.communicate(timeout=120) for p in procs)
        results.append((procs[0].returncode, procs[1].returncode, ea, eb))
        leftovers = [p.name for p in target.parent.iterdir() if p.name != "train.py"]
        assert leftovers == [], leftovers  # no temporary file left behind by the loser
    return results


def test_racing_exports_to_one_path_exactly_one_wins(tmp_path):
    for a, b, ea, eb in race(tmp_path, 6):
        assert sorted((a, b)) == [0, 2], (a, b, ea, eb)
        loser = eb if b == 2 else ea
        assert b"already exist" in loser or b"created by another process" in loser
        assert b"Traceback" not in ea + eb


@pytest.mark.parametrize("link_errno", [errno.EPERM, errno.ENOTSUP])
def test_without_hard_links_racing_exports_still_have_exactly_one_winner(tmp_path, link_errno):
    umask = os.umask(0o022)
    os.umask(umask)
    for i, (a, b, ea, eb) in enumerate(race(tmp_path, 4, link_errno=link_errno)):
        assert sorted((a, b)) == [0, 2], (a, b, ea, eb)
        loser = eb if b == 2 else ea
        # both passed their check before either wrote: the loser is refused at the exclusive create
        assert b"created by another process" in loser, loser
        assert b"Traceback" not in ea + eb
        # the winner's whole file, not the empty 0600 reservation: a script, executable as umask allows
        target = tmp_path / f"race{i}" / "train.py"
        text = target.read_text()
        assert "TrainingArguments" in text
        compile(text, "train.py", "exec")
        assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~umask


def test_racing_exports_with_force_both_succeed_and_one_file_is_left_whole(tmp_path):
    for a, b, ea, eb in race(tmp_path, 2, "--force"):
        assert (a, b) == (0, 0), (ea, eb)
    text = (tmp_path / "race0" / "train.py").read_text()
    compile(text, "train.py", "exec")  # one writer's whole file, not a mix


@pytest.mark.parametrize("fmt, name", [("hf-script", "train.py"), ("llamafactory", "train_lora.yaml")])
def test_output_ending_in_a_slash_writes_into_that_folder(tmp_path, fmt, name):
    out = subprocess.run([sys.executable, "-m", "tuneplan", "export", "qwen2.5-0.5b", "-f", fmt,
                          "-o", f"{tmp_path}/out/"], capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
    # an existing folder without the slash: the same
    again = subprocess.run([sys.executable, "-m", "tuneplan", "export", "qwen2.5-0.5b", "-f", fmt, "--force",
                            "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                           env=ENV)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
