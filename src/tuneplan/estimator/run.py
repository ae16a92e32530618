"""A run resolved once: the model as the framework builds it, the profile, the dtypes, the parameter plan, the
LoRA targets, each kind of layer's saved-activation ledger and the data-parallel wrapper, for one (model,
setup).

Every memory formula reads a ``Run`` instead of re-resolving the profile, the dtypes or the parameter plan
(which used to happen in each formula, with copies that could drift: the time model's parameter plan is
``run.param_plan``, the one memory uses, quantized lm_head included). Nothing in a ``Run`` depends on the
micro-batch size or the sequence length, so one ``Run`` serves a whole grid of (batch, seq)
(``memory.memory_at``, ``tuneplan.grid``); ``run.reshaped(batch=, seq=)`` gives the scalar estimate at
another shape without resolving anything again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tuneplan.compat import check
from tuneplan.estimator.activations import LayerKinds, layer_kinds
from tuneplan.estimator.dtypes import Dtypes, resolve_dtypes
from tuneplan.estimator.optimizer import OptimizerPlan, optimizer_plan, stepped_tensor_sizes
from tuneplan.estimator.weights import ParamPlan, lora_targets, param_plan, trainable_params
from tuneplan.estimator.wrappers import Wrapper, wrapper_for
from tuneplan.specs.finding import Finding
from tuneplan.specs.hardware import Accelerator
from tuneplan.specs.model import ModelSpec
from tuneplan.specs.profiles import Profile, get_profile, loss_kind, model_as_built
from tuneplan.specs.setup import TrainSetup

GRAD_ACCUM_MEMOS = ("memory",)  # Run.memo entries that depend on grad_accum


# hashable, not frozen (read-only by convention): made for every new setup, and a frozen dataclass's
# __init__ sets each field through object.__setattr__
@dataclass(unsafe_hash=True)
class Run:
    model: ModelSpec  # as the framework's code builds it (model_as_built)
    setup: TrainSetup  # validated and resolved against its profile
    profile: Profile
    dtypes: Dtypes
    targets: frozenset[str]  # LoRA target modules (empty unless LoRA / QLoRA)
    param_plan: ParamPlan
    layers: LayerKinds  # one saved-activation ledger per kind of layer, per token
    attn: str
    loss: str  # the loss kernel (specs.profiles.loss_kind)
    optimizer: str
    wrapper: Wrapper  # the data-parallel wrapper (estimator/wrappers), chosen once from the setup
    # formulas' shape-independent terms, filled on first use (memory.memory_statics)
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def trainable_params(self) -> int:
        n = self.memo.get("trainable")
        if n is None:
            n = self.memo["trainable"] = trainable_params(self.model, self.setup, self.targets)
        return n

    @property
    def stepped_optimizer(self) -> OptimizerPlan:
        """The optimizer's states and temporaries on the tensors it steps (``optimizer.optimizer_plan`` on
        ``optimizer.stepped_tensor_sizes``), before any wrapper partitions it: what both the memory
        (memory_statics) and the update's time (time_statics.optimizer_terms) start from, made once."""
        plan = self.memo.get("stepped_optimizer")
        if plan is None:
            pp = self.param_plan
            plan = self.memo["stepped_optimizer"] = optimizer_plan(
                self.optimizer, pp.trainable_params, pp.trainable_bytes, pp.trainable_tensors,
                pp.largest_trainable_tensor, pp.factored_elems,
                tensor_sizes=stepped_tensor_sizes(self.setup, pp.trainable_params, pp.trainable_sizes))
        return plan

    def findings(self, accelerator: Accelerator | None) -> list[Finding]:
        """Compatibility findings on ``acc`` (tuneplan.compat), kept per card: no rule reads the batch
        size or the sequence length, so a reshaped run shares them."""
        last = self.memo.get("findings")  # (card, findings) of the last card asked about
        if last is None or not (last[0] is accelerator or last[0] == accelerator):
            last = self.memo["findings"] = (accelerator, check(accelerator, self.setup, self.model))
        return list(last[1])

    def reshaped(self, **shape: int) -> Run:
        """The same run at another ``batch`` / ``seq`` / ``grad_accum`` (nothing in it depends on them but
        the setup record itself); other fields need :func:`resolve_run`."""
        unknown = set(shape) - {"batch", "seq", "grad_accum"}
        if unknown:
            raise ValueError(f"reshaped() takes batch, seq, grad_accum, not {sorted(unknown)}")
        # recorded as build_setup records keyword fields (profiles.resolve_setup: an explicit field is a flag)
        sources = dict(self.setup.sources)
        for k in shape:
            sources.setdefault(k, "flag")
        setup = self.setup.replace(**shape, sources=sources)
        # the memo's memory terms depend on grad_accum; its findings, trainable count and optimizer plan
        # on neither
        memo = ({k: v for k, v in self.memo.items() if k not in GRAD_ACCUM_MEMOS} if "grad_accum" in shape
                else self.memo)
        return replace(self, setup=setup, memo=memo)


def resolve_run(model: ModelSpec, setup: TrainSetup) -> Run:
    """Resolve ``setup`` (already validated and profile-resolved, see ``api.build_setup``) on ``model``."""
    profile = get_profile(setup.framework)
    model = model_as_built(model, setup.framework, setup.num_labels)
    dtypes = resolve_dtypes(setup, profile)
    targets = lora_targets(model, setup)
    params = param_plan(model, setup, dtypes, quant_lm_head=profile.quantizes_lm_head, targets=targets)
    attn = setup.attn or profile.default_attn
    code = profile.model_code
    kinds = layer_kinds(model, setup, dtypes, targets, attn, python_model_code=code == "hf",
                        quant_saves_input=profile.quant_saves_input, litgpt_code=code == "litgpt",
                        expand_kv=code == "torchtune", unsloth_code=code == "unsloth")
    return Run(model=model, setup=setup, profile=profile, dtypes=dtypes, targets=targets, param_plan=params,
               layers=kinds, attn=attn, loss=loss_kind(setup, profile),
               optimizer=setup.optimizer or profile.default_optimizer, wrapper=wrapper_for(setup))
