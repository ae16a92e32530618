"""cli/json_out.py: --json prints one strict JSON object (no NaN, paths as text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneplan.cli.json_out import print_json


def test_print_json_is_strict_json(capsys):
    print_json({"bytes": 3, "path": Path("/x")})
    assert json.loads(capsys.readouterr().out) == {"bytes": 3, "path": "/x"}
    with pytest.raises(ValueError):  # NaN is not JSON: a bug, not output
        print_json({"x": float("nan")})
