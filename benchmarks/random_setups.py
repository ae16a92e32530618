"""Random valid training setups over the whole setup space, for the analytic-vs-simulate differential.

``draw(rng)`` returns one :class:`Draw`: a catalog model at a reduced depth (its own widths, vocabulary,
heads and experts: 0.5B to 405B shapes; the two engines read the same reduced config, so the comparison
stays exact per layer, for the loss chain and for every persistent term) and the keyword fields of a
``TrainSetup`` drawn axis by axis: method, bits, quantization type and double quantization, rank,
targets, dropout, batch, sequence length, accumulation, checkpointing, optimizer, precision, attention,
framework profile, classifier head, and the strategy (one GPU, DDP, FSDP1 / FSDP2, ZeRO-1/2/3, each CPU
offload the strategy has) with a world size of 1 to 8. A draw is kept only when the setup is valid:
``build_setup`` accepts it (the validation every face runs) and the compatibility rules raise no error
for it (nor a warning that the estimate does not describe the run: ``NOT_ESTIMATED``); the rejected draws
are counted by the field the refusal named.

Nothing here knows which setups the simulation can run: setups it cannot run are drawn too, and the
benchmark reports them as skipped with the simulation's own reason.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any

# the depth a drawn model runs at: enough layers for the wrappers' per-layer behaviour (FSDP prefetch of
# the next layer, ZeRO-3's prefetch bucket, the top layer's backward), few enough to keep a simulation in
# seconds (its cost grows with the op count, not with the widths)
DEPTHS = (2, 3, 4)
# DeepSeek's first_k_dense_replace dense layers come first: the reduced model keeps one MoE layer after them
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
SEQS = (64, 128, 256, 384, 512, 1024, 2048)
RANKS = (4, 8, 16, 32, 64, 128)
TARGETS = (None, None, "all-linear", "attn", "mlp", "q_proj,v_proj")
OPTIMIZERS = (None, None, "adamw", "adamw-fused", "adamw-hf", "adamw-8bit", "paged-adamw-8bit", "paged-adamw",
              "adafactor", "sgd")
PRECISIONS = ("bf16-mixed", "bf16-mixed", "fp16-mixed", "bf16", "fp16", "fp32")
ATTENTIONS = (None, "eager", "sdpa", "flash")
# the simulated profiles weigh most; the others are drawn so that the report says why they are skipped
FRAMEWORKS = ("hf", "hf", "hf", "hf", "hf", "llamafactory", "llamafactory", "fsdp-qlora", "other")
OTHER_FRAMEWORKS = ("unsloth", "torchtune", "litgpt")
STRATEGIES = ("single", "single", "ddp", "fsdp1", "fsdp1", "fsdp2", "fsdp2", "zero1", "zero2", "zero3",
              "zero3")
WORLD_SIZES = (2, 2, 4, 4, 8)
# warnings that say the estimate does not describe what the framework would run: not a setup to compare
# (fsdp_qlora's train.py wraps and checkpoints only Llama and Mistral decoder layers)
NOT_ESTIMATED = ("fsdp-qlora-layer-classes",)


@dataclass(frozen=True)
class Draw:
    """One random setup: the catalog model, the depth it runs at, and the setup fields."""

    index: int
    model: str
    layers: int
    setup: dict[str, Any]

    @property
    def label(self) -> str:
        s = self.setup
        strat = (f"zero{s['zero']}" if s.get("zero") else f"fsdp{s.get('fsdp_version', 1)}" if s.get("fsdp")
                 else "ddp" if s.get("gpus", 1) > 1 else "1gpu")
        off = f" off-{s['offload']}" if s.get("offload", "none") != "none" else ""
        return (f"r{self.index} {self.model.split('/')[-1]}[{self.layers}L] {s['method']} {strat}"
                f" ws{s.get('gpus', 1)}{off} {s.get('framework', 'hf')} b{s['batch']}x{s['seq']}")


@dataclass
class Rejections:
    """Invalid draws, by the field the validation named."""

    by_field: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_field.values())


@cache
def catalog_models(max_params: int | None = None) -> tuple[str, ...]:
    """Every catalog model the estimator reads (decoders and encoders; encoder-decoders are refused), or
    those of at most ``max_params`` parameters (as transformers counts them)."""
    from tuneplan.catalog.models import catalog_entries, resolve_model
    from tuneplan.errors import TuneplanError

    out = []
    for e in catalog_entries():
        if max_params is not None and (e.params_transformers or e.params_published or 0) > max_params:
            continue
        try:
            resolve_model(e.hf_id, allow_network=False)
        except TuneplanError:
            continue
        out.append(e.hf_id)
    return tuple(out)


FSDP_QLORA_TYPES = ("llama", "mistral")


@cache
def _model_type(model: str) -> str:
    from tuneplan.catalog.models import resolve_model

    return str(resolve_model(model, allow_network=False).config.get("model_type"))


def reduced_model(model: str, layers: int) -> Any:
    """The catalog model's config with ``layers`` decoder layers (after DeepSeek's dense ones)."""
    from tuneplan.catalog.models import resolve_model
    from tuneplan.specs.model import model_from_config

    spec = resolve_model(model, allow_network=False)
    cfg = dict(spec.config)
    dense_first = int(cfg.get("first_k_dense_replace") or 0)
    depth = layers + dense_first if dense_first and spec.is_moe else layers
    key = next((k for k in LAYER_KEYS if k in cfg), "num_hidden_layers")
    cfg[key] = depth
    return model_from_config(cfg, name=f"{model}[{depth}L]")


def _strategy(rng: random.Random, kw: dict[str, Any]) -> None:
    """One GPU, DDP, FSDP1 / FSDP2 or ZeRO-1/2/3 with an offload each has; only FSDP1 for fsdp_qlora's
    train.py, which wraps in FullyShardedDataParallel (the other refusals are ``framework_refusal``'s)."""
    strat = rng.choice(STRATEGIES if kw["framework"] != "fsdp-qlora" else ("single", "fsdp1"))
    if strat == "single":
        return
    kw["gpus"] = rng.choice(WORLD_SIZES)
    if strat.startswith("fsdp"):
        kw["fsdp"] = True
        kw["fsdp_version"] = int(strat[-1])
        kw["offload"] = rng.choice(("none", "none", "all"))
    elif strat.startswith("zero"):
        kw["zero"] = int(strat[-1])
        kw["offload"] = rng.choice(("none", "none", "optimizer", "all") if kw["zero"] == 3
                                   else ("none", "none", "optimizer"))


def draw_fields(rng: random.Random) -> dict[str, Any]:
    """The setup fields of one draw, each axis independent (the validation sorts out the combinations)."""
    method = rng.choice(("full", "freeze", "lora", "lora", "qlora", "qlora"))
    fw = rng.choice(FRAMEWORKS)
    kw: dict[str, Any] = {"method": method, "precision": rng.choice(PRECISIONS),
                          "framework": rng.choice(OTHER_FRAMEWORKS) if fw == "other" else fw,
                          "batch": rng.choice((1, 1, 2, 3, 4)), "seq": rng.choice(SEQS),
                          "grad_accum": rng.choice((1, 1, 2)),
                          "gradient_checkpointing": rng.choice((None, True, False))}
    if method == "qlora":
        kw["bits"] = rng.choice((4, 4, 4, 4, 4, 8))
        kw["quant_type"] = rng.choice(("nf4", "fp4"))
        kw["double_quant"] = rng.random() < 0.7
    if method in ("lora", "qlora"):
        kw["rank"] = rng.choice(RANKS)
        tg = rng.choice(TARGETS)
        if tg:
            kw["targets"] = tg
        if rng.random() < 0.3:
            kw["dropout"] = 0.05
    opt, attn = rng.choice(OPTIMIZERS), rng.choice(ATTENTIONS)
    if opt:
        kw["optimizer"] = opt
    if attn:
        kw["attn"] = attn
    if rng.random() < 0.08:
        kw["num_labels"] = rng.choice((1, 2))
    _strategy(rng, kw)
    return {k: v for k, v in kw.items() if v is not None}


def strategy_name(kw: dict[str, Any]) -> str:
    """The planner's name of the draw's strategy (plan/space.py: single, ddp, zero-N, fsdp, ...+offload-X)."""
    offload = kw.get("offload", "none")
    base = (f"zero-{kw['zero']}" if kw.get("zero") else "fsdp" if kw.get("fsdp")
            else "ddp" if kw.get("gpus", 1) > 1 else "single")
    return base if offload == "none" else f"{base}+offload-{offload}"


def framework_refusal(kw: dict[str, Any]) -> str:
    """What the framework's own script does not run ('' when it runs the draw): its strategies, methods and
    optimizers as the planner's space lists them (plan/space.py), and FSDP1 only for fsdp_qlora's train.py."""
    from tuneplan.plan.space import BNB_OPTIMIZERS, FRAMEWORK_METHODS, FRAMEWORK_STRATEGIES, NO_BNB_OPTIMIZERS

    fw = kw.get("framework", "hf")
    if strategy_name(kw) not in FRAMEWORK_STRATEGIES.get(fw, frozenset({strategy_name(kw)})):
        return "framework:strategy"
    method = kw["method"] if kw["method"] != "qlora" else f"qlora-{kw.get('bits', 4)}"
    if method not in FRAMEWORK_METHODS.get(fw, frozenset({method})):
        return "framework:method"
    if fw in NO_BNB_OPTIMIZERS and kw.get("optimizer") in (*BNB_OPTIMIZERS, "paged-adamw"):
        return "framework:optimizer"
    if fw == "fsdp-qlora" and kw.get("fsdp_version", 1) != 1:  # train.py wraps in FullyShardedDataParallel
        return "framework:fsdp_version"
    return ""


def valid(model: Any, kw: dict[str, Any]) -> str:
    """'' when the setup is valid for the model, else the field the refusal named."""
    from tuneplan.api import build_setup
    from tuneplan.compat import check
    from tuneplan.errors import TuneplanError
    from tuneplan.estimator.run import resolve_run

    why = framework_refusal(kw)
    if why:
        return why
    positions = model.config.get("max_position_embeddings") or model.config.get("n_positions")
    if positions and kw["seq"] > positions:  # learned position tables end there (BERT 512, GPT-2 1024)
        return "seq"
    try:
        setup = build_setup(model, **kw)
        resolve_run(model, setup)  # the targets name linears of this architecture
    except TuneplanError as exc:
        return getattr(exc, "field", None) or "setup"
    refused = [f for f in check(None, setup, model) if f.level == "error" or f.code in NOT_ESTIMATED]
    return f"compat:{refused[0].code}" if refused else ""


def draw(rng: random.Random, index: int, rejections: Rejections | None = None, tries: int = 200,
         max_params: int | None = None) -> Draw:
    """One valid random setup (redrawn until valid; every refusal counted in ``rejections``)."""
    models = catalog_models(max_params)
    for _ in range(tries):
        kw = draw_fields(rng)
        # fsdp_qlora's train.py wraps and checkpoints Llama and Mistral layers only (NOT_ESTIMATED)
        fq = kw["framework"] == "fsdp-qlora"
        pool = [m for m in models if _model_type(m) in FSDP_QLORA_TYPES] if fq else models
        model = rng.choice(pool or models)
        layers = rng.choice(DEPTHS)
        why = valid(reduced_model(model, layers), kw)
        if not why:
            return Draw(index, model, layers, kw)
        if rejections is not None:
            rejections.by_field[why] += 1
    raise RuntimeError(f"no valid setup in {tries} draws")


def sample(n: int, seed: int, rejections: Rejections | None = None,
           max_params: int | None = None) -> list[Draw]:
    """``n`` valid draws: the same ``seed`` gives the same list (``max_params``: the catalog models of at
    most that many parameters only). Each draw has its own generator (:func:`draw_rng`), so a new
    validation rule that refuses one setup redraws that draw alone and leaves the others as they were."""
    return [draw(draw_rng(seed, i), i, rejections, max_params=max_params) for i in range(n)]


def draw_rng(seed: int, index: int) -> random.Random:
    """The generator of draw ``index`` of a sample (a string seed is hashed the same way on every run)."""
    return random.Random(f"{seed}:{index}")


# a cheap sample for CI: the tiny catalog models, and none of what makes one simulation slow or impossible
# (the frameworks the simulation has no model code for, 8-bit bases, MoE QLoRA, DeepSpeed's CPU Adam, which
# compiles its C++ extension on first use)
CHEAP_MAX_PARAMS = 1_500_000_000
CHEAP_MAX_TOKENS = 2048


def cheap(d: Draw) -> bool:
    """Whether a draw is cheap to simulate (``CHEAP_MAX_TOKENS`` per micro-batch, no ZeRO-Offload) and is
    of a profile and a quantization the simulation runs."""
    s = d.setup
    return (s.get("framework", "hf") in ("hf", "llamafactory", "fsdp-qlora") and s.get("bits", 4) == 4
            and s["batch"] * s["seq"] <= CHEAP_MAX_TOKENS and not (s.get("zero") and s.get("offload", "none")
                                                                    != "none"))


def cheap_sample(n: int, seed: int) -> list[Draw]:
    """The first ``n`` cheap draws (:func:`cheap`) over the tiny catalog models (:func:`draw_rng` each)."""
    out: list[Draw] = []
    i = 0
    while len(out) < n:
        d = draw(draw_rng(seed, i), i, max_params=CHEAP_MAX_PARAMS)
        i += 1
        if cheap(d):
            out.append(d)
    return out
