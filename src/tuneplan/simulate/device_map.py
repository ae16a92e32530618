"""``--engine simulate`` for a device_map run: transformers' own placement on the meta device.

The model is built from its config on the meta device (no weights) and placed by the function
``from_pretrained`` calls, ``transformers.integrations.accelerate._get_device_map`` (``get_balanced_memory``
or ``get_max_memory``, the quantizer's ``adjust_max_memory``, ``infer_auto_device_map`` with the class's
``_no_split_modules`` and tied weights), with ``max_memory`` = the free memory the estimate assumes per card.
Each card's memory is then the analytic per-card step (``estimator/device_map.py``) on that placement: the
step itself is not traced per card (the single-process simulation has one fake device and cannot tell the
cards' storages apart), which the notes say.

bitsandbytes is not needed: a 4/8-bit run is sized by transformers' own ``Bnb4BitHfQuantizer`` /
``Bnb8BitHfQuantizer`` (``quantized_element_size``, ``adjust_max_memory``), with the one question that imports
bitsandbytes, "is this parameter a ``Linear4bit`` weight", answered as ``replace_with_bnb_linear`` would make
it: an ``nn.Linear`` weight outside the modules it keeps (``get_keys_to_not_convert``: the output head).
"""

from __future__ import annotations

import logging
from typing import Any

from tuneplan.estimator.device_map import Placement, device_map_breakdown, placement, settle
from tuneplan.estimator.run import Run
from tuneplan.estimator.types import MemoryBreakdown
from tuneplan.specs.hardware import Accelerator


def _quantizer(setup: Any, torch: Any) -> Any:
    """transformers' bitsandbytes quantizer for the run, sizing without bitsandbytes (see the module doc)."""
    from torch import nn
    from transformers import BitsAndBytesConfig
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer
    from transformers.quantizers.quantizers_utils import get_module_from_name

    base = Bnb4BitHfQuantizer if setup.quant_bits == 4 else Bnb8BitHfQuantizer

    class Sizing(base):  # type: ignore[misc, valid-type]
        def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
            module, name = get_module_from_name(model, param_name)
            kept = any(param_name == k or param_name.startswith(k + ".") for k in self.kept)
            return isinstance(module, nn.Linear) and name != "bias" and not kept

        def validate_environment(self, *args: Any, **kwargs: Any) -> None:
            return None  # bitsandbytes' own check; the estimate reports a map that reaches the CPU

    config = BitsAndBytesConfig(load_in_4bit=setup.quant_bits == 4, load_in_8bit=setup.quant_bits == 8)
    return Sizing(config, pre_quantized=False)


def transformers_placement(run: Run, acc: Accelerator | None, formula: Placement) -> Placement:
    """The placement transformers computes for ``run`` under the estimate's max_memory (``formula.free``;
    no card: 2**62 bytes per card, unbounded in effect)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations.accelerate import _get_device_map

    from tuneplan.simulate.build import _load_dtype, hf_config

    setup = run.setup
    free = formula.free if formula.free != float("inf") else float(2**62)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(run.model, "sdpa"),
                                                 dtype=_load_dtype(setup, run.profile))
    quantizer = None
    if setup.quant_bits is not None:
        from transformers.quantizers.base import get_keys_to_not_convert

        quantizer = _quantizer(setup, torch)
        quantizer.kept = get_keys_to_not_convert(model)
    max_memory: dict[int | str, float] = {k: free for k in range(setup.gpus)}
    # accelerate warns for every card index this CPU machine lacks ("Device 0 is not available"): the cards
    # are the planned ones, not this machine's
    quiet = logging.getLogger("accelerate.utils.modeling")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        found = _get_device_map(model, setup.device_map, dict(max_memory), quantizer)
    finally:
        quiet.setLevel(level)
    cards = {name: device for name, device in found.items() if isinstance(device, int)}
    return settle(run, cards, formula.budgets, formula.free)


def simulate_device_map(run: Run, acc: Accelerator | None) -> MemoryBreakdown:
    """The per-card estimate on transformers' own placement, with the comparison to the formula's."""
    formula = placement(run, acc)
    theirs = transformers_placement(run, acc, formula)
    differ = sorted(n for n in formula.card_of if formula.card_of[n] != theirs.card_of[n])
    b = device_map_breakdown(run, acc, theirs if differ else formula)
    check = ("agrees with the formula's on every module" if not differ
             else f"differs from the formula's on {len(differ)} modules ({', '.join(differ[:4])}"
                  + (", ..." if len(differ) > 4 else "") + "): the figures use transformers' placement")
    b.notes.insert(0, "simulate: transformers placed the model itself (from_pretrained's _get_device_map on "
                      f"the meta device) and {check}; each card's step is the analytic engine's (the "
                      "single-process simulation has one device and cannot trace the cards apart)")
    return b
