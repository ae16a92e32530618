"""The predicate modules: each kind of rule in its own module, every one registered once, and the texts
they hand to the rules' templates name setup fields, not flags."""

from __future__ import annotations

import ast
from types import ModuleType

import tuneplan.compat as compat
from tuneplan.compat.predicates import PREDICATES, bnb, hardware, stacks
from tuneplan.compat.predicates.base import sm_name
from tuneplan.compat.rules import Context
from tuneplan.specs.setup import TrainSetup


def _codes(module: ModuleType) -> set[str]:
    """The rule codes a module's ``@predicate("...")`` decorators name, read from its source."""
    tree = ast.parse(open(str(module.__file__), encoding="utf-8").read())
    return {d.args[0].value for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            for d in n.decorator_list if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "predicate"}


def test_each_rule_is_in_exactly_one_module() -> None:
    by_module = [_codes(m) for m in (hardware, bnb, stacks)]
    assert all(by_module)
    assert sum(len(c) for c in by_module) == len(PREDICATES) == len(set().union(*by_module))
    assert set().union(*by_module) == {r.code for r in compat.rules()}
    assert "bnb-arch-too-old" in by_module[1] and "torch-arch-missing" in by_module[2]


def test_sm_name() -> None:
    assert sm_name((8, 6)) == "86" and sm_name(None) == "?"


def test_the_optimizer_a_bitsandbytes_rule_names_is_a_field_reference() -> None:
    ctx = Context(None, TrainSetup(method="lora", optimizer="paged-adamw-8bit"), None, None)
    assert bnb.bnb_what(ctx) == "{optimizer=paged-adamw-8bit}"
    ctx = Context(None, TrainSetup(method="qlora", bits=4), None, None)
    assert bnb.bnb_what(ctx) == "4-bit QLoRA"
