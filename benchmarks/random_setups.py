"""Random valid training setups over the whole setup space, for the analytic-vs-simulate differential.

``draw(rng)`` returns one :class:`Draw`: a catalog model at a reduced depth (its own widths, vocabulary,
heads and experts: 0.5B to 405B shapes; the two engines read the same reduced config, so the comparison
stays exact per layer, for the loss chain and for every persistent term) and the keyword fields of a
``TrainSetup`` drawn axis by axis: method, bits, quantization type and double quantization, rank,
targets, dropout, batch, sequence length, accumulation, checkpointing, optimizer, precision, attention,
framework profile, classifier head, and the strategy (one GPU, DDP, FSDP1 / FSDP2, ZeRO-1/2/3, each CPU
offload the strategy has) with a world size of 1 to 8. A draw is kept only when the setup is valid:
``build_setup`` accepts it (the validation every face runs) and the compatibility rules raise no error
for it; the rejected draws are counted by the field the refusal named.

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
def catalog_models() -> tuple[str, ...]:
    """Every catalog model the estimator reads (decoders and encoders; encoder-decoders are refused)."""
    from tuneplan.catalog.models import catalog_entries, resolve_model
    from tuneplan.errors import TuneplanError

    out = []
    for e in catalog_entries():
        try:
            resolve_model(e.hf_id, allow_network=False)
        except TuneplanError:
            continue
        out.append(e.hf_id)
    return tuple(out)


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
    strat = rng.choice(STRATEGIES)
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


def valid(model: Any, kw: dict[str, Any]) -> str:
    """'' when the setup is valid for the model, else the field the refusal named."""
    from tuneplan.api import build_setup
    from tuneplan.compat import check
    from tuneplan.errors import TuneplanError

    try:
        setup = build_setup(model, **kw)
    except TuneplanError as exc:
        return getattr(exc, "field", None) or "setup"
    errors = [f for f in check(None, setup, model) if f.level == "error"]
    return f"compat:{errors[0].code}" if errors else ""


def draw(rng: random.Random, index: int, rejections: Rejections | None = None, tries: int = 200) -> Draw:
    """One valid random setup (redrawn until valid; every refusal counted in ``rejections``)."""
    models = catalog_models()
    for _ in range(tries):
        model = rng.choice(models)
        layers = rng.choice(DEPTHS)
        kw = draw_fields(rng)
        why = valid(reduced_model(model, layers), kw)
        if not why:
            return Draw(index, model, layers, kw)
        if rejections is not None:
            rejections.by_field[why] += 1
    raise RuntimeError(f"no valid setup in {tries} draws")


def sample(n: int, seed: int, rejections: Rejections | None = None) -> list[Draw]:
    """``n`` valid draws from one random generator: the same ``seed`` gives the same list."""
    rng = random.Random(seed)
    return [draw(rng, i, rejections) for i in range(n)]
