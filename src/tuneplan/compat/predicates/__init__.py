"""One small predicate per compatibility rule (same code as in catalog/compat_rules.toml).

A predicate gets the Context and the rule's ``params`` and returns None (rule does not apply) or the
values its message/fix templates need; ``"_unknown": True`` selects the rule's versions-unknown text.
Thresholds and facts live in the rules file; what is here is only the logic that joins them.

One module per kind of rule: ``hardware`` (the card, its precision, attention kernels), ``bnb``
(bitsandbytes), ``stacks`` (PyTorch builds, drivers, vendor stacks, several GPUs); ``base`` holds the
registry they fill.
"""

from tuneplan.compat.predicates import bnb, hardware, stacks
from tuneplan.compat.predicates.base import PREDICATES, Hit, predicate

__all__ = ["PREDICATES", "Hit", "bnb", "hardware", "predicate", "stacks"]
