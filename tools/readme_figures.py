"""Regenerate the README's (and the usage and accuracy docs') command outputs from what the code prints,
so they never drift.

A fenced block that shows one ``$ tuneplan ...`` command (continuation lines ending in ``\\``) followed by
its output is a *figure*: this script runs the command (``python -m tuneplan``, 110 columns, this checkout's
``src`` first on the path) and writes the output under it. Blocks that show several commands, a
condensed or ``--json`` excerpt, ``...``, a comment, or a command that writes files or depends on this
machine (``doctor``, ``measure``, ``serve``, ``-o``, ``--plot``) are excerpts written by hand and are
left alone; ``--list`` says which is which. A command that ends in ``# part: TITLE`` is a figure of one
section of its output: the printed lines from the one that starts with TITLE up to the next line that is
not part of a table (table lines carry runs of two spaces between columns, or the header's rule).

    python tools/readme_figures.py           # rewrite README.md's figures
    python tools/readme_figures.py --check   # exit 1 and show the first difference when one is stale
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The files whose figures are checked: the README and the pages its first screen moved out to.
FILES = (README, ROOT / "docs" / "usage.md", ROOT / "docs" / "accuracy.md")
WIDTH = 110  # a README is read in a browser: the wide tables of fit / gpus keep their columns
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```\n", re.S | re.M)
HAND_WRITTEN = re.compile(
    r"--json|\.\.\.|#|(^| )-o |--plot|--record|--snapshot|tuneplan (doctor|measure|serve)")


PART = re.compile(r"\s+# part: (.+)$")


@dataclass
class Block:
    start: int  # offset of the block's body in the README
    end: int
    command: list[str]  # the command's lines as written (with their continuations)
    output: str

    @property
    def part(self) -> str | None:
        """The title of the section this figure shows, or None for the whole output."""
        m = PART.search(self.command[-1])
        return m.group(1).strip() if m else None

    @property
    def argv(self) -> list[str]:
        joined = " ".join(line.rstrip("\\").strip() for line in self.command)
        joined = PART.sub("", joined)
        return shlex.split(joined.removeprefix("$ tuneplan"))  # quoted arguments: --a '--seq 512'


def section(printed: str, title: str) -> str:
    """The lines of ``printed`` from the one starting with ``title`` to the end of its table."""
    lines = printed.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(title)), None)
    if start is None:
        raise SystemExit(f"no section {title!r} in the output")
    end = start + 1
    while end < len(lines) and ("  " in lines[end].strip() or lines[end].startswith("─")):
        end += 1
    return "\n".join(lines[start:end])


def figures(text: str) -> tuple[list[Block], list[str]]:
    """The README's figures, and the first line of each excerpt left alone."""
    found, skipped = [], []
    for m in FENCE.finditer(text):
        lines = m.group(1).splitlines()
        if not lines or not lines[0].startswith("$ tuneplan"):
            continue
        n = 1
        while lines[n - 1].endswith("\\") and n < len(lines):
            n += 1
        command, rest = lines[:n], lines[n:]
        shown = [PART.sub("", c) for c in command]
        if any(line.startswith("$ ") for line in rest) or any(HAND_WRITTEN.search(c) for c in shown):
            skipped.append(lines[0])
            continue
        found.append(Block(m.start(1), m.end(1), command, "\n".join(rest)))
    return found, skipped


def run(argv: list[str]) -> str:
    env = {**os.environ, "COLUMNS": str(WIDTH), "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1",
           "TERM": "dumb"}
    r = subprocess.run([sys.executable, "-m", "tuneplan", *argv], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    if r.returncode not in (0, 1):  # 1 is an answer ("does not fit"), anything else is a broken figure
        raise SystemExit(f"tuneplan {' '.join(argv)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return "\n".join(line.rstrip() for line in r.stdout.rstrip("\n").splitlines())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a figure is stale")
    ap.add_argument("--list", action="store_true", help="list the figures and the hand-written excerpts")
    args = ap.parse_args()
    total = stale_total = 0
    for path in FILES:
        n, stale = one_file(path, check=args.check, listing=args.list)
        total, stale_total = total + n, stale_total + stale
    return 1 if args.check and stale_total else 0


def one_file(path: Path, check: bool, listing: bool) -> tuple[int, int]:
    """Check or rewrite one file's figures: (figures, stale ones)."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT)
    blocks, skipped = figures(text)
    if listing:
        for b in blocks:
            print(f"{name} figure :", b.command[0])
        for s in skipped:
            print(f"{name} excerpt:", s)
        return len(blocks), 0
    stale, out = [], text
    for b in reversed(blocks):  # from the end, so earlier offsets stay valid
        printed = run(b.argv) if b.part is None else section(run(b.argv), b.part)
        if printed != b.output.rstrip():
            stale.append((b, printed))
            body = "\n".join(b.command) + "\n" + printed + "\n"
            out = out[:b.start] + body + out[b.end:]
    if check:
        for b, printed in reversed(stale):
            diff = difflib.unified_diff(b.output.rstrip().splitlines(), printed.splitlines(), str(name),
                                        "printed", lineterm="", n=1)
            print(f"stale figure in {name}: {b.command[0]}\n" + "\n".join(list(diff)[:30]))
        if stale:
            print(f"run `python tools/readme_figures.py` to rewrite them ({name})", file=sys.stderr)
        print(f"{name}: {len(blocks)} figures checked, {len(stale)} stale; "
              f"{len(skipped)} hand-written excerpts left alone")
        return len(blocks), len(stale)
    if stale:
        path.write_text(out, encoding="utf-8")
    print(f"{name}: {len(blocks)} figures, {len(stale)} rewritten; "
          f"{len(skipped)} hand-written excerpts left alone")
    return len(blocks), len(stale)


if __name__ == "__main__":
    raise SystemExit(main())
