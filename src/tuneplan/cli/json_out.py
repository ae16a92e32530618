"""`--json` output: one JSON object on stdout, printed without rich (which would wrap long lines and break
JSON for pipes, and costs start-up time a --json run does not need)."""

from __future__ import annotations

import json
from typing import Any


def print_json(obj: Any) -> None:
    # allow_nan=False: NaN and Infinity are not JSON (strict parsers refuse them); the specs refuse
    # non-finite input, so one here is a bug, reported as an internal error rather than printed.
    print(json.dumps(obj, indent=2, default=str, allow_nan=False))
