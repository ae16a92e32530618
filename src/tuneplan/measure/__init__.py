"""measure: real training steps on this machine, compared with the estimate, written as calibration rows.

torch / transformers / peft are imported only when a run starts (the ``simulate`` extra).
"""

from __future__ import annotations

from tuneplan.measure.columns import MEASURED_COLUMNS
from tuneplan.measure.record import append_record, build_record
from tuneplan.measure.session import measure

__all__ = ["MEASURED_COLUMNS", "append_record", "build_record", "measure"]
