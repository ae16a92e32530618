"""Search over estimates: what fits, the recommended setup, the card ranking, the largest model, sweeps.

    >>> from tuneplan.plan import fit, rank_gpus, max_model, sweep
    >>> fit("qwen2.5-7b", "v100-sxm2-32gb").recommended["reason"]

The functions are bound here eagerly: three of them share their module's name, and a lazy lookup would
hand back the module once it has been imported.
"""

from __future__ import annotations

from tuneplan.plan.fit import fit
from tuneplan.plan.gpus import rank_gpus
from tuneplan.plan.max_model import max_model
from tuneplan.plan.sweep import sweep

__all__ = ["fit", "rank_gpus", "max_model", "sweep"]
