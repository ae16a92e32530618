"""The README as a newcomer reads it: one screen, the set-up that works, no claim that drifts from what
runs (the figures themselves: tools/readme_figures.py --check, in .ci/run)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_one_screen() -> None:
    """Its first screen, up to and including the worked example (the planner section follows)."""
    assert len(README.split("\n## Planner", 1)[0].splitlines()) < 60


def test_the_set_up_has_a_venv_the_cpu_torch_and_both_commands() -> None:
    setup = README.split("## Set-up", 1)[1].split("```", 2)[1]
    assert "python3 -m venv" in setup
    assert re.search(r"pip install -e \. && tuneplan estimate \S+ ", setup)  # an estimate on a built-in model
    assert "pytest -q" in setup
    # the CPU build is pinned before the extras, as .ci/run does
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pin = re.search(r'torch==[0-9.]+', ci)
    assert pin and setup.index(pin.group(0)) < setup.index("-e \".[dev")


def test_what_the_readme_says_ci_runs_is_what_it_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    said = README.split("`.ci/run`", 1)[1].split("\n\n", 1)[0]
    for step in ("ruff", "mypy", "pytest", "readme_figures.py --check"):
        assert step in ci and step in said, step
    assert "lint-imports" not in ci or "import-layer" in said


def test_the_browser_test_count_is_the_files() -> None:
    n = len(re.findall(r"^def test_", (ROOT / "tests" / "test_web_e2e.py").read_text(), re.M))
    assert re.search(rf"test_web_e2e\.py, {n} tests", README), n


def test_no_scratch_paths_or_stale_start_up_claims_in_the_readme_or_its_pages() -> None:
    for path in (ROOT / "README.md", ROOT / "docs" / "usage.md", ROOT / "docs" / "accuracy.md"):
        text = path.read_text(encoding="utf-8")
        assert "/tmp/" not in text and "+0.105 s" not in text, path


def test_the_figures_tool_checks_the_pages_the_readme_moved_out() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import readme_figures
    finally:
        sys.path.pop(0)
    names = {p.relative_to(ROOT).as_posix() for p in readme_figures.FILES}
    assert {"README.md", "docs/usage.md", "docs/accuracy.md"} <= names
    for p in readme_figures.FILES:
        blocks, _ = readme_figures.figures(p.read_text(encoding="utf-8"))
        assert blocks or p.name == "accuracy.md", p  # accuracy.md holds benchmark tables only
