"""`--json` output: one JSON object on stdout, printed without rich (which would wrap long lines and break
JSON for pipes, and costs start-up time a --json run does not need)."""

from __future__ import annotations

import json
from typing import Any


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))
