"""tuneplan.compat imports one way: rules <- predicates (base <- one module per kind of rule) <- the package
(no module imports one above it)."""

from __future__ import annotations

import ast
from pathlib import Path

import tuneplan.compat as compat

PKG = Path(compat.__file__).parent


def _imports(name: str) -> set[str]:
    tree = ast.parse((PKG / name).read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):  # lazy imports inside functions count too
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_rules_import_neither_predicates_nor_the_package() -> None:
    assert not {m for m in _imports("rules.py") if m.startswith("tuneplan.compat")}


def test_predicates_import_only_rules_and_each_other() -> None:
    modules = sorted((PKG / "predicates").glob("*.py"))
    assert {m.name for m in modules} == {"__init__.py", "base.py", "bnb.py", "hardware.py", "stacks.py"}
    for path in modules:
        above = {m for m in _imports(f"predicates/{path.name}") if m.startswith("tuneplan.compat")}
        allowed = {"tuneplan.compat.rules", "tuneplan.compat.predicates", "tuneplan.compat.predicates.base"}
        assert above <= allowed, path


def test_every_rule_has_its_predicate() -> None:
    assert {r.code for r in compat.rules()} == set(compat.PREDICATES)
