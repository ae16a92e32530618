"""cli/catalog_cmd.py: `tuneplan models [SEARCH]` filters the catalog by id or alias; `tuneplan table`
prints plan/table's cells as they are."""

from __future__ import annotations

import json
from dataclasses import asdict

from tuneplan.catalog.models import catalog_entries
from tuneplan.cli.app import run
from tuneplan.plan.table import size_method_table


def json_of(capsys, *args: str) -> tuple[int, dict]:
    code = run(list(args))
    return code, json.loads(capsys.readouterr().out)


def test_models_lists_the_whole_catalog(capsys):
    code, out = json_of(capsys, "models", "--json")
    assert code == 0 and len(out["models"]) == len(catalog_entries())


def test_models_search_matches_ids_and_aliases_case_blind(capsys):
    assert all(a == a.lower() for e in catalog_entries() for a in e.aliases)  # aliases are stored lowercase
    code, out = json_of(capsys, "models", "QWEN", "--json")
    ids = {m["hf_id"] for m in out["models"]}
    expected = {e.hf_id for e in catalog_entries()
                if "qwen" in e.hf_id.lower() or any("qwen" in a.lower() for a in e.aliases)}
    assert code == 0 and ids == expected and ids


def test_models_search_without_a_match_is_empty(capsys):
    code, out = json_of(capsys, "models", "no-such-model-anywhere", "--json")
    assert code == 0 and out == {"models": []}


def test_models_text_counts_what_it_lists(capsys):
    assert run(["models", "llama"]) == 0
    n = sum(1 for e in catalog_entries()
            if "llama" in e.hf_id.lower() or any("llama" in a.lower() for a in e.aliases))
    assert f"({n} models)" in capsys.readouterr().out


def test_table_json_is_plan_tables_cells(capsys):
    code, out = json_of(capsys, "table", "--seq", "1024", "--json")
    assert code == 0
    assert out["table"] == [asdict(c) for c in size_method_table(seq=1024)]
