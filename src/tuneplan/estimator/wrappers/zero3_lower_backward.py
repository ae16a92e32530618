"""What ZeRO-3 holds gathered while a layer below the top is back-propagated: the largest of the layer with
its prefetch and the rounds that reach the token embedding there (each mechanism in its own module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneplan.estimator.wrappers.zero3_factor_round import zero3_factor_round_bytes
from tuneplan.estimator.wrappers.zero3_lower_layers import (
    zero3_embedding_round_held_twice,
    zero3_gathered_in_lower_layers,
)
from tuneplan.estimator.wrappers.zero3_quantized_embedding import zero3_quantized_embedding_round
from tuneplan.estimator.wrappers.zero3_recompute_views import zero3_recompute_views_lower
from tuneplan.estimator.wrappers.zero3_tied_backward import (
    zero3_quantized_tied_regathered,
    zero3_tied_regathered,
)

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run
    from tuneplan.estimator.wrappers.zero_terms import DeepSpeedTerms


def zero3_lower_layers_gathered(run: Run, terms: DeepSpeedTerms, layer_gathered: int, at_bottom: int,
                                whole16: int, runs_ahead: bool) -> int:
    """Gathered in the lower layers' backward: the layer and its prefetch, or the embedding popped beside
    them (zero3_gathered_in_lower_layers); not the top layer's, whose row keeps what it held.
    ``at_bottom``: the embedding round's flat buffer in the bottom layer (zero3_first_pass.py)."""
    model, setup, compute = run.model, run.setup, run.dtypes.compute
    regathered = zero3_tied_regathered(model, setup, terms.prefetch_bucket, run.targets)
    return max(layer_gathered + zero3_factor_round_bytes(run, terms.prefetch_bucket),
               at_bottom * compute or zero3_quantized_embedding_round(run, terms.prefetch_bucket)[1],
               min(zero3_gathered_in_lower_layers(model, setup) * compute, whole16)
               if setup.quant_bits is None and runs_ahead else 0,
               # or, a tied embedding released after the head's backward, again, beside a round held
               # twice (zero3_tied_backward)
               regathered * compute, zero3_quantized_tied_regathered(run),
               # or the embedding's coalesced round held twice in the bottom layer (zero3_lower_layers),
               # once the prefetcher runs ahead: from the forward, or, a tied embedding that filled
               # stage3_max_live_parameters there, from its release after the head's backward
               zero3_embedding_round_held_twice(model, setup, run.targets, terms.prefetch_bucket)
               * compute if runs_ahead or regathered else 0,
               # or, the recompute's weights released with a layer's first backward module and kept by
               # their saved views, beside the coordinator's rounds (zero3_recompute_views)
               zero3_recompute_views_lower(run, terms.prefetch_bucket))
