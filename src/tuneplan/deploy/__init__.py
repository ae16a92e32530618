"""deploy: after training, what it takes to merge, store and serve the model, and how fast it can decode.

Pure functions over the same specs as the training estimate (no I/O, no printing). Entry point for faces:
:func:`plan_deploy` returns one JSON-ready dict.
"""

from __future__ import annotations

from tuneplan.deploy.formats import FORMATS, SERVE_PRECISIONS, resolve_format
from tuneplan.deploy.kv_cache import kv_layout
from tuneplan.deploy.plan import plan_deploy
from tuneplan.deploy.weights import serving_weights

__all__ = ["FORMATS", "SERVE_PRECISIONS", "kv_layout", "plan_deploy", "resolve_format", "serving_weights"]
